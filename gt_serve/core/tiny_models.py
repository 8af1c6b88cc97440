"""Tiny models: those whose largest batch runs in a few microseconds (issue #17, thirtieth pass).

An ensemble's pre- and post-processing steps (a Sub/Div of 32 x 256 floats: ~11 µs; a softmax of 32 x 10: ~7), a
random forest's 4 rows (~20 µs) or a 256 x 10 layer's 32 (~15) cost less than handing a batch to another thread and
its answer back (~0.1 ms of CPU and latency at one client). Under load each of their batches held the lane
0.6-0.8 ms, waiting for onnxruntime's pool thread and for the GIL, and their runs on the loop cost ~130 µs of its CPU:
with two intra-op threads a run waits, spinning, for its second thread, which on a busy machine is seldom running.
Measured under load, such a model cannot be told from one that is merely fast: every figure reads several times the
run's own. So it is told once, at load, before it serves: its runner runs a batch of zeros of its largest size a few
times (`probe_ns`, the quickest run; a row first, so that a large model's probe is two runs of one row), while nothing
else of the model runs. A model whose largest batch runs under TINY_RUN_NS is tiny: the host reopens it with one
intra-op thread (unless its config sets the count) and its executor runs every batch on the loop's thread. mlp's 8
rows take ~0.34 ms, its 32 ~0.56; a forest of 100 trees at 32 rows ~0.2.

Only on CPU lanes, only where every input has a fixed shape past the batch dimension and a numeric datatype (zeros
are then a valid request), and never a failure: a model the probe cannot run is simply not tiny.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..datatypes import numpy_dtype
from .sequence_config import hidden_feeds

TINY_RUN_NS = 100_000  # lanes.tiny_run_us's default: the largest batch's quickest run (the lane plan's threads)
PROBE_RUNS = 3
_now_ns = time.perf_counter_ns


def probe_feeds(spec: Any, rows: int | None = None) -> dict[str, np.ndarray] | None:
    """Zeros for each input at `rows` rows, the model's largest batch by default (client dims: the runner applies
    any reshape), or None where a shape past the batch dimension is variable or an input is BYTES."""
    if getattr(spec, "ragged", None) is not None:  # its inputs are flattened and joined by batch inputs: not probed
        return None
    batch = (rows or spec.max_batch_size,) if spec.max_batch_size > 0 else ()
    feeds = {}
    for name, tensor in spec.inputs.items():
        dims = tuple(int(d) for d in tensor.dims)
        if tensor.datatype == "BYTES" or any(d < 0 for d in dims):
            return None
        feeds[name] = np.zeros(batch + dims, dtype=numpy_dtype(tensor.datatype))
    if feeds and spec.sequence is not None:  # a sequence model's controls and states, as its requests get them
        feeds.update(hidden_feeds(spec.sequence, batch[0] if batch else None))
    return feeds or None


def probe_ns(runner: Any, spec: Any, bound_ns: int = TINY_RUN_NS, runs: int = PROBE_RUNS) -> int | None:
    """The quickest of `runs` runs of the model's largest batch of zeros on `runner`, the first run of each size not
    counted (allocations, first-run set-up). One row is timed first, and where it alone takes `bound_ns` or more in
    two timed runs the quicker is the answer (a large model's probe costs three runs of a row). None where the model
    cannot be probed (probe_feeds) or a run fails."""
    outputs = list(spec.output_order)
    try:
        largest = probe_feeds(spec)
        if largest is None:
            return None
        if spec.max_batch_size > 1:
            one = probe_feeds(spec, 1)
            runner.run(one, outputs)
            took = _timed(runner, one, outputs)
            if took >= bound_ns:  # timed again before it counts: one run may have waited for a core
                took = min(took, _timed(runner, one, outputs))
                if took >= bound_ns:
                    return took
        runner.run(largest, outputs)
        return min(_timed(runner, largest, outputs) for _ in range(runs))
    except Exception:  # noqa: BLE001 - zeros the model refuses (or a datatype numpy lacks): not tiny; the load goes on
        return None


def _timed(runner: Any, feeds: dict, outputs: list) -> int:
    start = _now_ns()
    runner.run(feeds, outputs)
    return _now_ns() - start


def is_tiny(runner: Any, spec: Any, bound_ns: int = TINY_RUN_NS) -> bool:
    """Whether the model's largest batch runs in less than `bound_ns` (lanes.tiny_run_us)."""
    took = probe_ns(runner, spec, bound_ns)
    return took is not None and took < bound_ns
