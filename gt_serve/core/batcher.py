"""Per-model queue: bounded, one Future per request, deadlines, priorities (a queue policy per priority level).

The batcher only queues and forms batches (with batch_policy.form_batch). It is complete when
constructed: `wake` (the StreamScheduler's `notify`) is passed in and called after each submit; it
knows no lane or runner. Its ModelExecutor owns it and resolves the futures when a batch returns;
the scheduler decides when and on which lane a formed batch runs.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..errors import DeadlineExceeded, QueueFull, Unavailable
from .batch_policy import BatchConfig, BatchDecision, form_batch

_now_ns = time.monotonic_ns
_ANSWERING = 2**63  # the answered clients' window, while their answers are being written: it opens when they are out
_NEVER = float("inf")


@dataclass(frozen=True)
class QueuePolicy:
    max_queue_size: int = 0  # 0 = unbounded (still capped by the server limit)
    default_timeout_s: float = 0.0
    allow_timeout_override: bool = True
    reject_on_timeout: bool = True  # Triton's timeout_action REJECT (DELAY keeps the request queued)


class Entry:
    """One queued request."""

    __slots__ = ("feeds", "batch_size", "shape_key", "arrival_ns", "future", "timer", "dispatch_ns", "context")

    def __init__(self, feeds: dict, batch_size: int, shape_key: tuple, future: asyncio.Future, context: Any) -> None:
        self.feeds = feeds
        self.batch_size = batch_size
        self.shape_key = shape_key
        self.arrival_ns = _now_ns()
        self.future = future
        self.timer = None
        self.dispatch_ns = 0
        self.context = context


class Batch:
    """Requests taken from the queue to run together; `size` is their total batch size; `traced`: some
    entry's context is a request trace (core/trace_context.py) to be told how the batch ran; `inline`: its
    executor ran it on the event loop's thread; `launch`: None, or whether it fitted its model's LaunchChoice and
    was launched into onnxruntime's pool (True) or ran on its lane's thread (False)."""

    __slots__ = ("entries", "size", "traced", "inline", "launch")

    def __init__(self, entries: list[Entry], size: int, traced: bool = False) -> None:
        self.entries = entries
        self.size = size
        self.traced = traced
        self.inline = False
        self.launch: bool | None = None


class Batcher:
    """Queue for one model version. All methods run on the event loop thread."""

    def __init__(self, name: str, batch_cfg: BatchConfig, queue_policy: QueuePolicy, *, wake: Callable[[], None],
                 priority_levels: int = 0, default_priority: int = 0,
                 level_policies: Mapping[int, QueuePolicy] | None = None,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        """`queue_policy`: each priority level's, but those of `level_policies` (Triton's default_queue_policy and
        priority_queue_policy); a level's max_queue_size bounds the requests queued at that level, as in Triton."""
        self.name = name
        self.cfg = batch_cfg
        self.levels = max(1, priority_levels)
        self.policies = [(level_policies or {}).get(level, queue_policy) for level in range(1, self.levels + 1)]
        self.default_priority = default_priority if 1 <= default_priority <= self.levels else (self.levels + 1) // 2
        self._queues: list[deque[Entry]] = [deque() for _ in range(self.levels)]
        self.pending = 0
        self.closed: str | None = None  # why submissions are refused (the model is unloading)
        self._loop = loop
        self._wake = wake  # StreamScheduler.notify: a batch may be ready
        # requests answered whose clients have not sent another yet, expected for the model's queue delay
        # (`return_window_ns`): a batch whose first request came, or waited, in that time waits for them while a lane
        # is idle (`decide`), within the delay from the answer
        self.returning = 0
        self._returning_until_ns = 0
        self.return_window_ns = int(batch_cfg.max_queue_delay_s * 1e9) if batch_cfg.max_batch_size > 0 else 0

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop its futures belong to: the one it was given, else the running one (asyncio's
        get_running_loop makes a getpid system call each time)."""
        return self._loop or asyncio.get_running_loop()

    # -- submit (hot path) ----------------------------------------------------------------------
    def submit(self, feeds: dict, batch_size: int, shape_key: tuple, priority: int = 0,
               deadline_s: float | None = None, context: Any = None) -> asyncio.Future:
        if self.closed is not None:
            raise Unavailable(self.closed)
        level = priority if 1 <= priority <= self.levels else self.default_priority
        policy, queue = self.policies[level - 1], self._queues[level - 1]
        if policy.max_queue_size and len(queue) >= policy.max_queue_size:
            raise QueueFull(f"model '{self.name}': queue is full ({policy.max_queue_size} requests"
                            f"{f' at priority level {level}' if self.levels > 1 else ''}); retry later")
        loop = self.loop
        future = loop.create_future()
        entry = Entry(feeds, batch_size, shape_key, future, context)
        queue.append(entry)
        self.pending += 1
        if self.returning:
            self.returning -= 1
        timeout_s = policy.default_timeout_s
        if deadline_s is not None and (policy.allow_timeout_override or not timeout_s):
            entry.timer = loop.call_at(loop.time() + max(0.0, deadline_s - time.monotonic()), self._expire, entry,
                                       policy)
        elif timeout_s > 0:
            entry.timer = loop.call_later(timeout_s, self._expire, entry, policy)
        self._wake()
        return future

    def answered(self, requests: int, now_ns: int | None) -> None:
        """`requests` were answered (or are about to be): their clients may send their next ones soon (0: none is
        waited for). Set, not added: a client that went away is expected for one window at most. `now_ns` None: their
        answers are still being written, and the window opens when they are out (`answers_out`)."""
        if self.return_window_ns:
            self.returning = min(requests, self.cfg.max_batch_size)
            self._returning_until_ns = _ANSWERING if now_ns is None else now_ns + self.return_window_ns

    def answers_out(self, now_ns: int) -> None:
        """The answers `answered(requests, None)` announced were written: the clients are expected back within the
        queue delay from now (unless another answer has set the window since)."""
        if self._returning_until_ns == _ANSWERING:
            self._returning_until_ns = now_ns + self.return_window_ns
            if self.pending:
                self._wake()

    def close(self, reason: str) -> None:
        """Refuse new requests with Unavailable(reason); what is queued stays (drained or failed)."""
        self.closed = reason

    def _expire(self, entry: Entry, policy: QueuePolicy) -> None:
        if entry.dispatch_ns or entry.future.done():
            return
        if not policy.reject_on_timeout:
            return
        waited_ms = (_now_ns() - entry.arrival_ns) / 1e6
        entry.future.set_exception(DeadlineExceeded(
            f"model '{self.name}': request timed out in the queue after {waited_ms:.1f} ms"))
        # removed lazily when the batch is formed

    # -- batch formation (scheduler, through the executor) ----------------------------------------
    def _compatible_head(self, limit: int) -> list[Entry]:
        """Live queued entries in priority order that can share one batch with the first one."""
        out: list[Entry] = []
        key = None
        for q in self._queues:
            while q and q[0].future.done():  # timed out or cancelled by the client
                q.popleft()
                self.pending -= 1
            for entry in q:
                if entry.future.done():
                    continue
                if key is None:
                    key = entry.shape_key
                elif entry.shape_key != key:
                    return out
                out.append(entry)
                if len(out) >= limit:
                    return out
        return out

    def decide(self, now_ns: int, idle_lanes: int) -> tuple[BatchDecision, list[Entry]]:
        limit = max(1, self.cfg.max_batch_size) if self.cfg.max_batch_size > 0 else 1
        head = self._compatible_head(limit + 1)
        if not head:
            self.pending = sum(len(q) for q in self._queues)
            return BatchDecision(0, float("inf")), head
        oldest_ns = min(e.arrival_ns for e in head)
        # the first of them came (or waited) before the answered clients' window ended: the others are waited for
        until_ns = self._returning_until_ns
        returning = self.returning if oldest_ns < until_ns else 0
        answered_s = _NEVER if until_ns == _ANSWERING else (until_ns - self.return_window_ns) / 1e9
        decision = form_batch([e.batch_size for e in head], oldest_ns / 1e9, now_ns / 1e9, idle_lanes, self.cfg,
                              returning, answered_s)
        return decision, head

    def take(self, entries: list[Entry]) -> Batch:
        taken = set(map(id, entries))
        size = 0
        traced = False
        now = _now_ns()
        for q in self._queues:
            if not taken:
                break
            kept = deque()
            while q:
                e = q.popleft()
                if id(e) in taken:
                    taken.discard(id(e))
                    e.dispatch_ns = now
                    size += e.batch_size
                    if e.context is not None:
                        traced = True
                    if e.timer is not None:
                        e.timer.cancel()
                    if not taken:
                        break
                else:
                    kept.append(e)
            if kept:
                q.extendleft(reversed(kept))
        self.pending -= len(entries)
        return Batch(entries, size, traced)

    def purge_done(self) -> None:
        """Drop entries whose futures are already done (timed out, cancelled) and recount."""
        for i, q in enumerate(self._queues):
            if any(e.future.done() for e in q):
                self._queues[i] = deque(e for e in q if not e.future.done())
        self.pending = sum(len(q) for q in self._queues)

    def fail_all(self, exc: BaseException) -> int:
        n = 0
        for q in self._queues:
            while q:
                e = q.popleft()
                if not e.future.done():
                    e.future.set_exception(exc)
                    n += 1
                if e.timer is not None:
                    e.timer.cancel()
        self.pending = 0
        return n
