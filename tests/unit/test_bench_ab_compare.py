"""bench/ab_compare.py: the checkouts take turns going first, and the summary gives each one's means, their ratios to
the first checkout's, and in how many rounds it beat the first (issue #17: A/Bs on a machine that drifts)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import ab_compare  # noqa: E402


def run(cpu, loop, p50=None, infs=None):
    out = {"server_cpu_ms_per_inference": cpu, "loop_cpu_ms_per_inference": loop,
           "loop_system_ms_per_inference": loop / 2}
    if p50 is not None:
        out["p50_ms"] = p50
    if infs is not None:
        out["inferences_per_s"] = infs
    return out


def test_checkouts_take_turns_going_first():
    roots = ["old", "new"]
    assert [ab_compare.round_order(roots, i) for i in range(3)] == [["old", "new"], ["new", "old"], ["old", "new"]]
    assert roots == ["old", "new"]


def test_summary_gives_means_ratios_and_rounds_won():
    results = {"old": [run(0.20, 0.10, 10.0, 5000), run(0.20, 0.10, 10.0, 5000), run(0.20, 0.10, 10.0, 5000)],
               "new": [run(0.10, 0.05, 9.0, 6000), run(0.25, 0.12, 11.0, 4000), run(0.15, 0.07, 10.0, 5000)]}
    old, new = ab_compare.summary(results)
    assert old.startswith("old: server CPU 0.2000 ms/inf (1.00x the first)") and "rounds" not in old
    assert "server CPU 0.1667 ms/inf (0.83x the first)" in new
    assert "event-loop thread(s) 0.0800 ms/inf (0.80x) of which 0.0400 in the kernel" in new
    assert "p50 10.000 ms (1.00x)" in new and "5000 inf/s (1.00x)" in new
    assert new.endswith("less server CPU than the first in 2 of 3 rounds")


def test_summary_of_the_lean_client_leaves_out_what_it_did_not_measure():
    (only,) = ab_compare.summary({"a": [run(0.2, 0.1)]})
    assert "p50" not in only and "inf/s" not in only.replace("ms/inf", "")


def test_a_checkout_may_name_its_own_config():
    assert ab_compare.split_root("/tmp/x@w2.yaml", "all.yaml") == (Path("/tmp/x"), "w2.yaml")
    assert ab_compare.split_root("/tmp/x", "all.yaml") == (Path("/tmp/x"), "all.yaml")


def test_a_model_loaded_beside_is_summed_up_under_each_checkout():
    """`--beside MODEL:N`: the other model's inf/s, p50 and p99 under each checkout, against the first's; a round in
    which its perf_analyzer failed does not count."""
    def with_beside(infs, p50, p99):
        return dict(run(0.2, 0.1, 1.0, 1000), beside={"model": "tiny", "concurrency": 8, "inferences_per_s": infs,
                                                      "p50_ms": p50, "p99_ms": p99})
    failed = dict(run(0.2, 0.1, 1.0, 1000), beside={"model": "tiny", "concurrency": 8, "error": "exited 1"})
    results = {"old": [with_beside(4000, 2.0, 4.0), with_beside(6000, 2.0, 4.0)],
               "new": [with_beside(5500, 1.5, 5.0), failed]}
    lines = ab_compare.summary(results)
    assert len(lines) == 4
    assert lines[1] == "  beside it, tiny: 5000 inf/s (1.00x), p50 2.000 ms (1.00x), p99 4.000 ms (1.00x)"
    assert lines[3] == "  beside it, tiny: 5500 inf/s (1.10x), p50 1.500 ms (0.75x), p99 5.000 ms (1.25x)"


def test_the_beside_load_is_a_model_and_its_clients():
    assert ab_compare.beside_load("tiny:8") == ("tiny", 8)
    assert ab_compare.beside_load("my:model:4") == ("my:model", 4)
    for bad in ("tiny", "tiny:", ":8", "tiny:0", "tiny:x"):
        with pytest.raises(ValueError, match="expected MODEL:CLIENTS"):
            ab_compare.beside_load(bad)
