"""Simulated devices: one execution lane, a FIFO queue, parking, and an energy meter.

A device runs batches whose true latency and dynamic energy come from its power profile, scaled by
a per-device bias (the profile is never exactly right) and seeded per-batch jitter. Its meter
integrates piecewise-constant power: idle_w while awake, idle_w + dynamic/duration while running
a batch, parked_w while parked, idle_w while waking. The router never sees the truth: it sees the
production EnergyModel, seeded from the same profile and refined online from completed batches.
"""
from __future__ import annotations

import enum
import math
import random
from collections import deque
from dataclasses import dataclass, field

from gt_serve.core.batch_policy import BatchConfig
from gt_serve.core.energy import Curve, DeviceProfile


class State(enum.Enum):
    AWAKE = "awake"
    PARKED = "parked"
    WAKING = "waking"
    DEAD = "dead"


@dataclass(slots=True)
class Batch:
    requests: list[int]
    start_s: float
    end_s: float
    dynamic_j: float


@dataclass(slots=True)
class SimDevice:
    name: str
    profile: DeviceProfile
    curve: Curve  # the truth (profile for this model), before bias and jitter
    batching: BatchConfig
    queue_limit: int
    rng: random.Random
    latency_bias: float = 1.0
    energy_bias: float = 1.0
    jitter: float = 0.05
    state: State = State.AWAKE
    queue: deque[int] = field(default_factory=deque)
    running: Batch | None = None
    ready_s: float = 0.0  # when a waking device can run
    idle_since_s: float = 0.0
    timer_at_s: float = math.inf  # pending batch-delay re-evaluation
    # meter: energy integrated up to `metered_to_s`
    meter_j: float = 0.0
    metered_to_s: float = 0.0
    # accounting's independent view: time spent in each baseline state
    awake_s: float = 0.0
    parked_s: float = 0.0
    dynamic_j: float = 0.0
    lost_j: float = 0.0  # dynamic energy of batches cut short by a fault
    batches: int = 0
    inferences: int = 0

    @property
    def max_batch(self) -> int:
        return max(self.batching.max_batch_size, 1)

    @property
    def alive(self) -> bool:
        return self.state is not State.DEAD

    @property
    def outstanding(self) -> int:
        return len(self.queue) + (len(self.running.requests) if self.running else 0)

    @property
    def busy_until_s(self) -> float:
        if self.running is not None:
            return self.running.end_s
        if self.state is State.WAKING:
            return self.ready_s
        return 0.0

    def advance(self, now_s: float) -> None:
        """Integrate the meter and the state clocks up to `now_s`."""
        span = now_s - self.metered_to_s
        if span <= 0 or self.state is State.DEAD:
            self.metered_to_s = max(self.metered_to_s, now_s)
            return
        if self.state is State.PARKED:
            self.meter_j += self.profile.parked_w * span
            self.parked_s += span
        else:
            self.meter_j += self.profile.idle_w * span
            self.awake_s += span
            if self.running is not None:
                run = self.running
                self.meter_j += run.dynamic_j * span / (run.end_s - run.start_s)
        self.metered_to_s = now_s

    def start_batch(self, take: int, now_s: float) -> Batch:
        requests = [self.queue.popleft() for _ in range(take)]
        factor = math.exp(self.rng.gauss(0.0, self.jitter)) if self.jitter > 0 else 1.0
        duration_s = self.curve.latency_s(take) * self.latency_bias * factor
        dynamic_j = self.curve.dynamic_j(take) * self.energy_bias * factor
        self.running = Batch(requests, now_s, now_s + duration_s, dynamic_j)
        return self.running

    def finish_batch(self) -> Batch:
        batch = self.running
        assert batch is not None
        self.running = None
        self.dynamic_j += batch.dynamic_j
        self.batches += 1
        self.inferences += len(batch.requests)
        return batch

    def park(self) -> None:
        self.state = State.PARKED

    def wake(self, now_s: float) -> float:
        """Start waking; returns when the device can run."""
        self.state = State.WAKING
        self.ready_s = now_s + self.profile.wake_s
        return self.ready_s

    def die(self) -> list[int]:
        """The device disappears; returns every request it held (queued and running)."""
        lost = list(self.queue)
        if self.running is not None:
            lost = self.running.requests + lost
        self.queue.clear()
        self.running = None
        self.state = State.DEAD
        return lost
