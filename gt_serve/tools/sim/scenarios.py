"""Scenarios for the fleet simulator: devices, a load trace, faults, the SLO and the policies.

A scenario is a YAML file (see gt_serve/tools/sim/scenarios/hetero.yaml) or the same dict::

    name: hetero
    model: yolov8m
    seed: 1
    slo_ms: 200
    eps: 0.5                      # balanced policy's latency slack
    jitter: 0.05                  # per-batch log-normal sigma of latency and energy
    policies: [balanced, latency, energy, round_robin, least_loaded, cosine]
    devices:
      - name: gpu0
        profile: gpu_server       # an example profile name (gt_serve/core/power_profiles.py) or a dict
        max_batch: 64
        preferred_batch_sizes: [16, 32, 64]
        max_queue_delay_ms: 2
        queue_limit: 256
        latency_bias: 1.05        # truth = profile x bias (the router learns it online)
    trace:
      kind: step                  # poisson | bursty | diurnal | step
      levels: [0.1, 0.2, ..., 0.9]  # load as a fraction of the fleet's peak throughput
      step_s: 2.0
    faults:
      - {at_s: 12.0, device: jetson1}   # the device disappears; its work is re-routed
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from gt_serve.core.energy import DeviceProfile
from gt_serve.core.power_profiles import profile_for
from gt_serve.errors import ConfigError

BUNDLED = Path(__file__).with_name("scenarios") / "hetero.yaml"
TRACE_KINDS = ("poisson", "bursty", "diurnal", "step")


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    name: str
    profile: DeviceProfile
    max_batch: int
    preferred_batch_sizes: tuple[int, ...]
    max_queue_delay_s: float
    queue_limit: int
    latency_bias: float = 1.0
    energy_bias: float = 1.0


@dataclass(frozen=True, slots=True)
class TraceSpec:
    kind: str
    load: float = 0.5  # poisson; bursty base
    burst_load: float = 0.9  # bursty
    burst_s: float = 1.0
    period_s: float = 5.0  # bursty, diurnal
    min_load: float = 0.1  # diurnal
    max_load: float = 0.9
    levels: tuple[float, ...] = ()  # step
    step_s: float = 1.0
    duration_s: float = 0.0  # 0: step -> step_s x levels, others -> 4 periods


@dataclass(frozen=True, slots=True)
class Fault:
    at_s: float
    device: str


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    model: str
    seed: int
    slo_s: float
    eps: float
    jitter: float
    policies: tuple[str, ...]
    devices: tuple[DeviceSpec, ...]
    trace: TraceSpec
    faults: tuple[Fault, ...] = field(default_factory=tuple)

    @property
    def duration_s(self) -> float:
        t = self.trace
        if t.duration_s > 0:
            return t.duration_s
        return t.step_s * len(t.levels) if t.kind == "step" else t.period_s * 4

    def peak_rps(self) -> float:
        """The fleet's peak throughput: every device running full batches back to back."""
        total = 0.0
        for d in self.devices:
            curve = d.profile.curve(self.model)
            total += d.max_batch / (curve.latency_s(d.max_batch) * d.latency_bias)
        return total


def load_scenario(path: Path | str | None = None, **overrides: Any) -> Scenario:
    import yaml  # the simulator's only YAML reader; the server's config lives in config.py

    source = Path(path) if path is not None else BUNDLED
    try:
        raw = yaml.safe_load(source.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read scenario {source}: {exc}") from exc
    return scenario_from_dict({**raw, **overrides})


def scenario_from_dict(raw: Mapping[str, Any]) -> Scenario:
    try:
        devices = tuple(_device(d) for d in raw["devices"])
        trace = _trace(raw["trace"])
        return Scenario(
            name=str(raw.get("name", "scenario")),
            model=str(raw["model"]),
            seed=int(raw.get("seed", 0)),
            slo_s=float(raw.get("slo_ms", math.inf)) / 1e3,
            eps=float(raw.get("eps", 0.5)),
            jitter=float(raw.get("jitter", 0.05)),
            policies=tuple(raw.get("policies", ("balanced", "round_robin", "least_loaded"))),
            devices=devices,
            trace=trace,
            faults=tuple(Fault(float(f["at_s"]), str(f["device"])) for f in raw.get("faults", ())),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"bad scenario: {exc!r}") from exc


def arrival_times(trace: TraceSpec, peak_rps: float, duration_s: float, seed: int) -> np.ndarray:
    """Seeded arrival times (s) of a non-homogeneous Poisson process, by thinning."""
    rng = np.random.default_rng(seed)
    max_rate = peak_rps * max(_load_bound(trace), 1e-9)
    n = rng.poisson(max_rate * duration_s)
    times = np.sort(rng.uniform(0.0, duration_s, size=n))
    keep = rng.uniform(0.0, 1.0, size=n) * max_rate <= peak_rps * load_at(trace, times)
    return times[keep]


def load_at(trace: TraceSpec, t_s: np.ndarray) -> np.ndarray:
    """Load (fraction of peak throughput) at each time."""
    if trace.kind == "poisson":
        return np.full_like(t_s, trace.load)
    if trace.kind == "bursty":
        in_burst = np.mod(t_s, trace.period_s) < trace.burst_s
        return np.where(in_burst, trace.burst_load, trace.load)
    if trace.kind == "diurnal":
        phase = np.cos(2 * np.pi * t_s / trace.period_s)
        return trace.min_load + (trace.max_load - trace.min_load) * (1 - phase) / 2
    if trace.kind == "step":
        idx = np.minimum((t_s / trace.step_s).astype(int), len(trace.levels) - 1)
        return np.asarray(trace.levels, dtype=float)[idx]
    raise ConfigError(f"unknown trace kind {trace.kind!r}; expected one of {', '.join(TRACE_KINDS)}")


def _load_bound(trace: TraceSpec) -> float:
    if trace.kind == "step":
        return max(trace.levels)
    return {"poisson": trace.load, "bursty": max(trace.load, trace.burst_load)}.get(trace.kind, trace.max_load)


def _device(raw: Mapping[str, Any]) -> DeviceSpec:
    profile = raw["profile"]
    if isinstance(profile, str):
        profile = profile_for(profile)
    name = str(raw["name"])
    max_batch = int(raw.get("max_batch", 1))
    return DeviceSpec(
        name=name,
        profile=DeviceProfile.from_dict(profile, name=name),
        max_batch=max_batch,
        preferred_batch_sizes=tuple(int(b) for b in raw.get("preferred_batch_sizes", ())),
        max_queue_delay_s=float(raw.get("max_queue_delay_ms", 0.0)) / 1e3,
        queue_limit=int(raw.get("queue_limit", 4 * max_batch)),
        latency_bias=float(raw.get("latency_bias", 1.0)),
        energy_bias=float(raw.get("energy_bias", 1.0)),
    )


def _trace(raw: Mapping[str, Any]) -> TraceSpec:
    kind = str(raw["kind"])
    if kind not in TRACE_KINDS:
        raise ConfigError(f"unknown trace kind {kind!r}; expected one of {', '.join(TRACE_KINDS)}")
    fields = {k: raw[k] for k in ("load", "burst_load", "burst_s", "period_s", "min_load", "max_load", "step_s", "duration_s") if k in raw}
    spec = TraceSpec(kind=kind, levels=tuple(float(x) for x in raw.get("levels", ())), **{k: float(v) for k, v in fields.items()})
    if kind == "step" and not spec.levels:
        raise ConfigError("a step trace needs levels")
    return spec
