"""Discrete-event fleet simulation on a virtual clock.

Drives the production pieces: `Router` over a `ResourceTensor`, the `EnergyModel` (row estimates,
refined online from every completed batch), `form_batch`/`BatchConfig` for batching and
`EnergyAccounting`. Devices are simulated (gt_serve/tools/sim/devices.py). Every policy sees the same
seeded arrival trace, devices and batching.
"""
from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gt_serve.core.batch_policy import BatchConfig, form_batch
from gt_serve.core.energy import EnergyModel
from gt_serve.core.energy_accounting import EnergyAccounting
from gt_serve.core.resource_tensor import ResourceTensor
from gt_serve.core.router import RequestDemand, Router
from gt_serve.errors import Unavailable
from gt_serve.tools.sim.devices import SimDevice, State
from gt_serve.tools.sim.scenarios import Scenario, arrival_times

_DONE, _TIMER, _PARK, _WAKE, _FAULT = range(5)


@dataclass(slots=True)
class PolicyResult:
    policy: str
    arrivals: int
    inferences: int
    rejected: int
    rerouted: int
    energy_j: float
    dynamic_j: float
    p50_ms: float
    p99_ms: float
    slo_attainment: float
    sim_s: float
    share: dict[str, float] = field(default_factory=dict)
    accounting: dict[str, Any] = field(default_factory=dict)
    meter_j: dict[str, float] = field(default_factory=dict)

    @property
    def joules_per_inference(self) -> float:
        return self.energy_j / self.inferences if self.inferences else math.inf

    @property
    def dynamic_joules_per_inference(self) -> float:
        return self.dynamic_j / self.inferences if self.inferences else math.inf

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "inferences": self.inferences,
            "joules_per_inference": round(self.joules_per_inference, 6),
            "dynamic_joules_per_inference": round(self.dynamic_joules_per_inference, 6),
            "p50_ms": round(self.p50_ms, 3),
            "p99_ms": round(self.p99_ms, 3),
            "slo_attainment": round(self.slo_attainment, 5),
            "arrivals": self.arrivals,
            "rejected": self.rejected,
            "rerouted": self.rerouted,
            "energy_j": round(self.energy_j, 3),
            "sim_s": round(self.sim_s, 3),
            "share": {k: round(v, 4) for k, v in self.share.items()},
        }


