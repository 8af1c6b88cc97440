"""Answers released in the order their requests were taken into batches: Triton's `preserve_ordering` (in
`dynamic_batching`, and in `sequence_batching`'s oldest strategy).

A model's batches may finish out of the order they were formed: on several lanes, or one run on the loop's thread
beside one on a lane, or two launched into onnxruntime's pool. A gRPC stream's client then gets its answers out of
the order it sent the requests. With the config's `preserve_ordering`, the model's ModelExecutor notes each batch as
it takes it off the queue (`taken`), and a finished batch's answers (`finished`: the call that sets its futures) wait
for those of every batch taken before it, as Triton's dynamic batcher delegates the responses of the requests it
dequeues. A response-cache hit waits for the batches taken before it (`turn`), as Triton's hits do; where requests
are still queued before it, it runs as a miss to keep its place behind them (response_cache.serve_cached), where
Triton's would overtake them. Requests that time out in the queue, or go away, were never taken: they are answered at
once, as Triton's rejected requests are.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, Callable

log = logging.getLogger(__name__)


class AnswerOrder:
    """The batches of one model taken and not yet answered, oldest first. All methods run on the loop's thread."""

    __slots__ = ("_slots",)

    def __init__(self) -> None:
        self._slots: deque[list] = deque()  # [batch (or a cache hit's future), its release call or None while it runs]

    @property
    def waiting(self) -> bool:
        """Whether a batch taken is not answered yet (a request run at once would overtake it)."""
        return bool(self._slots)

    def taken(self, batch: Any) -> None:
        """`batch` was taken off the queue: its answers come after those of every batch taken before it."""
        self._slots.append([batch, None])

    def finished(self, batch: Any, release: Callable[[], None]) -> None:
        """`batch` has finished: `release` answers it once every batch taken before it is answered (now, if none is
        waiting), and then the batches after it that have finished too. A batch not `taken` is answered now."""
        for slot in self._slots:
            if slot[0] is batch:
                slot[1] = release
                break
        else:
            release()
            return
        slots = self._slots
        while slots and slots[0][1] is not None:
            _, ready = slots.popleft()
            try:
                ready()
            except Exception:  # one batch's bookkeeping must not hold back the answers after it
                log.exception("answers released out of a batch failed")

    def turn(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future | None:
        """A request answered without a batch (a response-cache hit): a future done once every batch taken before it
        is answered, in the same turn of the loop as the batch just before it (None when none is waiting). A client
        that goes away cancels it, and nothing else."""
        if not self._slots:
            return None
        taken = loop.create_future()
        self._slots.append([taken, lambda: taken.done() or taken.set_result(None)])
        return taken
