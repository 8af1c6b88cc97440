"""bench/: the machine's idle and stolen shares over a point (/proc/stat), and raw onnxruntime's best batched figure
taken at both ends of a perf_sweep run (issue #17: this VM's speed drifts between minutes)."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import common  # noqa: E402
import perf_sweep  # noqa: E402

STAT = "cpu  {} 0 {} {} {} 0 {} {} 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"


def ticks(tmp_path, name, user, system, idle, iowait, softirq, steal):
    path = tmp_path / name
    path.write_text(STAT.format(user, system, idle, iowait, softirq, steal))
    return common.machine_cpu_ticks(str(path))


def test_shares_of_idle_and_steal_between_two_readings(tmp_path):
    before = ticks(tmp_path, "a", 100, 10, 50, 5, 0, 0)
    after = ticks(tmp_path, "b", 150, 20, 65, 10, 0, 20)  # 100 ticks: 50 user, 10 system, 15 idle, 5 iowait, 20 steal
    assert before == [100, 0, 10, 50, 5, 0, 0, 0]
    assert common.machine_shares(before, after) == {"idle": 0.2, "steal": 0.2}


def test_unreadable_or_garbled_stat_gives_no_shares(tmp_path):
    garbled = tmp_path / "garbled"
    garbled.write_text("intr 1 2 3\n")
    assert common.machine_cpu_ticks(str(tmp_path / "missing")) is None
    assert common.machine_cpu_ticks(str(garbled)) is None
    reading = ticks(tmp_path, "a", 1, 1, 1, 1, 1, 1)
    assert common.machine_shares(None, reading) == {"idle": None, "steal": None}
    assert common.machine_shares(reading, reading) == {"idle": None, "steal": None}  # no time passed


def test_a_window_reports_the_machine_shares_with_the_process_cpu():
    window = common.CpuEnergyWindow(pid=os.getpid())
    window.start()
    spent0 = time.process_time()
    while time.process_time() - spent0 < 0.05:  # 50 ms of CPU: several clock ticks on any kernel
        sum(i * i for i in range(10_000))
    used = window.stop()
    assert set(used) == {"cpu_s", "rapl_j", "machine_idle", "machine_steal"}
    assert used["cpu_s"] > 0
    for share in (used["machine_idle"], used["machine_steal"]):
        assert share is None or 0.0 <= share <= 1.0


def test_raw_best_is_the_mean_of_the_runs_two_ends():
    raw = {"batch1_cpu_ms": 0.25, "best_inferences_per_s": 1000.0, "best_cpu_ms": 2.0, "best_at_start": 1000.0}
    bracketed = perf_sweep.bracket_best(raw, {"inferences_per_s": 1400.0, "cpu_ms_per_inference": 1.0})
    assert (bracketed["best_inferences_per_s"], bracketed["best_cpu_ms"]) == (1200.0, 1.5)
    assert (bracketed["best_at_start"], bracketed["best_at_end"], bracketed["batch1_cpu_ms"]) == (1000.0, 1400.0, 0.25)
    assert raw["best_inferences_per_s"] == 1000.0  # the start's figures are not changed in place


RAW = {"mlp": {"batch1_cpu_ms": 0.25, "batch1_p50_ms": 0.2, "paced_cpu_ms": 0.5, "paced_p50_ms": 0.3,
               "best_inferences_per_s": 1200.0, "best_cpu_ms": 1.5, "best_at_start": 1000.0, "best_at_end": 1400.0}}


def point(conc, steal, **more):
    """One gt-serve point of a sweep, as perf_sweep.table reads it."""
    return {"server": "gt_serve", "model": "mlp", "protocol": "http", "concurrency": conc, "inferences_per_s": 600.0,
            "p50_ms": 1.0, "p99_ms": 2.0, "server_cpu_ms_per_inference": 0.5, "machine_steal": steal, **more}


def test_table_marks_points_that_lost_cpu_to_steal():
    out = perf_sweep.table([point(1, 0.0), point(16, 0.12), point(64, None)], RAW)
    rows = out.splitlines()
    assert rows[2].rstrip().endswith(" 0") and rows[3].rstrip().endswith(" 12!") and rows[4].rstrip().endswith(" -")
    assert "1 point(s) marked !" in out and "twice running" in out
    assert "the mean of 1000 at the run's start and 1400 at its end" in out
    assert "marked !" not in perf_sweep.table([point(1, 0.01)], RAW)


def test_table_shows_the_share_of_the_machine_no_process_used():
    rows = perf_sweep.table([point(64, 0.0, machine_idle=0.17), point(64, 0.0)], RAW).splitlines()
    assert rows[0].split()[-2:] == ["idle", "steal"]
    assert rows[2].split()[-2:] == ["17", "0"] and rows[3].split()[-2:] == ["-", "0"]  # unreadable: -


def test_a_stolen_point_keeps_the_less_stolen_of_its_two_measurements():
    first = {"inferences_per_s": 900.0, "machine_steal": 0.12}
    assert perf_sweep.stolen(first) and not perf_sweep.stolen({"machine_steal": None})
    calmer = {"inferences_per_s": 1000.0, "machine_steal": 0.01}
    assert perf_sweep.less_stolen(first, calmer) == {**calmer, "remeasured_steal": 0.12}
    worse = {"inferences_per_s": 1200.0, "machine_steal": 0.2}  # faster, but on a more stolen machine: not taken
    assert perf_sweep.less_stolen(first, worse) == {**first, "remeasured_steal": 0.2}
    failed = {"error": "perf_analyzer exited 1", "machine_steal": 0.0}
    assert perf_sweep.less_stolen(first, failed)["inferences_per_s"] == 900.0


def test_a_threads_cpu_splits_into_user_and_kernel_time():
    """The event loop's time in the kernel (its socket calls) is reported apart from its Python: a burst of system
    calls on this thread shows in its system time, and the two parts add up to its CPU."""
    pid = os.getpid()
    user0, system0 = common.thread_times_s(pid, pid)
    fd = os.open(os.devnull, os.O_WRONLY)
    try:
        for _ in range(300_000):  # ~0.1-0.3 s of write(2), bounded
            os.write(fd, b"x")
    finally:
        os.close(fd)
    user1, system1 = common.thread_times_s(pid, pid)
    assert system1 > system0 and user1 >= user0
    user2, system2 = common.loops_times_s(pid)  # this main thread, and any gt-serve child's
    assert user2 >= user1 and system2 >= system1
    assert sum(common.thread_times_s(pid, pid)) == pytest.approx(time.thread_time(), abs=0.05)  # the two parts add up
    assert common.thread_times_s(pid, 2**22 + 1) == (0.0, 0.0)  # no such thread
