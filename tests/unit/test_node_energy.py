"""Live energy bookkeeping with the static-profile meter: attributed + baseline = meter."""
import pytest

from gt_serve.backends.power import StaticProfileMeter
from gt_serve.core.energy import EnergyModel
from gt_serve.core.node_energy import NodeEnergy
from gt_serve.core.power_profiles import resolve_profile
from gt_serve.errors import ConfigError


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_invariant_and_attribution():
    clock = Clock()
    profile = resolve_profile({"preset": "cpu_box"})
    model = EnergyModel()
    model.add_device("cpu", profile)
    meter = StaticProfileMeter(profile["idle_w"], clock=clock)
    energy = NodeEnergy(model, {"cpu": meter}, clock=clock)
    per_request = energy.on_batch("m", "cpu", 4, 0.01)
    assert per_request > 0
    clock.t += 2.0
    energy.on_batch("m", "cpu", 1, 0.005)
    totals = energy.totals()
    energy.accounting.check_invariant(energy.meter_totals_j(), rel_tol=1e-6)
    assert totals["models"]["m"]["inferences"] == 5
    assert totals["total"]["idle_j"] == pytest.approx(profile["idle_w"] * 2.0, rel=1e-6)


def test_bad_preset_is_named():
    with pytest.raises(ConfigError, match="power_profile.preset.*warp_drive"):
        resolve_profile({"preset": "warp_drive"})
