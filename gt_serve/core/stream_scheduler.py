"""Puts formed batches onto lanes: per-lane slots, priorities, weighted fair share between models.

Event-driven on the loop: a submit or a finished batch schedules one `pump`; a model waiting out
its queue delay arms one timer. A hot model cannot starve a cold one: among models with a batch
ready, the one with the least weighted compute time served goes first.

The scheduler reads each executor's queue and its lanes' `busy` flags and calls
`executor.dispatch(entries, lane)`; it writes no lane or queue state itself. A lane busy with
one launched batch only is `spare`: it takes one more of a model that launches its batches
(`executor.launches_more`), if that batch is full (`executor.full`). The executor tells it
when a batch came back (`finished`), which charges the model's fair share and pumps again. With the rate limiter on
(core/rate_limiter.py), a lane is a model's to take only while the limiter `allows` it; the batch holds its resources
from dispatch until it is back.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from .batch_policy import form_batch
from .batcher import Entry
from .model_executor import ModelExecutor
from .rate_limiter import RateLimiter

log = logging.getLogger(__name__)
_now_ns = time.monotonic_ns
_NEVER = float("inf")

# choose_lane(executor, idle_lanes) -> lane; the router plugs in here
LaneChooser = Callable[[ModelExecutor, list], object]


class StreamScheduler:
    def __init__(self, loop: asyncio.AbstractEventLoop, lanes: list, *, choose_lane: LaneChooser | None = None,
                 limiter: RateLimiter | None = None) -> None:
        self.loop = loop
        self.limiter = limiter  # None: the rate limiter is off
        self.lanes = lanes
        self._executors: list[ModelExecutor] = []
        self._virtual_ns: dict[ModelExecutor, float] = {}  # compute time served per executor (fair share)
        self._pump_scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = _NEVER
        self._choose_lane = choose_lane or (lambda executor, idle: idle[0])
        self.batches_dispatched = 0

    def register(self, executor: ModelExecutor) -> None:
        # a newcomer starts at the current minimum so it neither starves others nor is starved
        self._virtual_ns[executor] = min(self._virtual_ns.values(), default=0.0)
        self._executors.append(executor)
        if self.limiter is not None:
            self.limiter.register(executor, getattr(executor, "rate_needs", None) or {})

    def unregister(self, executor: ModelExecutor) -> None:
        if executor in self._virtual_ns:
            del self._virtual_ns[executor]
            self._executors.remove(executor)
        if self.limiter is not None:
            self.limiter.unregister(executor)

    def notify(self) -> None:
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self.loop.call_soon(self._pump)

    def finished(self, executor: ModelExecutor, elapsed_ns: int, lane: object = None) -> None:
        """One of `executor`'s batches came back after `elapsed_ns` on its lane: its lane takes the next batch now,
        not after the answers of this one (up to a few ms of the loop's time at 32 requests a batch). `lane`: the
        dispatched batch's, whose rate-limiter resources it gives back (None: a request run at once held none)."""
        if lane is not None and self.limiter is not None:
            self.limiter.release(executor, lane)
        if executor in self._virtual_ns:
            self._virtual_ns[executor] += elapsed_ns
        self._pump()

    def lone_lane(self, executor: ModelExecutor) -> object | None:
        """The lane `_pump` would give a lone one-row request of `executor`'s at once, were it queued now: None while
        a pump is due (what was queued meanwhile must be decided first), when every lane of `executor` is busy, or
        when its batch policy would wait for more (ModelExecutor.run_now)."""
        if self._pump_scheduled:
            return None
        idle = self._idle(executor)
        if not idle or not form_batch((1,), 0.0, 0.0, len(idle), executor.batcher.cfg).take:
            return None
        return self._choose_lane(executor, idle)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = _NEVER
        self._pump()

    def _pump(self) -> None:
        self._pump_scheduled = False
        now_ns = _now_ns()
        wake_s = _NEVER
        while True:
            ready, wait_s = self._next_batch(now_ns)
            wake_s = min(wake_s, wait_s)
            if ready is None:
                break
            executor, entries, idle = ready
            self.batches_dispatched += 1
            lane = self._choose_lane(executor, idle)
            if self.limiter is not None:
                self.limiter.acquire(executor, lane)
            executor.dispatch(entries, lane)
        if wake_s != _NEVER:
            self._arm_timer(self.loop.time() + wake_s)

    def _next_batch(self, now_ns: int) -> tuple[tuple[ModelExecutor, list[Entry], list] | None, float]:
        """The batch to run next (the least-served model with one ready), and how long until another may be. Idle
        lanes first; then a spare one (`_spare_batch`)."""
        best, best_key, wake_s = None, _NEVER, _NEVER
        virtual = self._virtual_ns
        blocked: list[ModelExecutor] = []  # models with requests and no idle lane
        for executor in self._executors:
            batcher = executor.batcher
            if not batcher.pending:
                continue
            idle = self._idle(executor)
            if not idle:  # every lane busy (or its resources held): the next finish pumps again (no scan per submit)
                blocked.append(executor)
                continue
            decision, head = batcher.decide(now_ns, len(idle))
            if decision.take:
                key = virtual[executor] / executor.weight
                if best is None or key < best_key:
                    best, best_key = (executor, head[:decision.take], idle), key
            elif decision.wait_s < wake_s:
                wake_s = decision.wait_s
        if best is None and blocked:
            best = self._spare_batch(blocked, now_ns)
        return best, wake_s

    def _spare_batch(self, blocked: list[ModelExecutor], now_ns: int) -> tuple[ModelExecutor, list[Entry], list] | None:
        """A full batch for a lane busy with launched runs only (`Lane.spare`), of the least-served model that launches
        its batches (`launches_more`, `full`). Never a lane that a model which does not launch waits for: a model
        that always has a full batch would keep the lane busy, and that one would wait for ever."""
        best, best_key, waited_for = None, _NEVER, None
        for executor in blocked:
            spare = [lane for lane in executor.lanes if lane.spare and self._allows(executor, lane)]  # mostly none
            if not spare or not executor.launches_more:
                continue
            if waited_for is None:
                waited_for = {lane for other in blocked if not other.launches_more for lane in other.lanes}
            spare = [lane for lane in spare if lane not in waited_for]
            if not spare:
                continue
            decision, head = executor.batcher.decide(now_ns, len(spare))
            key = self._virtual_ns[executor] / executor.weight
            if decision.take and executor.full(head[:decision.take]) and (best is None or key < best_key):
                best, best_key = (executor, head[:decision.take], spare), key
        return best

    def _idle(self, executor: ModelExecutor) -> list:
        """`executor`'s lanes that are idle and, with the rate limiter on, whose device has its resources free."""
        limiter = self.limiter
        if limiter is None:
            return [lane for lane in executor.lanes if not lane.busy]
        return [lane for lane in executor.lanes if not lane.busy and limiter.allows(executor, lane)]

    def _allows(self, executor: ModelExecutor, lane: object) -> bool:
        return self.limiter is None or self.limiter.allows(executor, lane)

    def _arm_timer(self, at: float) -> None:
        if at < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = at
            self._timer = self.loop.call_at(at, self._on_timer)

    def idle(self) -> bool:
        return not any(e.pending or e.in_flight for e in self._executors)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
