"""Whether a CPU model's small batches of several requests run on the event loop's thread or the way they go
otherwise: the lane's thread, or launched into onnxruntime's pool where the model's batches are (issue #17,
seventeenth pass; launched since the twenty-eighth: a tree ensemble's batches of 4 rows, ~15 us of compute in raw
onnxruntime, were all launched; on the loop they served 1.4-2.2x the inf/s at 0.5-0.7x the CPU).

Run on the loop (`Lane.run_here`), a small batch of a fast model saves the hand-off to the lane thread and back (two
thread wake-ups, the GIL passed both ways): mlp at 4 perf_analyzer clients took 0.78x the server's CPU per inference
over HTTP and 0.69x over gRPC, at 1.3x the inferences per second. But the loop then computes instead of reading, and
once it is the busiest thread, requests that would have gathered while the lane computed come in smaller batches:
mlp at 8 clients ran 2.0 rows a batch on the loop against 3.7 through the lane, at 1.10x the CPU per inference.
Which side of that a model is on depends on its clients, its run time and the machine, so it is measured, not
guessed: the process's CPU time per row the model served, over windows of its small batches, one way and then the
other; the cheaper way runs, and the other is measured again now and then.
"""
from __future__ import annotations

import time
from typing import Callable

WINDOW = 128  # small batches per measured window
_STAY = 16  # windows the chosen way runs before the other is measured again, after a switch;
_STAY_MAX = 256  # doubled each time the other loses, up to this (at 8 clients the loop's 3 windows in 19 cost 3 %)
_SETTLE = 1  # windows after a switch that are not measured: the clients' timing still follows the other way's
_MEASURE = 2  # windows whose mean is a way's cost
_MARGIN = 0.97  # the way just measured takes over when its CPU per row is under this share of the chosen way's


class InlineChoice:
    """Per model version, on the loop thread: `counted(rows, small)` for every batch the model dispatches, before
    it runs; `inline` says which way the small ones go. Small batches run on the loop for `_STAY` windows, then on
    the lane for `_SETTLE + _MEASURE`; the cheaper way (by the mean CPU per row of each way's last `_MEASURE`
    windows) runs the next `_STAY`, or twice as many as last time when it was already the chosen one, and so on.
    The first window after a switch is not measured: at 8 clients the first window on the loop after a stretch on
    the lane read 0.75-0.8x the CPU per row that the loop's later windows read, as the requests still came in the
    lane's larger batches. The clock is the whole process's CPU:
    another model's load falls into both ways' windows alike."""

    __slots__ = ("inline", "_clock", "_chosen", "_costs", "_start", "_rows", "_small", "_windows", "_probing",
                 "_stay")

    def __init__(self, clock: Callable[[], int] = time.process_time_ns) -> None:
        self.inline = True
        self._clock = clock
        self._chosen = 0.0  # CPU ns per row of the chosen way, when the other began to be measured
        self._costs: list[float] = []  # CPU ns per row of the current way's last measured windows
        self._start = clock()
        self._rows = 0  # rows dispatched in the current window, small batches or not
        self._small = 0  # small batches dispatched in it
        self._windows = 0  # windows since the last switch
        self._probing = False  # the current way is being measured against the chosen one
        self._stay = _STAY  # windows of the chosen way before the next measure of the other

    def counted(self, rows: int, small: bool) -> None:
        """A batch of `rows` rows dispatched; `small`: one this choice decides (inline or to the lane)."""
        self._rows += rows
        if small:
            self._small += 1
            if self._small >= WINDOW:
                self._close()

    def _close(self) -> None:
        now = self._clock()
        cost = (now - self._start) / max(1, self._rows)
        self._start, self._rows, self._small = now, 0, 0
        self._windows += 1
        if self._windows > _SETTLE:
            self._costs = (self._costs + [cost])[-_MEASURE:]
        if self._probing:
            if len(self._costs) == _MEASURE:
                self._probing = False
                if sum(self._costs) / _MEASURE < _MARGIN * self._chosen:
                    self._stay = _STAY  # the way just measured is chosen now
                else:
                    self._switch()  # the chosen way stays chosen, and is measured against the other less often
                    self._stay = min(2 * self._stay, _STAY_MAX)
        elif self._windows >= self._stay:
            self._chosen = sum(self._costs) / len(self._costs)
            self._probing = True
            self._switch()

    def _switch(self) -> None:
        self.inline = not self.inline
        self._windows, self._costs = 0, []
