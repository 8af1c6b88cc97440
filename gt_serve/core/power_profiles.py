"""Example power profiles (schema: gt_serve/core/energy.py) for three classes of machine.

Numbers are round, public-spec-shaped figures, not measurements of one box: they keep the shape
that matters for routing. Powers are whole-node figures (what a wall meter would see).

- GPU server (one H100/A100-class GPU plus host): high idle power, fast, and much more efficient
  per inference at large batch than at batch 1.
- Jetson Orin-class box: a few watts idle, slow-ish, very frugal per inference.
- CPU-only box (two-socket server, no accelerator): slow and the least efficient per inference.

Models: "resnet50" (image classification, 224 px) and "yolov8m" (detection, 640 px, used by the
fleet simulator); "*" is the default for unknown models. These dicts are templates: copy them
(`profile_for(name)` returns a deep copy) before changing them.
"""
from __future__ import annotations

import copy
from typing import Any

from gt_serve.errors import NotFound

GPU_SERVER: dict[str, Any] = {
    "name": "gpu-server-h100",
    "idle_w": 150.0,  # GPU ~60 W idle + host
    "busy_w": 700.0,
    "parked_w": 100.0,  # GPU in a deep P-state, host cores in package C-states
    "wake_ms": 20.0,
    "park_after_s": 2.0,
    "latency_ms": {
        "resnet50": {1: 0.9, 8: 1.4, 32: 3.2, 64: 5.8, 128: 11.0},
        "yolov8m": {1: 3.0, 8: 5.0, 16: 7.5, 32: 14.0, 64: 26.0},
        "*": {1: 4.0, 8: 7.0, 32: 20.0, 64: 38.0},
    },
    "power_w": {
        "resnet50": {1: 230.0, 8: 330.0, 32: 500.0, 64: 600.0, 128: 650.0},
        "yolov8m": {1: 250.0, 8: 400.0, 16: 480.0, 32: 550.0, 64: 600.0},
        "*": {1: 250.0, 8: 400.0, 32: 550.0, 64: 600.0},
    },
}

JETSON_ORIN: dict[str, Any] = {
    "name": "jetson-orin",
    "idle_w": 7.0,
    "busy_w": 30.0,
    "parked_w": 3.0,  # lowest nvpmodel, GPU rail gated
    "wake_ms": 10.0,
    "park_after_s": 1.0,
    "latency_ms": {
        "resnet50": {1: 2.2, 8: 7.5, 16: 14.0},
        "yolov8m": {1: 12.0, 4: 30.0, 8: 56.0},
        "*": {1: 15.0, 4: 40.0, 8: 75.0},
    },
    "power_w": {
        "resnet50": {1: 15.0, 8: 24.0, 16: 26.0},
        "yolov8m": {1: 18.0, 4: 24.0, 8: 25.0},
        "*": {1: 18.0, 8: 25.0},
    },
}

CPU_BOX: dict[str, Any] = {
    "name": "cpu-box",
    "idle_w": 90.0,
    "busy_w": 280.0,
    "parked_w": 40.0,  # package C6, uncore down-clocked
    "wake_ms": 5.0,
    "park_after_s": 1.0,
    "latency_ms": {
        "resnet50": {1: 9.0, 8: 45.0, 16: 85.0},
        "yolov8m": {1: 40.0, 4: 120.0, 8: 220.0},
        "*": {1: 50.0, 4: 160.0, 8: 300.0},
    },
    "power_w": {
        "resnet50": {1: 160.0, 8: 260.0, 16: 280.0},
        "yolov8m": {1: 170.0, 4: 260.0, 8: 280.0},
        "*": {1: 170.0, 8: 280.0},
    },
}

PROFILES: dict[str, dict[str, Any]] = {
    "gpu_server": GPU_SERVER,
    "jetson_orin": JETSON_ORIN,
    "cpu_box": CPU_BOX,
}


def profile_for(name: str) -> dict[str, Any]:
    """A deep copy of the named example profile."""
    try:
        return copy.deepcopy(PROFILES[name])
    except KeyError:
        raise NotFound(f"no example power profile {name!r}; have {', '.join(sorted(PROFILES))}") from None


def resolve_profile(raw: dict[str, Any] | None, default_preset: str = "cpu_box") -> dict[str, Any]:
    """A node's `power_profile` config: `{preset: NAME, ...overrides}` or a full inline profile.
    Errors name the config key and the bad value."""
    from gt_serve.errors import ConfigError

    raw = dict(raw or {})
    preset = raw.pop("preset", None)
    if preset is None and not raw:
        preset = default_preset
    if preset is not None:
        if preset not in PROFILES:
            raise ConfigError(f"config key 'power_profile.preset' must be one of {sorted(PROFILES)}, got {preset!r}")
        base = profile_for(preset)
        base.update(raw)
        return base
    return raw
