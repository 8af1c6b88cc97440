"""The spill path (issue #18 item 2): a model that does not fit on its GPU loads on the CPU lanes instead,
when its config and its SLO allow. Pure decisions; LocalModelHost (core/model_host.py) opens, measures
and applies them.

A model spills when all hold:
  (a) it was placed on GPU lanes and every one of its instance groups is KIND_AUTO (an explicit KIND_GPU is
      never moved) and it asks for no GPU execution accelerator;
  (b) the server has CPU lanes;
  (c) its knob `spill_to_cpu` (cfg.models[name]) is not false (default true);
  (d) onnxruntime ran out of device memory creating its session (DeviceOutOfMemory), or its measured device
      footprint would take that GPU past its model-memory budget (used + footprint > budget > 0);
  (e) its SLO allows: with warm-up samples and a known SLO, the CPU warm-up's mean time per run <= the SLO
      (else the load fails with DeviceOutOfMemory). Without warm-up or SLO the spill is allowed.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from .memory_budget import MemoryBook

_FALSE = ("false", "0", "no", "off")


@dataclass(frozen=True)
class Spill:
    """Why a model leaves its GPU: the device and the reason shown in its statistics and the log."""

    device: str  # "gpu:N"
    reason: str

    def as_dict(self) -> dict:
        return {"from": self.device, "to": "cpu", "reason": self.reason}


def may_spill(cfg: mc.ModelConfig, chosen: list, all_lanes: list, knobs: Mapping[str, Any],
              gpu_accelerators: bool = False) -> bool:
    """Conditions (a)-(c): whether this model, placed on the lanes `chosen`, may move to the CPU lanes."""
    return (any(lane.on_gpu for lane in chosen)
            and all(g.kind == mc.ModelInstanceGroup.KIND_AUTO for g in cfg.instance_group)
            and not gpu_accelerators
            and any(not lane.on_gpu for lane in all_lanes)
            and str(knobs.get("spill_to_cpu", True)).strip().lower() not in _FALSE)


def over_device_budget(book: MemoryBook | None, footprint: Mapping[str, int]) -> Spill | None:
    """Condition (d), by budget: the first GPU device this footprint would take past its budget, else None."""
    if book is None:
        return None
    for device, size in sorted(footprint.items()):
        budget = book.budget_for(device)
        if device.startswith("gpu") and size > 0 and budget > 0 and book.used_bytes(device) + size > budget:
            return Spill(device, f"footprint {size} bytes would take {device} past its model-memory budget "
                                 f"({book.used_bytes(device)} of {budget} bytes in use)")
    return None


def slo_miss(warmup: tuple[int, int] | None, slo_s: float | None) -> str:
    """Condition (e): why the CPU lanes would miss the SLO ("" when they meet it or nothing tells).
    `warmup`: (runs, total ns) of the CPU warm-up, None without warm-up samples."""
    if not warmup or not warmup[0] or slo_s is None:
        return ""
    mean_s = warmup[1] / warmup[0] / 1e9
    if mean_s <= slo_s:
        return ""
    return f"a CPU lane would miss its SLO (warm-up {mean_s * 1e3:.3f} ms per run > {slo_s * 1e3:g} ms)"
