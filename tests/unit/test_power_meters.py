from pathlib import Path
from types import SimpleNamespace

import pytest

from gt_serve.backends.power import (
    JetsonRailsMeter,
    NvmlMeter,
    PowerMeter,
    RaplMeter,
    StaticProfileMeter,
    detect_meters,
    nvml_meters,
    total_energy_j,
)


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def write(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{value}\n")


def rapl_tree(root: Path, packages: dict[int, int], max_uj: int = 1_000_000) -> None:
    for n, uj in packages.items():
        write(root / f"intel-rapl:{n}" / "energy_uj", uj)
        write(root / f"intel-rapl:{n}" / "max_energy_range_uj", max_uj)
        write(root / f"intel-rapl:{n}:0" / "energy_uj", 5)  # sub-zone: must not be counted
        write(root / f"intel-rapl:{n}:0" / "max_energy_range_uj", max_uj)


def test_rapl_sums_packages_and_handles_wrap(tmp_path: Path) -> None:
    rapl_tree(tmp_path, {0: 900_000, 1: 100})
    clock = FakeClock()
    meter = RaplMeter(tmp_path, clock)
    assert meter.name == "rapl:intel-rapl:0,intel-rapl:1"
    assert meter.energy_j() == 0.0
    write(tmp_path / "intel-rapl:0" / "energy_uj", 50_000)  # wrapped: +100_001 + 50_000
    write(tmp_path / "intel-rapl:1" / "energy_uj", 2_000_100)  # +2 J
    clock.now_s += 2.0
    assert meter.energy_j() == pytest.approx((100_001 + 50_000 + 2_000_000) / 1e6)
    # the clock did not move: still the average over the last window (2.150001 J / 2 s)
    assert meter.power_w() == pytest.approx(2.150001 / 2)
    write(tmp_path / "intel-rapl:1" / "energy_uj", 6_000_100)
    clock.now_s += 2.0
    assert meter.power_w() == pytest.approx(2.0)
    assert isinstance(meter, PowerMeter)


def test_rapl_energy_is_monotonic_over_many_wraps(tmp_path: Path) -> None:
    rapl_tree(tmp_path, {0: 0}, max_uj=999)
    meter = RaplMeter(tmp_path, FakeClock())
    last, value = 0.0, 0
    for step in range(50):
        value = (value + 700) % 1000
        write(tmp_path / "intel-rapl:0" / "energy_uj", value)
        now = meter.energy_j()
        assert now >= last
        last = now
    assert last == pytest.approx(50 * 700 / 1e6)


def test_rapl_absent_or_unreadable(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        RaplMeter(tmp_path)
    (tmp_path / "intel-rapl:0").mkdir()  # no energy_uj (root-only on recent kernels)
    with pytest.raises(FileNotFoundError):
        RaplMeter(tmp_path)


def fake_nvml(energy_mj: list[int], power_mw: int = 250_000, count: int = 1, supported: bool = True):
    calls = {"init": 0}

    def init() -> None:
        calls["init"] += 1

    def energy(handle: int) -> int:
        if not supported:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return energy_mj[handle]

    return SimpleNamespace(
        nvmlInit=init, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: count,
        nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetTotalEnergyConsumption=energy,
        nvmlDeviceGetPowerUsage=lambda h: power_mw, calls=calls,
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=37, memory=5),
        nvmlDeviceGetPowerManagementLimit=lambda h: 350_000,
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=80 << 30, used=3 << 30, free=77 << 30),
    )


def test_nvml_meter_converts_units_and_starts_at_zero() -> None:
    counters = [5_000_000, 0]
    nvml = fake_nvml(counters, power_mw=312_500)
    meter = NvmlMeter(0, nvml)
    assert meter.name == "nvml:0" and meter.energy_j() == 0.0
    counters[0] += 1_500
    assert meter.energy_j() == pytest.approx(1.5)
    assert meter.power_w() == pytest.approx(312.5)
    assert meter.utilization() == pytest.approx(0.37)
    assert meter.power_limit_w() == pytest.approx(350.0)
    assert meter.memory() == (80 << 30, 3 << 30)
    assert isinstance(meter, PowerMeter)


def test_nvml_limit_and_memory_are_none_where_the_board_does_not_say() -> None:
    nvml = fake_nvml([0])

    def not_supported(handle):
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    nvml.nvmlDeviceGetPowerManagementLimit = nvml.nvmlDeviceGetMemoryInfo = not_supported
    meter = NvmlMeter(0, nvml)
    assert meter.power_limit_w() is None and meter.memory() is None
    assert meter.power_w() == pytest.approx(250.0)  # the rest still reads


