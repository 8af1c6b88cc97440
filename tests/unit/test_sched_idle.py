"""bench/sched_idle.py's replay of the scheduler's events: how a CPU's idle time is split (a task waiting on another
CPU, a task woken onto the idle CPU waiting for it to wake, nothing runnable) and where each wake-up was placed, read
from `perf script -F cpu,time,event,trace` lines as perf 6.1 prints them (issue #17: the idle share at 64 clients)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import sched_idle  # noqa: E402

LOOP, POOL, CLIENT = 100, 101, 200
KINDS = {LOOP: "event loop", POOL: "server, other threads", CLIENT: "client"}


def kind(pid: int) -> str:
    return KINDS.get(pid, "other")


def switch(cpu: int, t: float, prev: int, state: str, nxt: int) -> str:
    return (f"[{cpu:03d}] {t:.6f}: sched:sched_switch: prev_comm=a b prev_pid={prev} prev_prio=120 "
            f"prev_state={state} ==> next_comm=c next_pid={nxt} next_prio=120")


def waking(cpu: int, t: float, pid: int, target: int) -> str:
    return f"[{cpu:03d}] {t:.6f}:       sched:sched_waking: comm=x pid={pid} prio=120 target_cpu={target:03d}"


def migrate(cpu: int, t: float, pid: int, orig: int, dest: int) -> str:
    return (f"[{cpu:03d}] {t:.6f}: sched:sched_migrate_task: comm=x pid={pid} prio=120 orig_cpu={orig} "
            f"dest_cpu={dest}")


def test_idle_beside_a_preempted_task_is_idle_with_a_task_waiting_elsewhere():
    # cpu 1 runs the loop, cpu 0 idles; at 1.0 the client preempts the loop on cpu 1 (the loop waits there)
    lines = [switch(1, 0.0, 0, "R", LOOP), switch(0, 0.0, 5, "S", 0),
             waking(1, 1.0, CLIENT, 1), switch(1, 1.0, LOOP, "R", CLIENT),
             switch(1, 1.5, CLIENT, "S", LOOP), switch(0, 2.0, 0, "R", 0)]
    r = sched_idle.replay(lines, kind)
    assert r.span_s == pytest.approx(2.0) and r.cpus == 2
    assert r.idle_s == pytest.approx(2.0)  # cpu 0, the whole span
    assert r.idle_waiting_elsewhere_s == pytest.approx(0.5)  # the loop, runnable on cpu 1 from 1.0 to 1.5
    assert r.idle_waking_here_s == pytest.approx(0.0)
    shares = r.shares()
    assert shares["machine_idle"] == pytest.approx(0.5)
    assert shares["idle_task_waiting_elsewhere"] == pytest.approx(0.25)
    assert shares["idle_nothing_runnable"] == pytest.approx(0.75)
    assert shares["idle_waiting_elsewhere_by_kind"] == {"event loop": 0.25}
    (wake,) = r.wake_table()
    assert wake["kind"] == "client" and wake["placed"] == "the waker's busy CPU"
    assert wake["p50_us"] == pytest.approx(0.0)


def test_a_task_woken_onto_an_idle_cpu_waits_for_it_to_wake():
    # the loop on cpu 0 wakes the pool thread, which the kernel moves to idle cpu 1; it runs there 40 us later
    lines = [switch(0, 0.0, 0, "R", LOOP), switch(1, 0.0, 7, "S", 0),
             waking(0, 0.001, POOL, 0), migrate(0, 0.001, POOL, 0, 1),
             switch(1, 0.00104, 0, "R", POOL), switch(1, 0.002, POOL, "S", 0), switch(0, 0.002, LOOP, "R", LOOP)]
    r = sched_idle.replay(lines, kind)
    assert r.idle_waking_here_s == pytest.approx(40e-6)
    assert r.idle_waiting_elsewhere_s == pytest.approx(0.0)
    assert r.idle_s == pytest.approx(0.001 + 0.00004)  # cpu 1 before the pool thread ran
    (wake,) = r.wake_table()
    assert (wake["kind"], wake["placed"]) == ("server, other threads", "an idle CPU")
    assert wake["p50_us"] == pytest.approx(40.0, abs=0.01)
    assert wake["per_s"] == 500  # one wake in 2 ms


def test_a_task_woken_onto_another_busy_cpu_is_placed_there():
    # the loop on cpu 0 wakes a client thread that the kernel queues on cpu 1, busy with the pool thread
    lines = [switch(0, 0.0, 0, "R", LOOP), switch(1, 0.0, 0, "R", POOL),
             waking(0, 0.001, CLIENT, 0), migrate(0, 0.001, CLIENT, 0, 1),
             switch(1, 0.0013, POOL, "S", CLIENT)]
    r = sched_idle.replay(lines, kind)
    (wake,) = r.wake_table()
    assert (wake["kind"], wake["placed"]) == ("client", "another busy CPU")
    assert wake["p50_us"] == pytest.approx(300.0, abs=0.01)
    assert r.idle_s == 0


def test_a_task_that_sleeps_leaves_no_one_waiting():
    lines = [switch(0, 0.0, 0, "R", LOOP), switch(1, 0.0, 0, "R", POOL),
             switch(1, 0.5, POOL, "S", 0), switch(0, 1.0, LOOP, "S", 0), switch(0, 2.0, 0, "R", 0)]
    r = sched_idle.replay(lines, kind)
    assert r.idle_s == pytest.approx(1.5 + 1.0)
    assert r.idle_waiting_elsewhere_s == 0 and r.idle_waking_here_s == 0
    assert r.shares()["idle_nothing_runnable"] == pytest.approx(1.0)
    assert r.wake_table() == []


def test_lines_that_are_not_scheduler_events_are_skipped():
    lines = ["", "# header", "[000] 1.000000: sched:sched_stat_runtime: comm=perf pid=1 runtime=10 [ns]",
             switch(0, 1.0, 0, "R", LOOP), "garbage ==> more", switch(0, 3.0, LOOP, "S", 0)]
    r = sched_idle.replay(lines, kind)
    assert r.span_s == pytest.approx(2.0) and r.cpus == 1 and r.idle_s == 0


def test_run_queue_shares_sum_the_client_and_keep_the_loop():
    before = {LOOP: (0, 0), POOL: (0, 0), CLIENT: (0, 0), 201: (0, 0), 300: (0, 0)}
    after = {LOOP: (500_000_000, 400_000_000), POOL: (300_000_000, 100_000_000), CLIENT: (200_000_000, 1_000_000_000),
             201: (100_000_000, 500_000_000), 300: (900_000_000, 0)}
    kinds = {**KINDS, 201: "client"}
    rows = sched_idle.run_queue_shares(before, after, lambda t: kinds.get(t, "other"), window_s=1.0)
    assert rows[0] == {"thread": f"event loop {LOOP}", "ran": 0.5, "waited": 0.4}
    assert rows[1] == {"thread": f"server, other threads {POOL}", "ran": 0.3, "waited": 0.1}
    assert rows[-1] == {"thread": "client (all its threads)", "ran": 0.3, "waited": 1.5}
    assert len(rows) == 3  # "other" threads are left out


def test_a_cpu_counts_only_from_its_first_switch():
    # cpu 1 runs something unknown until it switches to idle at 1.0; cpu 0 is idle throughout
    lines = [switch(0, 0.0, 9, "S", 0), waking(1, 0.5, POOL, 1), switch(1, 1.0, 9, "S", 0), switch(0, 2.0, 0, "R", 0)]
    r = sched_idle.replay(lines, kind)
    assert r.known_s == pytest.approx(2.0 + 1.0) and r.idle_s == pytest.approx(3.0)
    assert r.shares()["machine_idle"] == pytest.approx(1.0)


def test_a_task_seen_on_another_cpu_leaves_the_first_unknown():
    # the trace missed the client's switch away from cpu 0: once it runs on cpu 1, cpu 0's state is not known
    lines = [switch(0, 0.0, 0, "R", CLIENT), switch(1, 0.0, 0, "R", 0),
             switch(1, 1.0, 0, "R", CLIENT), switch(1, 2.0, CLIENT, "S", 0)]
    r = sched_idle.replay(lines, kind)
    assert r.known_s == pytest.approx(1.0 + 2.0)  # cpu 0 until 1.0, cpu 1 throughout
    assert r.idle_s == pytest.approx(1.0)  # cpu 1 before the client came
    assert r.idle_waiting_elsewhere_s == 0
