import math

import pytest

from gt_serve.core.energy import Curve, DeviceProfile, EnergyModel
from gt_serve.core.power_profiles import PROFILES, profile_for
from gt_serve.errors import ConfigError, NotFound

PROFILE = {
    "idle_w": 60, "busy_w": 300, "parked_w": 20, "wake_ms": 10, "park_after_s": 2,
    "latency_ms": {"model_x": {1: 2.0, 8: 4.0, 64: 20.0}, "*": {1: 10.0}},
    "power_w": {"model_x": {1: 100, 64: 300}},
}


def model() -> EnergyModel:
    em = EnergyModel(alpha=0.5)
    em.add_device("gpu", PROFILE)
    return em


def test_latency_interpolates_and_extrapolates() -> None:
    em = model()
    assert em.latency_s("model_x", "gpu", 1) == pytest.approx(0.002)
    assert em.latency_s("model_x", "gpu", 8) == pytest.approx(0.004)
    assert em.latency_s("model_x", "gpu", 36) == pytest.approx(0.012)  # halfway 8..64
    assert em.latency_s("model_x", "gpu", 120) == pytest.approx(0.020 + 56 * 0.016 / 56)  # last slope
    assert em.latency_s("model_x", "gpu", 0.5) == pytest.approx(0.002)  # flat below the table


def test_dynamic_energy_uses_power_table_minus_idle() -> None:
    em = model()
    assert em.dynamic_j("model_x", "gpu", 1) == pytest.approx((100 - 60) * 0.002)
    assert em.dynamic_j("model_x", "gpu", 64) == pytest.approx((300 - 60) * 0.020)
    p8 = 100 + (300 - 100) * 7 / 63
    assert em.dynamic_j("model_x", "gpu", 8) == pytest.approx((p8 - 60) * 0.004)
    assert em.dynamic_j("model_x", "gpu", 0) == 0.0


def test_unknown_model_uses_default_then_fallback() -> None:
    em = model()
    assert em.latency_s("other", "gpu", 1) == pytest.approx(0.010)
    assert em.dynamic_j("other", "gpu", 1) == pytest.approx((300 - 60) * 0.010)  # busy_w without a power table
    bare = EnergyModel()
    bare.add_device("cpu", {"idle_w": 10, "busy_w": 20, "latency_ms": {"only": {1: 1.0}}})
    assert bare.latency_s("else", "cpu", 1) == pytest.approx(0.010)  # FALLBACK_LATENCY_MS
    with pytest.raises(NotFound):
        bare.latency_s("else", "nodevice", 1)


def test_marginal_energy_of_joining_an_open_batch_is_the_increment() -> None:
    em = model()
    new_batch = em.marginal_j("model_x", "gpu", 0)
    joining = em.marginal_j("model_x", "gpu", 31)
    assert new_batch == pytest.approx(em.dynamic_j("model_x", "gpu", 1))
    assert joining == pytest.approx(em.dynamic_j("model_x", "gpu", 32) - em.dynamic_j("model_x", "gpu", 31))
    gpu = EnergyModel()
    gpu.add_device("gpu", profile_for("gpu_server"))
    assert gpu.marginal_j("yolov8m", "gpu", 7) < gpu.marginal_j("yolov8m", "gpu", 0) / 2


def test_ewma_refines_toward_measurements() -> None:
    em = model()
    for _ in range(30):
        em.observe("model_x", "gpu", 8, latency_s=0.008, dynamic_j=2.0)
    assert em.latency_s("model_x", "gpu", 8) == pytest.approx(0.008, rel=1e-6)
    assert em.dynamic_j("model_x", "gpu", 8) == pytest.approx(2.0, rel=1e-6)
    em.observe("model_x", "gpu", 16, latency_s=0.1)  # a new point, seeded by interpolation
    assert 0.006 < em.latency_s("model_x", "gpu", 16) < 0.1
    assert 16 in em.curve("model_x", "gpu").batch_sizes
    assert em.latency_s("model_x", "gpu", 1) == pytest.approx(0.002)  # other points untouched


def test_add_device_resets_learned_curves() -> None:
    em = model()
    em.observe("model_x", "gpu", 1, latency_s=1.0)
    em.add_device("gpu", PROFILE)
    assert em.latency_s("model_x", "gpu", 1) == pytest.approx(0.002)


