"""Live energy bookkeeping for this node: the energy model refined from measured batches, the
accounting that attributes joules to models and devices, and the meters that keep it honest.

Each executed batch is charged its dynamic energy (from the profile curve, refined online); the
rest of what a device's meter reads is its baseline (idle/parked). With the static-profile meter
(no hardware meter) the meter is fed the same dynamic energy, so attributed + baseline = meter.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from .energy import EnergyModel
from .energy_accounting import EnergyAccounting


class NodeEnergy:
    def __init__(self, model: EnergyModel, meters: Mapping[str, Any], clock: Callable[[], float] = time.monotonic) -> None:
        self.model = model
        self.meters = dict(meters)  # device -> PowerMeter (one meter may serve several devices)
        self.accounting = EnergyAccounting()
        self._clock = clock
        unique = self.unique_meters()
        self._last_meter_j = {d: m.energy_j() for d, m in unique.items()}
        # device -> the device key its meter is listed under (several devices may share one meter)
        self._meter_key = {d: next(k for k, um in unique.items() if um is m) for d, m in self.meters.items()}
        self._dynamic_since_j: dict[str, float] = {}

    def unique_meters(self) -> dict[str, Any]:
        """device key -> meter, one device per distinct meter (the first that names it)."""
        seen: dict[int, str] = {}
        out = {}
        for device, meter in self.meters.items():
            if id(meter) not in seen:
                seen[id(meter)] = device
                out[device] = meter
        return out

    def on_batch(self, model: str, device: str, batch_size: int, latency_s: float) -> float:
        """Charge one executed batch; returns the energy attributed to each of its requests (J).

        Dynamic energy = the profile's power above idle at this batch size x the measured run time;
        the curve learns both (the router's estimates follow the real machine)."""
        dynamic_j = self.model.profile(device).dynamic_power_w(model, batch_size) * latency_s
        self.model.observe(model, device, batch_size, latency_s, dynamic_j)
        charged = self.accounting.record_batch(model, device, batch_size, dynamic_j)
        meter = self.meters.get(device)
        if meter is not None and hasattr(meter, "add_dynamic_j"):
            meter.add_dynamic_j(dynamic_j, latency_s)
        key = self._meter_key.get(device, device)
        self._dynamic_since_j[key] = self._dynamic_since_j.get(key, 0.0) + dynamic_j
        return charged.per_request_j

    def refresh(self) -> None:
        """Fold what the meters read since the last refresh, less the attributed dynamic energy,
        into each device's baseline."""
        for device, meter in self.unique_meters().items():
            now_j = meter.energy_j()
            delta = now_j - self._last_meter_j.get(device, now_j)
            self._last_meter_j[device] = now_j
            dynamic = self._dynamic_since_j.pop(device, 0.0)
            self.accounting.record_baseline(device, max(delta - dynamic, 0.0))

    def totals(self) -> dict:
        self.refresh()
        return self.accounting.totals()

    def meter_totals_j(self) -> dict[str, float]:
        return {device: meter.energy_j() for device, meter in self.unique_meters().items()}

    def power_w(self) -> dict[str, float]:
        return {device: meter.power_w() for device, meter in self.unique_meters().items()}


def build_node_energy(devices: list[str], profile: Any) -> NodeEnergy:
    """The energy books for this node's devices: the profile's power model for each, metered by NVML
    for GPUs that have it, by RAPL / Jetson rails for the rest, else by the profile's static figure."""
    from ..backends.power import StaticProfileMeter, detect_meters

    model = EnergyModel()
    for device in devices:
        model.add_device(device, profile)
    found = detect_meters(idle_w=None)
    gpu_meters = [m for m in found if m.name.startswith("nvml")]
    node_meter = next((m for m in found if not m.name.startswith("nvml")), None)
    if node_meter is None:
        node_meter = StaticProfileMeter(profile.idle_w, name=f"static:{profile.name}")
    meters = {}
    for device in devices:
        gpu = int(device[4:]) if device.startswith("gpu:") else -1
        meters[device] = gpu_meters[gpu] if 0 <= gpu < len(gpu_meters) else node_meter
    return NodeEnergy(model, meters)
