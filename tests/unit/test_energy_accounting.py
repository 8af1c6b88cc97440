import dataclasses

import pytest

from gt_serve.backends.power import StaticProfileMeter
from gt_serve.core.energy_accounting import EnergyAccounting, dynamic_from_meter
from gt_serve.errors import Internal
from gt_serve.tools.sim.engine import FleetSim
from gt_serve.tools.sim.scenarios import Fault, load_scenario


def test_batches_split_evenly_and_totals_export() -> None:
    acc = EnergyAccounting()
    assert acc.record_batch("m", "gpu", 4, 2.0).per_request_j == pytest.approx(0.5)
    acc.record_batch("m", "gpu", 2, 1.0)
    acc.record_batch("n", "gpu", 1, 3.0)
    acc.record_batch("m", "cpu", 1, 4.0)
    acc.record_baseline("gpu", 12.0)
    acc.record_baseline("idle-box", 5.0)
    totals = acc.totals()
    m = totals["models"]["m"]
    assert (m["inferences"], m["batches"], m["dynamic_j"]) == (7, 3, pytest.approx(7.0))
    # gpu baseline 12 J shared by dynamic energy: m 3/6, n 3/6
    assert m["energy_j"] == pytest.approx(7.0 + 6.0)
    assert m["j_per_inference"] == pytest.approx(13.0 / 7)
    assert m["dynamic_j_per_inference"] == pytest.approx(1.0)
    assert totals["devices"]["gpu"]["energy_j"] == pytest.approx(18.0)
    assert totals["devices"]["idle-box"] == {"inferences": 0, "batches": 0, "dynamic_j": 0.0, "energy_j": 5.0,
                                             "j_per_inference": 0.0, "dynamic_j_per_inference": 0.0}
    assert totals["total"]["energy_j"] == pytest.approx(10.0 + 17.0)
    assert totals["total"]["j_per_inference"] == pytest.approx(27.0 / 8)


def test_invariant_against_a_static_meter() -> None:
    now = [0.0]
    meter = StaticProfileMeter(idle_w=50.0, clock=lambda: now[0])
    acc = EnergyAccounting()
    for i in range(100):
        now[0] += 0.01
        batch_j = 0.2 + 0.01 * (i % 7)
        acc.record_batch("m", "box", 1 + i % 5, batch_j)
        meter.add_dynamic_j(batch_j)
    acc.record_baseline("box", 50.0 * now[0])
    acc.check_invariant({"box": meter.energy_j()}, rel_tol=1e-9)
    with pytest.raises(Internal, match="off by"):
        acc.check_invariant({"box": meter.energy_j() * 1.05}, rel_tol=0.02)
    assert acc.residuals_j({"box": meter.energy_j() + 1.0})["box"] == pytest.approx(1.0)


def test_dynamic_from_meter_subtracts_idle_and_clamps() -> None:
    assert dynamic_from_meter(10.0, 0.1, 60.0) == pytest.approx(4.0)
    assert dynamic_from_meter(1.0, 0.1, 60.0) == 0.0


@pytest.mark.parametrize("policy", ["balanced", "round_robin"])
def test_invariant_holds_in_the_simulator_with_a_fault(policy: str) -> None:
    scenario = load_scenario()
    trace = dataclasses.replace(scenario.trace, step_s=0.3)
    scenario = dataclasses.replace(scenario, trace=trace, faults=(Fault(1.7, "jetson0"),))
    sim = FleetSim(scenario, policy)
    result = sim.run()
    assert result.rerouted > 0 or policy == "balanced"
    sim.accounting.check_invariant(result.meter_j, rel_tol=1e-9)
    totals = sim.accounting.totals()["total"]
    assert totals["energy_j"] == pytest.approx(result.energy_j, rel=1e-9)
    assert totals["inferences"] == result.inferences
