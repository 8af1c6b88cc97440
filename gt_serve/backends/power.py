"""Power meters behind one protocol: NVML, Linux RAPL, Jetson INA3221 rails, a static profile.

Every meter reports a monotonic total energy in joules since it was created (`energy_j`) and its
latest power in watts (`power_w`). Sysfs roots, the NVML module and the clock are injectable so
the meters are testable with fake trees; pynvml is imported lazily, only by `NvmlMeter`.
"""
from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

Clock = Callable[[], float]

RAPL_ROOT = Path("/sys/class/powercap")
HWMON_ROOT = Path("/sys/class/hwmon")
INA3221_NAMES = ("ina3221", "ina3221x")
JETSON_TOTAL_RAILS = ("VDD_IN", "POM_5V_IN")  # board input rail, when the labels name one


@runtime_checkable
class PowerMeter(Protocol):
    @property
    def name(self) -> str: ...

    def energy_j(self) -> float:
        """Total energy since the meter was created (J); never decreases."""
        ...

    def power_w(self) -> float:
        """Latest power (W)."""
        ...


# ---- NVML --------------------------------------------------------------------------------------
class NvmlMeter:
    """One GPU through NVML (package nvidia-ml-py, module pynvml).

    Energy: nvmlDeviceGetTotalEnergyConsumption (mJ since driver load, Volta+); power:
    nvmlDeviceGetPowerUsage (mW).
    """

    def __init__(self, index: int = 0, nvml: Any | None = None) -> None:
        self._nvml = nvml if nvml is not None else importlib.import_module("pynvml")
        self._nvml.nvmlInit()
        self._handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
        self._index = index
        self._start_mj = self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)

    @property
    def name(self) -> str:
        return f"nvml:{self._index}"

    def energy_j(self) -> float:
        return (self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle) - self._start_mj) / 1e3

    def power_w(self) -> float:
        return self._nvml.nvmlDeviceGetPowerUsage(self._handle) / 1e3

    def utilization(self) -> float:
        """GPU busy share over the driver's last sample period, 0..1 (nvmlDeviceGetUtilizationRates)."""
        return self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu / 100.0

    def power_limit_w(self) -> float | None:
        """The board's power management limit (W); None where the board does not say (NVML_ERROR_NOT_SUPPORTED)."""
        try:
            return self._nvml.nvmlDeviceGetPowerManagementLimit(self._handle) / 1e3
        except Exception:  # NVMLError: not supported on this board
            return None

    def memory(self) -> tuple[int, int] | None:
        """(total, used) bytes of the GPU's memory (nvmlDeviceGetMemoryInfo); None where the board does not say."""
        try:
            info = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        except Exception:  # NVMLError: not supported (an integrated GPU's shared memory)
            return None
        return int(info.total), int(info.used)

    def close(self) -> None:
        self._nvml.nvmlShutdown()


def nvml_meters(nvml: Any | None = None) -> list[NvmlMeter]:
    """One meter per GPU; [] when NVML is missing or has no device with an energy counter."""
    try:
        module = nvml if nvml is not None else importlib.import_module("pynvml")
        module.nvmlInit()
        count = module.nvmlDeviceGetCount()
    except Exception:  # ImportError, NVMLError (no driver): no NVML here
        return []
    meters = []
    for index in range(count):
        try:
            meters.append(NvmlMeter(index, module))
        except Exception:  # NVML_ERROR_NOT_SUPPORTED on pre-Volta boards
            continue
    return meters


# ---- RAPL --------------------------------------------------------------------------------------
class RaplMeter:
    """Linux powercap RAPL: top-level zones intel-rapl:N (packages; sub-zones such as core/dram
    would double count), energy_uj counters that wrap at max_energy_range_uj."""

    def __init__(self, root: Path = RAPL_ROOT, clock: Clock = time.monotonic) -> None:
        self._zones = rapl_zones(root)
        if not self._zones:
            raise FileNotFoundError(f"no readable RAPL zones under {root}")
        self._clock = clock
        self._range_uj = [_read_int(z / "max_energy_range_uj") for z in self._zones]
        self._last_uj = [_read_int(z / "energy_uj") for z in self._zones]
        self._total_uj = 0
        self._last_s = clock()
        self._power_w = 0.0

    @property
    def name(self) -> str:
        return "rapl:" + ",".join(z.name for z in self._zones)

    def energy_j(self) -> float:
        delta_uj = 0
        for i, zone in enumerate(self._zones):
            now_uj = _read_int(zone / "energy_uj")
            step = now_uj - self._last_uj[i]
            if step < 0:  # the counter wrapped
                step += self._range_uj[i] + 1
            delta_uj += step
            self._last_uj[i] = now_uj
        self._total_uj += delta_uj
        now_s = self._clock()
        if now_s > self._last_s:
            self._power_w = delta_uj / 1e6 / (now_s - self._last_s)
            self._last_s = now_s
        return self._total_uj / 1e6

    def power_w(self) -> float:
        """Average power over the last reading window in which the clock advanced."""
        self.energy_j()
        return self._power_w