def test_nvml_meters_one_per_gpu_and_none_when_unsupported() -> None:
    assert [m.name for m in nvml_meters(fake_nvml([1, 2], count=2))] == ["nvml:0", "nvml:1"]
    assert nvml_meters(fake_nvml([1], supported=False)) == []
    broken = SimpleNamespace(nvmlInit=lambda: (_ for _ in ()).throw(RuntimeError("no driver")))
    assert nvml_meters(broken) == []


def hwmon(root: Path, n: int, name: str, channels: dict[int, dict[str, object]]) -> Path:
    d = root / f"hwmon{n}"
    write(d / "name", name)
    for ch, files in channels.items():
        for key, value in files.items():
            write(d / key.format(n=ch), value)
    return d


def test_jetson_rails_integrate_power_over_the_clock(tmp_path: Path) -> None:
    d = hwmon(tmp_path, 1, "ina3221", {
        1: {"in{n}_label": "VDD_GPU_SOC", "in{n}_input": 5000, "curr{n}_input": 1000},  # 5 W
        2: {"in{n}_label": "VDD_CPU_CV", "power{n}_input": 2_000_000},  # 2 W (µW file)
    })
    hwmon(tmp_path, 0, "coretemp", {1: {"in{n}_input": 1}})  # not a rail monitor
    clock = FakeClock()
    meter = JetsonRailsMeter(tmp_path, clock)
    assert meter.name == "jetson:VDD_GPU_SOC,VDD_CPU_CV"
    assert meter.power_w() == pytest.approx(7.0)
    clock.now_s += 10.0
    assert meter.energy_j() == pytest.approx(70.0)
    write(d / "curr1_input", 3000)  # 15 W + 2 W; trapezoid between 7 W and 17 W
    clock.now_s += 2.0
    assert meter.energy_j() == pytest.approx(70.0 + 2.0 * (7 + 17) / 2)


def test_jetson_prefers_the_board_input_rail(tmp_path: Path) -> None:
    hwmon(tmp_path, 0, "ina3221", {
        1: {"in{n}_label": "VDD_IN", "in{n}_input": 5000, "curr{n}_input": 2000},
        2: {"in{n}_label": "VDD_CPU_GPU_CV", "in{n}_input": 5000, "curr{n}_input": 1000},
    })
    meter = JetsonRailsMeter(tmp_path, FakeClock())
    assert meter.name == "jetson:VDD_IN" and meter.power_w() == pytest.approx(10.0)


def test_jetson_absent(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        JetsonRailsMeter(tmp_path)


def test_static_profile_meter() -> None:
    clock = FakeClock()
    meter = StaticProfileMeter(idle_w=20.0, clock=clock)
    assert meter.energy_j() == 0.0 and meter.power_w() == 20.0
    clock.now_s += 3.0
    meter.add_dynamic_j(12.0, duration_s=0.5)
    assert meter.energy_j() == pytest.approx(72.0)
    assert meter.power_w() == pytest.approx(44.0)


def test_detect_meters_picks_what_is_present(tmp_path: Path) -> None:
    rapl, hw = tmp_path / "powercap", tmp_path / "hwmon"
    rapl.mkdir()
    hw.mkdir()
    clock = FakeClock()
    only_static = detect_meters(nvml=fake_nvml([0], count=0), rapl_root=rapl, hwmon_root=hw, idle_w=30, clock=clock)
    assert [type(m) for m in only_static] == [StaticProfileMeter]
    assert detect_meters(use_nvml=False, rapl_root=rapl, hwmon_root=hw) == []
    rapl_tree(rapl, {0: 10})
    hwmon(hw, 0, "ina3221", {1: {"power{n}_input": 1_000_000}})
    found = detect_meters(nvml=fake_nvml([0]), rapl_root=rapl, hwmon_root=hw, idle_w=30, clock=clock)
    assert [type(m) for m in found] == [NvmlMeter, RaplMeter, JetsonRailsMeter]
    clock.now_s += 1.0
    assert total_energy_j(found) == pytest.approx(1.0)  # only the Jetson rail moved (1 W x 1 s)


def test_power_module_does_not_import_pynvml() -> None:
    import subprocess
    import sys

    code = "import sys, gt_serve.backends.power as p; p.detect_meters(use_nvml=False); print('pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