class FleetSim:
    def __init__(self, scenario: Scenario, policy: str, arrivals_s: np.ndarray | None = None) -> None:
        self.scenario = scenario
        self.policy = policy
        self.model = scenario.model
        seed = scenario.seed
        self.arrivals_s = (
            arrivals_s if arrivals_s is not None
            else arrival_times(scenario.trace, scenario.peak_rps(), scenario.duration_s, seed)
        )
        self.router = Router(policy, scenario.eps, random.Random(seed))
        self.energy = EnergyModel()
        self.tensor = ResourceTensor(len(scenario.devices))
        self.accounting = EnergyAccounting()
        self.devices: list[SimDevice] = []
        self._index: dict[str, int] = {}
        for i, spec in enumerate(scenario.devices):
            self.energy.add_device(spec.name, spec.profile)
            dev = SimDevice(
                name=spec.name,
                profile=spec.profile,
                curve=spec.profile.curve(self.model),
                batching=BatchConfig(spec.max_batch, spec.preferred_batch_sizes, spec.max_queue_delay_s),
                queue_limit=spec.queue_limit,
                rng=random.Random(seed * 1000 + i),
                latency_bias=spec.latency_bias,
                energy_bias=spec.energy_bias,
                jitter=scenario.jitter,
            )
            self.devices.append(dev)
            self._index[spec.name] = i
            self.tensor.add_row(
                spec.name,
                queue_limit=spec.queue_limit,
                idle_w=spec.profile.idle_w,
                busy_w=spec.profile.busy_w,
                parked_w=spec.profile.parked_w,
                wake_s=spec.profile.wake_s,
                wake_j=spec.profile.wake_j,
            )
            self._refresh_row(i, 0.0)
        self._demand = RequestDemand(model=self.model, slo_s=scenario.slo_s)
        self._ones = [1] * (max(d.max_batch for d in self.devices) + 1)
        self._events: list[tuple[float, int, int, int]] = []
        self._seq = 0
        self.done_s = np.full(len(self.arrivals_s), np.nan)
        self.rejected = 0
        self.rerouted = 0

    # ---- event loop --------------------------------------------------------------------------
    def run(self) -> PolicyResult:
        for fault in self.scenario.faults:
            self._push(fault.at_s, _FAULT, self._index[fault.device])
        for i in range(len(self.devices)):
            self._arm_park(i, 0.0)  # every device starts idle
        arrivals = self.arrivals_s.tolist()
        events = self._events
        handlers = (self._on_done, self._on_timer, self._on_park, self._on_wake, self._on_fault)
        now_s = 0.0
        i, n = 0, len(arrivals)
        while i < n or events:
            if i < n and (not events or arrivals[i] < events[0][0]):
                now_s = arrivals[i]
                self._route(i, now_s)
                i += 1
                continue
            now_s, _, kind, dev = heapq.heappop(events)
            handlers[kind](dev, now_s)
            if i >= n and not any(d.outstanding for d in self.devices if d.alive):
                break  # drained: remaining events are park timers
        return self._result(max(now_s, self.scenario.duration_s))

    def _push(self, at_s: float, kind: int, dev: int) -> None:
        self._seq += 1
        heapq.heappush(self._events, (at_s, self._seq, kind, dev))

    # ---- routing -----------------------------------------------------------------------------
    def _route(self, req: int, now_s: float) -> None:
        try:
            decision = self.router.choose(self.tensor.snapshot(), self._demand, now_s)
        except Unavailable:
            self.rejected += 1
            return
        i = decision.row_index
        dev = self.devices[i]
        dev.advance(now_s)
        dev.queue.append(req)
        if dev.state is State.PARKED:
            self._push(dev.wake(now_s), _WAKE, i)
        self._dispatch(i, now_s)
        self._refresh_row(i, now_s)

    def _dispatch(self, i: int, now_s: float) -> None:
        dev = self.devices[i]
        if dev.state is not State.AWAKE or dev.running is not None or not dev.queue:
            return
        pending = self._ones[: min(len(dev.queue), dev.max_batch + 1)]
        decision = form_batch(pending, float(self.arrivals_s[dev.queue[0]]), now_s, 1, dev.batching)
        if decision.take:
            batch = dev.start_batch(decision.take, now_s)
            self._push(batch.end_s, _DONE, i)
        elif decision.wait_s < math.inf:
            # at least 1 ns ahead: float rounding must not re-arm a timer at the same instant
            at_s = now_s + max(decision.wait_s, 1e-9)
            if at_s < dev.timer_at_s:
                dev.timer_at_s = at_s
                self._push(at_s, _TIMER, i)

    def _refresh_row(self, i: int, now_s: float) -> None:
        dev = self.devices[i]
        if not dev.alive:
            return
        ready_at_s, service_s, marginal_j = self.energy.row_estimate(
            self.model, dev.name, queued=len(dev.queue), busy_until_s=dev.busy_until_s,
            max_batch=dev.max_batch, now_s=now_s,
        )
        depth = dev.outstanding
        self.tensor.update_row(
            i,
            queue_depth=depth,
            ready_at_s=ready_at_s,
            service_s=service_s,
            marginal_j=marginal_j,
            parked=dev.state is State.PARKED,
            free_compute=max(1.0 - depth / dev.queue_limit, 0.0),
        )

    # ---- handlers ----------------------------------------------------------------------------
    def _on_done(self, i: int, now_s: float) -> None:
        dev = self.devices[i]
        if dev.running is None or dev.running.end_s != now_s:
            return  # the device died while this batch ran
        dev.advance(now_s)
        batch = dev.finish_batch()
        self.done_s[batch.requests] = now_s
        size = len(batch.requests)
        self.accounting.record_batch(self.model, dev.name, size, batch.dynamic_j)
        self.energy.observe(self.model, dev.name, size, batch.end_s - batch.start_s, batch.dynamic_j)
        self._dispatch(i, now_s)
        if dev.running is None and not dev.queue:
            self._arm_park(i, now_s)
        self._refresh_row(i, now_s)

    def _arm_park(self, i: int, now_s: float) -> None:
        dev = self.devices[i]
        dev.idle_since_s = now_s
        if dev.profile.parked_w < dev.profile.idle_w and math.isfinite(dev.profile.park_after_s):
            self._push(now_s + dev.profile.park_after_s, _PARK, i)

    def _on_timer(self, i: int, now_s: float) -> None:
        dev = self.devices[i]
        if now_s >= dev.timer_at_s:
            dev.timer_at_s = math.inf
        if dev.alive:
            dev.advance(now_s)
            self._dispatch(i, now_s)
            self._refresh_row(i, now_s)

    def _on_park(self, i: int, now_s: float) -> None:
        dev = self.devices[i]
        idle = dev.state is State.AWAKE and dev.running is None and not dev.queue
        if idle and now_s - dev.idle_since_s >= dev.profile.park_after_s - 1e-12:
            dev.advance(now_s)
            dev.park()
            self._refresh_row(i, now_s)

    def _on_wake(self, i: int, now_s: float) -> None:
        dev = self.devices[i]
        if dev.state is not State.WAKING:
            return
        dev.advance(now_s)
        dev.state = State.AWAKE
        self._dispatch(i, now_s)
        self._refresh_row(i, now_s)

    def _on_fault(self, i: int, now_s: float) -> None:
        dev = self.devices[i]
        if not dev.alive:
            return
        dev.advance(now_s)
        run = dev.running
        if run is not None:  # energy already spent on a batch that will never answer
            dev.lost_j += run.dynamic_j * (now_s - run.start_s) / (run.end_s - run.start_s)
        lost = dev.die()
        self.tensor.mark_dead(dev.name)
        for req in sorted(lost):
            self.rerouted += 1
            self._route(req, now_s)

    # ---- results -----------------------------------------------------------------------------
    def _result(self, end_s: float) -> PolicyResult:
        meter: dict[str, float] = {}
        for dev in self.devices:
            dev.advance(end_s)
            meter[dev.name] = dev.meter_j
            baseline_j = dev.profile.idle_w * dev.awake_s + dev.profile.parked_w * dev.parked_s
            self.accounting.record_baseline(dev.name, baseline_j + dev.lost_j)
        done = ~np.isnan(self.done_s)
        latency_ms = (self.done_s[done] - self.arrivals_s[done]) * 1e3
        inferences = int(done.sum())
        arrivals = len(self.arrivals_s)
        met = int(np.count_nonzero(latency_ms <= self.scenario.slo_s * 1e3))
        dynamic_j = sum(d.dynamic_j + d.lost_j for d in self.devices)
        return PolicyResult(
            policy=self.policy,
            arrivals=arrivals,
            inferences=inferences,
            rejected=self.rejected,
            rerouted=self.rerouted,
            energy_j=sum(meter.values()),
            dynamic_j=dynamic_j,
            p50_ms=float(np.percentile(latency_ms, 50)) if inferences else math.inf,
            p99_ms=float(np.percentile(latency_ms, 99)) if inferences else math.inf,
            slo_attainment=met / arrivals if arrivals else 1.0,
            sim_s=end_s,
            share={d.name: d.inferences / inferences if inferences else 0.0 for d in self.devices},
            accounting=self.accounting.totals(),
            meter_j=meter,
        )


def run_scenario(scenario: Scenario, policies: tuple[str, ...] | None = None) -> list[PolicyResult]:
    arrivals_s = arrival_times(scenario.trace, scenario.peak_rps(), scenario.duration_s, scenario.seed)
    return [FleetSim(scenario, p, arrivals_s).run() for p in (policies or scenario.policies)]