def rapl_zones(root: Path = RAPL_ROOT) -> list[Path]:
    try:
        candidates = sorted(root.glob("intel-rapl:*"))
    except OSError:
        return []
    zones = []
    for zone in candidates:
        if zone.name.count(":") != 1:
            continue  # intel-rapl:0:0 is a sub-zone of intel-rapl:0
        try:
            _read_int(zone / "energy_uj")
            _read_int(zone / "max_energy_range_uj")
        except (OSError, ValueError):
            continue  # unreadable (energy_uj is root-only on recent kernels)
        zones.append(zone)
    return zones


# ---- Jetson INA3221 ----------------------------------------------------------------------------
class JetsonRailsMeter:
    """INA3221 rail monitors exposed through hwmon: power{n}_input (µW), or in{n}_input (mV) times
    curr{n}_input (mA). Uses the board-input rail when a label names it, else sums all rails.
    Energy is integrated (trapezoid) over the injected clock at every reading."""

    def __init__(self, root: Path = HWMON_ROOT, clock: Clock = time.monotonic) -> None:
        self._channels = jetson_channels(root)
        if not self._channels:
            raise FileNotFoundError(f"no INA3221 rails under {root}")
        self._clock = clock
        self._last_s = clock()
        self._last_w = self._read_w()
        self._total_j = 0.0

    @property
    def name(self) -> str:
        return "jetson:" + ",".join(label for label, _ in self._channels)

    def sample(self) -> float:
        """Read the rails and integrate; returns the power just read (W)."""
        now_s, power_w = self._clock(), self._read_w()
        if now_s > self._last_s:
            self._total_j += 0.5 * (power_w + self._last_w) * (now_s - self._last_s)
            self._last_s = now_s
        self._last_w = power_w
        return power_w

    def energy_j(self) -> float:
        self.sample()
        return self._total_j

    def power_w(self) -> float:
        return self.sample()

    def _read_w(self) -> float:
        return sum(read() for _, read in self._channels)


def jetson_channels(root: Path = HWMON_ROOT) -> list[tuple[str, Callable[[], float]]]:
    """(label, read-watts) per INA3221 channel, reduced to the board input rail when present."""
    channels: list[tuple[str, Callable[[], float]]] = []
    try:
        hwmons = sorted(root.glob("hwmon*"))
    except OSError:
        return []
    for hwmon in hwmons:
        try:
            chip = (hwmon / "name").read_text().strip()
        except OSError:
            continue
        if chip not in INA3221_NAMES:
            continue
        for n in range(1, 9):
            reader = _channel_reader(hwmon, n)
            if reader is not None:
                label = _read_text(hwmon / f"in{n}_label") or f"{hwmon.name}/ch{n}"
                channels.append((label, reader))
    total = [c for c in channels if c[0] in JETSON_TOTAL_RAILS]
    return total or channels


def _channel_reader(hwmon: Path, n: int) -> Callable[[], float] | None:
    power = hwmon / f"power{n}_input"
    if power.exists():
        return lambda: _read_int(power) / 1e6
    volts, amps = hwmon / f"in{n}_input", hwmon / f"curr{n}_input"
    if volts.exists() and amps.exists():
        return lambda: _read_int(volts) * _read_int(amps) / 1e6
    return None


# ---- static profile ----------------------------------------------------------------------------
class StaticProfileMeter:
    """For machines with no meter: idle power over time plus the dynamic energy the accounting
    reports (`add_dynamic_j`, once per executed batch)."""

    def __init__(self, idle_w: float, clock: Clock = time.monotonic, name: str = "static") -> None:
        self._idle_w = float(idle_w)
        self._clock = clock
        self._start_s = clock()
        self._dynamic_j = 0.0
        self._name = name
        self._recent_w = self._idle_w

    @property
    def name(self) -> str:
        return self._name

    def add_dynamic_j(self, energy_j: float, duration_s: float = 0.0) -> None:
        self._dynamic_j += energy_j
        if duration_s > 0:
            self._recent_w = self._idle_w + energy_j / duration_s

    def energy_j(self) -> float:
        return self._idle_w * (self._clock() - self._start_s) + self._dynamic_j

    def power_w(self) -> float:
        """Power of the last reported batch (idle power before any)."""
        return self._recent_w


# ---- detection ---------------------------------------------------------------------------------
def detect_meters(
    *,
    nvml: Any | None = None,
    use_nvml: bool = True,
    rapl_root: Path = RAPL_ROOT,
    hwmon_root: Path = HWMON_ROOT,
    idle_w: float | None = None,
    clock: Clock = time.monotonic,
) -> list[PowerMeter]:
    """Every meter present (NVML GPUs, RAPL packages, Jetson rails); when there is none, one
    StaticProfileMeter at `idle_w` (if given)."""
    meters: list[PowerMeter] = []
    if use_nvml:
        meters.extend(nvml_meters(nvml))
    if rapl_zones(rapl_root):
        meters.append(RaplMeter(rapl_root, clock))
    if jetson_channels(hwmon_root):
        meters.append(JetsonRailsMeter(hwmon_root, clock))
    if not meters and idle_w is not None:
        meters.append(StaticProfileMeter(idle_w, clock))
    return meters


def total_energy_j(meters: Sequence[PowerMeter]) -> float:
    return sum(m.energy_j() for m in meters)


def _read_int(path: Path) -> int:
    return int(path.read_text().strip())


def _read_text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""
