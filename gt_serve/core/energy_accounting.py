"""Energy accounting: who used the joules.

Each executed batch is charged its dynamic energy (above idle), split evenly over its requests.
Idle and parked energy is charged to the device as baseline. Invariant (checked against meters):

    sum(dynamic energy of batches on a device) + baseline energy of that device
        == the device meter's total over the same window, within tolerance.

For metrics, baseline energy is shared among the models that ran on the device pro rata to their
dynamic energy, so J/inference per model includes its share of keeping the device awake.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from gt_serve.errors import Internal


@dataclass(frozen=True, slots=True)
class BatchEnergy:
    dynamic_j: float
    per_request_j: float


@dataclass(slots=True)
class _Tally:
    inferences: int = 0
    batches: int = 0
    dynamic_j: float = 0.0


def dynamic_from_meter(meter_delta_j: float, duration_s: float, idle_w: float) -> float:
    """Dynamic energy of a batch measured by a meter: the delta minus what idling would have
    cost over the same time (clamped at 0: meter noise must not credit energy back)."""
    return max(meter_delta_j - idle_w * duration_s, 0.0)


class EnergyAccounting:
    def __init__(self) -> None:
        self._by_pair: dict[tuple[str, str], _Tally] = {}
        self._baseline_j: dict[str, float] = {}

    def record_batch(self, model: str, device: str, batch_size: int, dynamic_j: float) -> BatchEnergy:
        """Charge one executed batch; returns what each of its requests is attributed."""
        if batch_size <= 0:
            return BatchEnergy(dynamic_j, 0.0)
        tally = self._by_pair.get((model, device))
        if tally is None:
            tally = self._by_pair[(model, device)] = _Tally()
        tally.inferences += batch_size
        tally.batches += 1
        tally.dynamic_j += dynamic_j
        return BatchEnergy(dynamic_j, dynamic_j / batch_size)

    def record_baseline(self, device: str, energy_j: float) -> None:
        """Idle/parked energy of a device over some interval (not caused by any request)."""
        self._baseline_j[device] = self._baseline_j.get(device, 0.0) + energy_j

    # ---- reading -----------------------------------------------------------------------------
    def pairs(self) -> list[tuple[str, str, int, float]]:
        """(model, device, inferences, dynamic_j) for every pair that ran, sorted."""
        return [(m, d, t.inferences, t.dynamic_j) for (m, d), t in sorted(self._by_pair.items())]

    def device_totals_j(self) -> dict[str, float]:
        """Attributed dynamic + baseline energy per device (what the meters should read)."""
        totals = dict(self._baseline_j)
        for (_, device), tally in self._by_pair.items():
            totals[device] = totals.get(device, 0.0) + tally.dynamic_j
        return totals

    def residuals_j(self, meter_totals_j: Mapping[str, float]) -> dict[str, float]:
        """meter - (attributed + baseline) per device present on either side."""
        accounted = self.device_totals_j()
        devices = set(accounted) | set(meter_totals_j)
        return {d: meter_totals_j.get(d, 0.0) - accounted.get(d, 0.0) for d in sorted(devices)}

    def check_invariant(
        self, meter_totals_j: Mapping[str, float], rel_tol: float = 0.02, abs_tol_j: float = 1e-6
    ) -> None:
        """Raise Internal when a device's meter and its accounted energy disagree."""
        for device, residual in self.residuals_j(meter_totals_j).items():
            scale = max(abs(meter_totals_j.get(device, 0.0)), abs_tol_j)
            if abs(residual) > max(rel_tol * scale, abs_tol_j):
                raise Internal(
                    f"energy accounting for {device!r} is off by {residual:.6g} J "
                    f"(meter {meter_totals_j.get(device, 0.0):.6g} J)",
                    device=device,
                    residual_j=residual,
                )

    def totals(self) -> dict[str, Any]:
        """Export for statistics/metrics: per model, per device and overall."""
        dynamic_per_device: dict[str, float] = {}
        for (_, device), tally in self._by_pair.items():
            dynamic_per_device[device] = dynamic_per_device.get(device, 0.0) + tally.dynamic_j
        models: dict[str, dict[str, float]] = {}
        devices: dict[str, dict[str, float]] = {}
        for (model, device), tally in self._by_pair.items():
            share = self._baseline_share_j(device, tally, dynamic_per_device)
            for table, key in ((models, model), (devices, device)):
                row = table.setdefault(key, {"inferences": 0, "batches": 0, "dynamic_j": 0.0, "energy_j": 0.0})
                row["inferences"] += tally.inferences
                row["batches"] += tally.batches
                row["dynamic_j"] += tally.dynamic_j
                row["energy_j"] += tally.dynamic_j + share
        for device, baseline_j in self._baseline_j.items():
            if device not in devices:  # a device that only idled
                devices[device] = {"inferences": 0, "batches": 0, "dynamic_j": 0.0, "energy_j": baseline_j}
        for row in (*models.values(), *devices.values()):
            _per_inference(row)
        inferences = sum(t.inferences for t in self._by_pair.values())
        dynamic_j = sum(t.dynamic_j for t in self._by_pair.values())
        idle_j = sum(self._baseline_j.values())
        overall = {"inferences": inferences, "dynamic_j": dynamic_j, "idle_j": idle_j, "energy_j": dynamic_j + idle_j}
        _per_inference(overall)
        return {"models": models, "devices": devices, "total": overall}

    def _baseline_share_j(self, device: str, tally: _Tally, dynamic_per_device: Mapping[str, float]) -> float:
        baseline = self._baseline_j.get(device, 0.0)
        device_dynamic = dynamic_per_device.get(device, 0.0)
        if device_dynamic > 0:
            return baseline * tally.dynamic_j / device_dynamic
        pairs = [t for (_, d), t in self._by_pair.items() if d == device]
        return baseline / len(pairs) if pairs else 0.0


def _per_inference(row: dict[str, Any]) -> None:
    n = row["inferences"]
    row["j_per_inference"] = row["energy_j"] / n if n else 0.0
    row["dynamic_j_per_inference"] = row["dynamic_j"] / n if n else 0.0
