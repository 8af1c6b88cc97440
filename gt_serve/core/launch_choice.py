"""Which way a CPU model's batch of several requests starts: on its lane's thread, or launched from the event loop
into onnxruntime's own pool (`Lane.launch`; issue #17, seventh pass).

A launched run starts at once: the lane thread need not wake up and wait for the GIL, which the loop holds while it
parses and answers (at 64 clients a small model's batch waited 1.5-1.8 ms for a run of 1.2-1.4 ms). The price: the
batch is packed on the loop, and onnxruntime computes a launched run on one thread of its pool, so the run takes
about twice as long on two cores. That pays for a model whose rows are cheap against a request's Python on the
loop (mlp at 64 clients: 1.15x inf/s over HTTP, 1.07x over gRPC; mlp2k 1.11x), and loses for a heavier one (mlp4k:
0.85x; convnet: 0.66x) or one whose batch is many bytes to pack on the loop (a 3x224x224 image model: 0.89x). So a
model starts on its lane, and its batches are launched while its lane runs take less than a bound per row and the
batch's inputs are small (docs/DESIGN-NOTES.md, seventh pass). Lane runs are timed from 8 rows, or from the model's
max_batch_size where that is smaller (a model without config.pbtxt gets 4, as in Triton: launched, such an mlp served
1.15-1.27x the inf/s at 8-64 clients; twenty-fifth pass).
"""
from __future__ import annotations

from typing import Any

MAX_BATCH_BYTES = 512 * 1024  # inputs packed on the loop: ~0.05 ms of copying, as long as a request's Python
# launch while the fastest lane run is under this a row; at 64 clients: mlp ~46-69 and mlp2k ~65 µs (launching won),
# mlp4k ~198 µs (it lost), convnet ~690 µs
ROW_NS = 100_000
_MIN_ROWS = 8  # lane runs of fewer rows are not timed: a run's fixed cost would dominate their time per row (fewer
# for a model whose batches cannot reach 8 rows: those of its max_batch_size are timed)
_SETTLE = 8  # timed lane runs before the choice
_PROBE_EVERY = 256  # launched batches before the lane is timed again, to see whether launching still pays


class LaunchChoice:
    """Per model version, on the loop thread: `fits(batch)` before a dispatch, `ran(batch, launched, elapsed_ns)`
    after. Only lane runs of `min_rows` rows or more are timed (`_MIN_ROWS`, or the model's `max_batch_size` where
    that is smaller and over 1), and the fastest of `_SETTLE` of them decides: a
    run's time includes its waits for the GIL (to start, between its parts, and to hand its outputs over), which
    come and go with the loop's load; the fastest is the nearest to what the model costs. A launched run's time
    says even less (its callback waits for the GIL too: mlp at 64 clients 85-140 µs a row launched against
    28-50 on the lane), so a model launches while its fastest lane run takes less than `row_ns` a row, and after
    `_PROBE_EVERY` launched batches its batches go to the lane until `_SETTLE` more have been timed. With `always`,
    every batch that fits is launched (lanes.launch: always), and nothing is timed."""

    __slots__ = ("row_ns", "always", "launching", "min_rows", "_fastest", "_timed", "_launched")

    def __init__(self, always: bool = False, row_ns: int = ROW_NS, max_batch_size: int = 0) -> None:
        self.row_ns = row_ns
        self.min_rows = min(_MIN_ROWS, max_batch_size) if max_batch_size > 1 else _MIN_ROWS
        self.always = always
        self.launching = always
        self._fastest = 0  # ns per row of the fastest lane run timed since the lane was last chosen
        self._timed = 0  # lane runs timed since then
        self._launched = 0  # batches launched since the last choice

    def fits(self, batch: Any) -> bool:
        """A batch of several requests whose inputs are small enough to pack on the loop. Never one with BYTES
        inputs: an object array's `nbytes` counts its pointers, not its strings, which onnxruntime copies where the
        run starts (the loop, for a launched one)."""
        entries = batch.entries
        if len(entries) < 2:  # one request: inline or on the lane (an error is then the request's own, at once)
            return False
        first = entries[0]
        feeds = first.feeds.values()
        if any(a.dtype.kind == "O" for a in feeds):
            return False
        row_bytes = sum(a.nbytes for a in feeds) // max(1, first.batch_size)
        return row_bytes * batch.size <= MAX_BATCH_BYTES

    def ran(self, batch: Any, launched: bool, elapsed_ns: int) -> None:
        """Count a batch that fitted and ran the current way; time it if it ran on the lane."""
        if launched != self.launching or self.always:  # dispatched before the last switch, or nothing to learn
            return
        if launched:
            self._launched += 1
            if self._launched >= _PROBE_EVERY:
                self.launching, self._timed = False, 0
            return
        if batch.size < self.min_rows:
            return
        per_row = elapsed_ns // batch.size
        self._fastest = per_row if not self._timed else min(self._fastest, per_row)
        self._timed += 1
        if self._timed >= _SETTLE and self._fastest < self.row_ns:
            self.launching, self._launched = True, 0
