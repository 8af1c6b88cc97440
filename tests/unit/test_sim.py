import dataclasses
import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest
import yaml

from gt_serve.errors import ConfigError
from gt_serve.tools.sim.__main__ import main
from gt_serve.tools.sim.engine import FleetSim, run_scenario
from gt_serve.tools.sim.scenarios import BUNDLED, Fault, TraceSpec, arrival_times, load_scenario, scenario_from_dict

KEYS = {"policy", "inferences", "joules_per_inference", "dynamic_joules_per_inference", "p50_ms", "p99_ms",
        "slo_attainment"}


@pytest.fixture(scope="module")
def bundled_results() -> dict:
    scenario = load_scenario()
    return {r.policy: r for r in run_scenario(scenario, ("balanced", "round_robin", "least_loaded"))}


def test_bundled_scenario_meets_the_energy_targets(bundled_results: dict) -> None:
    balanced = bundled_results["balanced"]
    rr, ll = bundled_results["round_robin"], bundled_results["least_loaded"]
    assert balanced.joules_per_inference <= 0.75 * rr.joules_per_inference
    assert balanced.joules_per_inference <= 0.85 * ll.joules_per_inference
    assert balanced.slo_attainment >= 0.99
    # every policy served the same trace, completely
    assert balanced.arrivals == rr.arrivals == ll.arrivals > 10_000
    for r in bundled_results.values():
        assert r.inferences + r.rejected == r.arrivals
        assert set(r.to_json()) >= KEYS


def test_bundled_scenario_fault_reroutes_work(bundled_results: dict) -> None:
    assert bundled_results["round_robin"].rerouted > 0
    for r in bundled_results.values():
        assert r.share["jetson1"] < 0.2


def small_scenario(**over) -> "object":
    scenario = load_scenario()
    trace = dataclasses.replace(scenario.trace, step_s=0.25)
    return dataclasses.replace(scenario, trace=trace, **over)


def test_a_dead_device_gets_no_new_work_and_its_queue_is_rerouted() -> None:
    fault_s = 1.5
    scenario = small_scenario(faults=(Fault(fault_s, "jetson0"),))
    sim = FleetSim(scenario, "round_robin")  # round robin keeps every device's queue busy
    decisions: list[tuple[float, str]] = []
    choose = sim.router.choose

    def spy(snap, demand, now_s):
        decision = choose(snap, demand, now_s)
        decisions.append((now_s, decision.candidate_id))
        return decision

    sim.router.choose = spy  # type: ignore[method-assign]
    held: list[int] = []
    on_fault = sim._on_fault

    def record_fault(i: int, now_s: float) -> None:
        dev = sim.devices[i]
        held.extend(dev.queue)
        if dev.running is not None:
            held.extend(dev.running.requests)
        on_fault(i, now_s)

    sim._on_fault = record_fault  # type: ignore[method-assign]
    result = sim.run()
    assert len(held) > 0 and result.rerouted == len(held)
    assert not any(cid == "jetson0" for t, cid in decisions if t >= fault_s)
    assert any(cid == "jetson0" for t, cid in decisions if t < fault_s)
    assert not np.isnan(sim.done_s[held]).any()  # every held request was answered elsewhere
    assert result.inferences + result.rejected == result.arrivals
    assert not sim.tensor.snapshot().alive[sim.tensor.row("jetson0")]


def test_seeded_runs_are_reproducible() -> None:
    a = FleetSim(small_scenario(), "balanced").run().to_json()
    b = FleetSim(small_scenario(), "balanced").run().to_json()
    c = FleetSim(small_scenario(seed=99), "balanced").run().to_json()
    assert a == b and a != c


def test_batches_respect_the_batch_config() -> None:
    sim = FleetSim(small_scenario(), "least_loaded")
    sim.run()
    sizes = {d.name: d.inferences / max(d.batches, 1) for d in sim.devices}
    limits = {spec.name: spec.max_batch for spec in sim.scenario.devices}
    assert all(sizes[n] <= limits[n] for n in sizes)
    assert sizes["gpu0"] > 1.5  # the GPU actually batches under load