def test_row_estimate_queue_model() -> None:
    em = model()
    ready, service, marginal = em.row_estimate("model_x", "gpu", queued=0, busy_until_s=0.0, max_batch=8, now_s=5.0)
    assert (ready, service) == (5.0, pytest.approx(0.002))
    assert marginal == pytest.approx(em.marginal_j("model_x", "gpu", 0))
    ready, service, marginal = em.row_estimate("model_x", "gpu", queued=19, busy_until_s=5.01, max_batch=8, now_s=5.0)
    assert ready == pytest.approx(5.01 + 2 * 0.004)  # two full batches ahead
    assert service == pytest.approx(em.latency_s("model_x", "gpu", 4))  # joins the open batch of 3
    assert marginal == pytest.approx(em.marginal_j("model_x", "gpu", 3))


def test_wake_commitment() -> None:
    p = DeviceProfile.from_dict(PROFILE)
    assert p.wake_s == pytest.approx(0.010)
    assert p.wake_j == pytest.approx(60 * 0.010 + (60 - 20) * 2)
    no_park = DeviceProfile.from_dict({"idle_w": 5, "busy_w": 9, "latency_ms": {"*": {1: 1}}})
    assert no_park.wake_j == 0.0 and math.isinf(no_park.park_after_s)


@pytest.mark.parametrize("bad", [
    {"busy_w": 10, "latency_ms": {"*": {1: 1}}},
    {"idle_w": 10, "busy_w": 5, "latency_ms": {"*": {1: 1}}},
    {"idle_w": 10, "busy_w": 50, "parked_w": 20, "latency_ms": {"*": {1: 1}}},
    {"idle_w": "lots", "busy_w": 50, "latency_ms": {"*": {1: 1}}},
    {"idle_w": 10, "busy_w": 50, "latency_ms": {}},
    {"idle_w": 10, "busy_w": 50, "latency_ms": {"m": {0: 1}}},
    {"idle_w": 10, "busy_w": 50, "latency_ms": {"m": {"x": 1}}},
    {"idle_w": 10, "busy_w": 50, "latency_ms": {"m": {1: -1}}},
    {"idle_w": 10, "busy_w": 50, "latency_ms": [1, 2]},
])
def test_bad_profiles_raise_config_error(bad: dict) -> None:
    with pytest.raises(ConfigError):
        DeviceProfile.from_dict(bad)


def test_yaml_style_string_keys_are_accepted() -> None:
    p = DeviceProfile.from_dict({"idle_w": "60", "busy_w": 300, "latency_ms": {"m": {"1": "2.0", "8": 4}}})
    assert p.curve("m").latency_s(8) == pytest.approx(0.004)


def test_curve_single_point_and_validation() -> None:
    c = Curve({4: (0.01, 1.0)})
    assert c.latency_s(2) == pytest.approx(0.01) and c.latency_s(8) == pytest.approx(0.02)
    assert c.dynamic_j(2) == pytest.approx(0.5) and c.dynamic_j(8) == pytest.approx(2.0)
    with pytest.raises(ConfigError):
        Curve({})
    with pytest.raises(ConfigError):
        EnergyModel(alpha=0.0)


def per_inference_j(name: str, model: str, batch: int) -> float:
    return DeviceProfile.from_dict(profile_for(name)).curve(model).dynamic_j(batch) / batch


@pytest.mark.parametrize("model_name", ["resnet50", "yolov8m"])
def test_example_profiles_have_the_intended_shape(model_name: str) -> None:
    for name in PROFILES:
        DeviceProfile.from_dict(profile_for(name))
    gpu = DeviceProfile.from_dict(profile_for("gpu_server"))
    jetson = DeviceProfile.from_dict(profile_for("jetson_orin"))
    cpu = DeviceProfile.from_dict(profile_for("cpu_box"))
    # GPU: high idle power, fastest, much cheaper per inference at large batch than at batch 1
    assert gpu.idle_w > cpu.idle_w > jetson.idle_w
    assert per_inference_j("gpu_server", model_name, 32) < 0.75 * per_inference_j("gpu_server", model_name, 1)
    assert gpu.curve(model_name).latency_s(8) < jetson.curve(model_name).latency_s(8) < cpu.curve(model_name).latency_s(8)
    # CPU: the least efficient per inference, by far
    assert per_inference_j("cpu_box", model_name, 8) > 5 * per_inference_j("gpu_server", model_name, 32)
    assert per_inference_j("cpu_box", model_name, 8) > 5 * per_inference_j("jetson_orin", model_name, 8)
    # templates are copied, not shared
    profile_for("gpu_server")["idle_w"] = 1
    assert PROFILES["gpu_server"]["idle_w"] == 150.0
    with pytest.raises(NotFound):
        profile_for("tpu")
