"""Sequences of a stateful model (config `sequence_batching`, core/sequence_config.py), Triton's sequence batcher.

A request names its sequence with the `sequence_id` parameter (a number other than 0, or a non-empty string), and
marks the first and last requests with `sequence_start` and `sequence_end`. Per model version, a `SequenceBook`
keeps the live sequences. A sequence's requests run one at a time and in the order they came (the next waits for the
one before to finish), so a batch never holds two requests of one sequence; requests of different sequences are
batched together by the model's queue, as Triton's Oldest strategy batches them. Each request gets the control
inputs (START, END, READY: true, CORRID) and the implicit states: the initial state on a start, else the state its
sequence's last request returned. Its state outputs are kept for the next request, and are not part of the answer
(unless the config lists them as outputs).

A sequence ends with its END request, or is dropped after `max_sequence_idle_microseconds` without a request (looked
for when a request comes; its state is freed then). A later request without START then gets Triton's error, as does
a request without an id or of more than one row. Every live sequence runs; there are no slots and no backlog, so
`max_candidate_sequences` bounds nothing here (docs/MODEL-CONFIG.md).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import numpy as np

from ..datatypes import numpy_dtype
from ..errors import GtServeError, InvalidArgument
from ..types import InferRequest
from .sequence_config import SequenceSettings

log = logging.getLogger(__name__)
_now_ns = time.monotonic_ns


class _Sequence:
    __slots__ = ("tail", "states", "last_ns", "corrid")

    def __init__(self, tail: asyncio.Future | None, now_ns: int, corrid: dict) -> None:
        self.tail = tail  # the done-future of its last request taken in: the next request waits for it
        self.states: list | None = None  # what its last request returned, in the settings' state order
        self.last_ns = now_ns
        self.corrid = corrid  # its CORRID control's feed (none without one), made once at its START


class SequenceBook:
    """One loaded model version's live sequences (used on the event loop only)."""

    def __init__(self, name: str, spec: Any, executor: Any) -> None:
        self.name = name
        self.settings: SequenceSettings = spec.sequence
        self.executor = executor
        order = spec.output_order
        self.outputs = len(order)  # the client-facing outputs: a run's first outputs; the hidden state outputs follow
        hidden = self.settings.hidden_outputs
        self.state_at = tuple(order.index(s.output_name) if s.output_name in order
                              else len(order) + hidden.index(s.output_name) for s in self.settings.states)
        self._row = (1, 1) if spec.max_batch_size > 0 else (1,)
        # the START, END and READY controls' feeds by (start, end), made once (read-only: packed or fed as they are)
        self._flags_feeds = {(start, end): self._flag_feeds(start, end) for start in (False, True)
                             for end in (False, True)}
        self._live: dict[Any, _Sequence] = {}
        self._swept_ns = 0

    def call(self, request: InferRequest, batch_size: int) -> SequenceCall:
        """Take `request` in its sequence (checked now, in arrival order); its `submit` runs it."""
        sid, start, end = self._flags(request)
        if batch_size > 1:
            raise InvalidArgument(f"inference request to model '{self.name}' must specify batch-size 1 due to "
                                  "requirements of sequence batcher")
        now_ns = _now_ns()
        self._sweep(now_ns)
        seq = self._live.get(sid)
        if start:
            corrid = self._corrid_feeds(sid)  # a correlation ID its CORRID cannot hold is refused before it starts
            if seq is not None:
                log.warning("sequence %s for model '%s' has a conflict: the previous sequence did not end before this "
                            "start, and ends early", sid, self.name)
            seq = self._live[sid] = _Sequence(None if seq is None else seq.tail, now_ns, corrid)
        elif seq is None:
            raise InvalidArgument(f"inference request for sequence {sid} to model '{self.name}' must specify the "
                                  "START flag on the first request of the sequence")
        prev, done = seq.tail, asyncio.get_running_loop().create_future()
        seq.tail, seq.last_ns = done, now_ns
        if end:
            del self._live[sid]
        controls = self._flags_feeds[start, end]
        return SequenceCall(self, seq, {**controls, **seq.corrid} if seq.corrid else controls, start, end, prev, done)

    def _flags(self, request: InferRequest) -> tuple[Any, bool, bool]:
        p = request.parameters
        sid = p.get("sequence_id", 0)
        if isinstance(sid, bool) or not isinstance(sid, (int, str)) or sid == 0 or sid == "":
            raise InvalidArgument(f"inference request to model '{self.name}' must specify a non-zero or non-empty "
                                  "correlation ID")
        flags = [p.get(key, False) for key in ("sequence_start", "sequence_end")]
        for key, value in zip(("sequence_start", "sequence_end"), flags):
            if not isinstance(value, bool):
                raise InvalidArgument(f"parameter '{key}' must be a boolean, got {value!r}")
        return sid, flags[0], flags[1]

    def _sweep(self, now_ns: int) -> None:
        """Drop the sequences idle longer than the model's max_sequence_idle_microseconds (none in flight)."""
        idle_ns = self.settings.idle_ns
        if now_ns - self._swept_ns < idle_ns // 2:
            return
        self._swept_ns = now_ns
        gone = [sid for sid, seq in self._live.items()
                if now_ns - seq.last_ns > idle_ns and (seq.tail is None or seq.tail.done())]
        for sid in gone:
            del self._live[sid]
        if gone:
            log.info("model '%s': %d sequence(s) idle for over %d us dropped", self.name, len(gone), idle_ns // 1000)

    def _flag_feeds(self, start: bool, end: bool) -> dict:
        """The START, END and READY controls of a request (one row) with these flags."""
        feeds = {}
        for c in self.settings.controls:
            if c.flag != "corrid":
                on = {"start": start, "end": end, "ready": True}[c.flag]
                feeds[c.name] = _frozen(np.full(self._row, c.false_true[1 if on else 0], dtype=numpy_dtype(c.datatype)))
        return feeds

    def _corrid_feeds(self, sid: Any) -> dict:
        return {c.name: _frozen(_corrid(sid, c.datatype, self._row, c.name, self.name))
                for c in self.settings.controls if c.flag == "corrid"}


class SequenceCall:
    """One request taken in its sequence: `submit` (the executor's signature) runs it after the one before."""

    __slots__ = ("book", "seq", "controls", "start", "end", "prev", "done")

    def __init__(self, book: SequenceBook, seq: _Sequence, controls: dict, start: bool, end: bool,
                 prev: asyncio.Future | None, done: asyncio.Future) -> None:
        self.book, self.seq, self.controls, self.start, self.end = book, seq, controls, start, end
        self.prev, self.done = prev, done

    async def submit(self, feeds: dict, batch_size: int, shape_key: tuple, priority: int = 0,
                     deadline_s: float | None = None, *trace) -> list:
        """The request's outputs (client-facing, model order), once its sequence's request before it finished."""
        prev = self.prev
        try:
            if prev is not None and not prev.done():
                await asyncio.shield(prev)
            prev = None  # finished: this request's end releases the next at once
            book, seq = self.book, self.seq
            feeds = {**feeds, **self.controls}
            states = book.settings.states
            held = None if self.start else seq.states
            for i, state in enumerate(states):
                feeds[state.input_name] = state.initial if held is None else held[i]
            if any(s.variable for s in states):  # rows of one batch must have states of one shape
                shape_key = (shape_key, tuple(feeds[s.input_name].shape for s in states))
            outputs = await book.executor.submit(feeds, batch_size, shape_key, priority, deadline_s, *trace)
            if states and not self.end:
                seq.states = [np.array(outputs[i]) for i in book.state_at]
            return outputs[:book.outputs]
        finally:
            _release(self.done, prev)


def _release(done: asyncio.Future, prev: asyncio.Future | None) -> None:
    """Let the sequence's next request run: now, or (this one cancelled while it waited) when the one before ends."""
    if prev is None or prev.done():
        if not done.done():
            done.set_result(None)
    else:
        prev.add_done_callback(lambda _: done.done() or done.set_result(None))


def _frozen(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


def _corrid(sid: Any, datatype: str, row: tuple, control: str, model: str) -> np.ndarray:
    if datatype == "BYTES":
        return np.full(row, str(sid).encode(), dtype=object)
    if isinstance(sid, str):
        raise InvalidArgument(f"sequence_id '{sid}' is a string, but model '{model}' takes the correlation ID as "
                              f"{datatype} (control input '{control}')")
    dtype = numpy_dtype(datatype)
    info = np.iinfo(dtype)
    if not info.min <= sid <= info.max:
        raise InvalidArgument(f"sequence_id {sid} does not fit {datatype}: model '{model}' takes the correlation ID "
                              f"as {datatype} (control input '{control}')")
    return np.full(row, sid, dtype=dtype)


def held_here(registry: Any, request: InferRequest) -> bool:
    """Whether `request` is of a sequence of a sequence model loaded here, whose state is here: the fleet does not
    route it (a stateless model's request that names a sequence is routed as any)."""
    if "sequence_id" not in request.parameters:
        return False
    try:
        model = registry.get(request.model_name, request.model_version)
    except GtServeError:
        return False
    return model.spec.sequence is not None


def sequence_call(model: Any, request: InferRequest, batch_size: int) -> SequenceCall:
    """`request` to a sequence model taken in its sequence (the model's book made at its first request)."""
    book = model.sequences
    if book is None:
        book = model.sequences = SequenceBook(model.name, model.spec, model.executor)
    return book.call(request, batch_size)
