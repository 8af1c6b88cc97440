"""Puts formed batches onto lanes: per-lane slots, priorities, weighted fair share between models.

Event-driven on the loop: a submit or a finished batch schedules one `pump`; a model waiting out
its queue delay arms one timer. A hot model cannot starve a cold one: among models with a batch
ready, the one with the least weighted compute time served goes first.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from .batcher import Batch, Batcher

log = logging.getLogger(__name__)
_now_ns = time.monotonic_ns

# choose_lane(batcher, idle_lanes) -> lane; the router plugs in here
LaneChooser = Callable[[Batcher, list], object]


class StreamScheduler:
    def __init__(self, loop: asyncio.AbstractEventLoop, lanes: list, *, choose_lane: LaneChooser | None = None,
                 on_batch_done: Callable | None = None) -> None:
        self.loop = loop
        self.lanes = lanes
        self._batchers: list[Batcher] = []
        self._pump_scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._choose_lane = choose_lane or (lambda batcher, idle: idle[0])
        self.on_batch_done = on_batch_done  # (batch, lane, result, exc) -> None, runs on the loop
        self.batches_dispatched = 0

    def register(self, batcher: Batcher) -> None:
        batcher.scheduler = self
        # a newcomer starts at the current minimum so it neither starves others nor is starved
        batcher.virtual_ns = min((b.virtual_ns for b in self._batchers), default=0.0)
        self._batchers.append(batcher)

    def unregister(self, batcher: Batcher) -> None:
        if batcher in self._batchers:
            self._batchers.remove(batcher)

    def notify(self, batcher: Batcher | None = None) -> None:
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self.loop.call_soon(self._pump)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = float("inf")
        self._pump()

    def _pump(self) -> None:
        self._pump_scheduled = False
        now_ns = _now_ns()
        wake_s = float("inf")
        while True:
            ready = []
            for b in self._batchers:
                if not b.pending:
                    continue
                idle = [lane for lane in b.lanes if not lane.busy]
                decision, head = b.decide(now_ns, len(idle))
                if decision.take:
                    ready.append((b.virtual_ns / b.weight, b, head[:decision.take], idle))
                elif decision.wait_s != float("inf"):
                    wake_s = min(wake_s, decision.wait_s)
            if not ready:
                break
            ready.sort(key=lambda r: r[0])
            _, batcher, entries, idle = ready[0]
            lane = self._choose_lane(batcher, idle)
            self._dispatch(batcher, batcher.take(entries), lane)
        if wake_s != float("inf"):
            at = self.loop.time() + wake_s
            if at < self._timer_at:
                if self._timer is not None:
                    self._timer.cancel()
                self._timer_at = at
                self._timer = self.loop.call_at(at, self._on_timer)

    def _dispatch(self, batcher: Batcher, batch: Batch, lane) -> None:
        job = batcher.runner_for_lane[lane.lane_id](batch)
        self.batches_dispatched += 1
        start_ns = _now_ns()

        def done(result, exc, batch=batch, lane=lane, start_ns=start_ns):
            lane.busy = False
            elapsed = _now_ns() - start_ns
            lane.busy_ns += elapsed
            lane.batches_run += 1
            batcher.in_flight -= 1
            batcher.virtual_ns += elapsed
            try:
                if self.on_batch_done is not None:
                    self.on_batch_done(batch, lane, result, exc)
            except Exception:  # never let bookkeeping break the scheduler
                log.exception("batch completion failed for model %s", batcher.name)
            self.notify()

        lane.submit(job, done)

    def idle(self) -> bool:
        return not any(b.pending or b.in_flight for b in self._batchers)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