@pytest.mark.parametrize("trace, expected", [
    (TraceSpec("poisson", load=0.5, duration_s=20), 0.5),
    (TraceSpec("bursty", load=0.2, burst_load=0.8, burst_s=1, period_s=4), 0.2 * 0.75 + 0.8 * 0.25),
    (TraceSpec("diurnal", min_load=0.1, max_load=0.9, period_s=5), 0.5),
    (TraceSpec("step", levels=(0.1, 0.5, 0.9), step_s=5), 0.5),
])
def test_traces_have_the_requested_mean_load(trace: TraceSpec, expected: float) -> None:
    duration_s = trace.duration_s or (trace.step_s * len(trace.levels) if trace.kind == "step" else 4 * trace.period_s)
    times = arrival_times(trace, 1000.0, duration_s, seed=3)
    assert np.all(np.diff(times) >= 0) and times[-1] <= duration_s
    assert len(times) / duration_s == pytest.approx(1000.0 * expected, rel=0.05)


def test_step_trace_ramps() -> None:
    trace = TraceSpec("step", levels=(0.1, 0.9), step_s=10)
    times = arrival_times(trace, 1000.0, 20.0, seed=1)
    first, second = np.count_nonzero(times < 10), np.count_nonzero(times >= 10)
    assert second > 6 * first


def test_cli_prints_one_json_line_per_policy(tmp_path: Path) -> None:
    raw = yaml.safe_load(BUNDLED.read_text())
    raw["trace"]["step_s"] = 0.1
    raw["policies"] = ["balanced", "cosine"]
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw))
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["--scenario", str(path), "--seed", "5"]) == 0
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["policy"] for line in lines] == ["balanced", "cosine"]
    for line in lines:
        assert set(line) >= KEYS and line["inferences"] > 0 and 0 <= line["slo_attainment"] <= 1


def test_bad_scenarios() -> None:
    with pytest.raises(ConfigError):
        scenario_from_dict({"model": "m", "devices": [], "trace": {"kind": "zigzag"}})
    with pytest.raises(ConfigError):
        scenario_from_dict({"model": "m", "devices": [{"name": "x"}], "trace": {"kind": "poisson"}})
    with pytest.raises(ConfigError):
        load_scenario("/nonexistent/scenario.yaml")


# ---- placement (issue #18): static hand placement vs the placement loop, same hardware and demand ----

def test_placement_loop_beats_static_placement_by_the_target_margin() -> None:
    from gt_serve.tools.sim.placement import load_placement_scenario, run_placement

    static, loop = run_placement(load_placement_scenario())  # seeded: the same day for both
    assert static.requests == loop.requests > 100_000
    assert static.loads == static.unloads == 0
    assert loop.loads >= 1  # a replica placed for the evening peak
    fewer_misses = static.missed >= 2 * loop.missed
    less_energy = loop.joules_per_inference <= 0.8 * static.joules_per_inference
    assert fewer_misses or less_energy, (static.to_json(), loop.to_json())
    assert loop.joules_per_inference < static.joules_per_inference


def test_placement_cli_prints_both_modes_and_the_ratios() -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["--placement", "both", "--seed", "2"]) == 0
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line.get("placement") for line in lines[:2]] == ["static", "loop"]
    assert lines[2]["slo_miss_ratio"] >= 2.0
    for line in lines[:2]:
        assert 0 < line["slo_attainment"] <= 1 and line["joules_per_inference"] > 0


def test_placement_scenario_errors_name_the_problem(tmp_path: Path) -> None:
    from gt_serve.tools.sim.placement import PlacementSim, load_placement_scenario

    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: placement\nnodes: []\n")
    with pytest.raises(ConfigError, match="bad placement scenario"):
        load_placement_scenario(bad)
    with pytest.raises(ConfigError, match="placement mode"):
        PlacementSim(load_placement_scenario(), "random")
