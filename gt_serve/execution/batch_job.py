"""The work a lane does for one batch: pack the requests' inputs, run the session, split the outputs.

Runs in the lane's thread. Timings are returned so statistics are kept per batch, not per request.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

_now_ns = time.perf_counter_ns
# a batch input of fewer bytes is packed into a new array, not a pooled buffer: malloc's heap serves one for less than
# a loan costs (24 inputs of a few values each, batches of 8: 0.48x the packing time); large ones keep the pool, where
# steady state allocates nothing
SMALL_PACK_BYTES = 64 << 10
# per onnxruntime pool thread: when its last launched run's callback ended. A run launched while the thread was busy
# waited in the pool's queue until then, and its compute time counts from there (two launched on a lane: Lane.spare)
_pool_thread = threading.local()


class BatchJob:
    """Callable bound to one batch; returns (per-request outputs, (input_ns, infer_ns, output_ns))."""

    __slots__ = ("runner", "backend", "pool", "feeds_list", "counts", "input_order", "output_names")

    def __init__(self, runner: Any, backend: Any, feeds_list: Sequence[dict], counts: Sequence[int],
                 input_order: Sequence[str], output_names: list[str], pool: Any = None) -> None:
        self.runner = runner
        self.pool = pool
        self.backend = backend
        self.feeds_list = feeds_list
        self.counts = counts
        self.input_order = input_order
        self.output_names = output_names

    @property
    def launchable(self) -> bool:
        """Whether `start` may run this job (Lane.launch): its runner can start a run in onnxruntime's pool."""
        return getattr(self.runner, "runs_async", False)

    def __call__(self):
        t0 = _now_ns()
        loans: list = []
        feeds = self._feeds(loans)
        t1 = _now_ns()
        try:
            outputs = self.runner.run(feeds, self.output_names)
        except Exception:
            if len(self.feeds_list) == 1:
                raise
            outputs = None  # one request spoilt the batch: find it below
        finally:
            for loan in loans:  # onnxruntime has copied or finished with the inputs
                loan.release()
        if outputs is None:
            return self._one_by_one(t0, t1)
        try:
            return self._split(outputs, t0, t1)
        except Exception:
            if len(self.feeds_list) == 1:
                raise
            return self._one_by_one(t0, t1)  # outputs that cannot be split back (a ragged model's): find whose

    def start(self, finish: Callable[[Any, BaseException | None], None], retry: Callable[[Callable], None]) -> None:
        """The job without a thread of its own (`Lane.launch`): pack on the calling thread, start the run in
        onnxruntime's pool (`runner.run_async`) and return. `finish(result, None)`, with what calling the job
        returns, comes from onnxruntime's thread; a failed batch of several requests goes to `retry(job)`, a job
        that runs them one at a time, as `__call__` would (on a lane thread, not in onnxruntime's callback), and a
        failed request alone to `retry(self)`, so that its error is the one `__call__` raises."""
        t0 = _now_ns()
        loans: list = []

        def ran(outputs: list | None, exc: BaseException | None) -> None:
            for loan in loans:
                loan.release()
            if exc is None:
                try:
                    result = self._split(outputs, t0, t1, getattr(_pool_thread, "free_ns", 0))
                except Exception as e:  # noqa: BLE001 - nothing may escape into onnxruntime's thread
                    if len(self.feeds_list) == 1:
                        finish(None, e)
                    else:  # outputs that cannot be split back: each request alone, on a lane thread
                        retry(lambda: self._one_by_one(t0, t1))
                else:
                    finish(result, None)
            elif len(self.feeds_list) == 1:  # run again as the lane thread runs it: onnxruntime's callback gives
                retry(self)  # only the message, and the request's error must read as that run's (status and all)
            else:
                retry(lambda: self._one_by_one(t0, t1))
            _pool_thread.free_ns = _now_ns()

        feeds = self._feeds(loans)
        t1 = _now_ns()
        try:
            self.runner.run_async(feeds, self.output_names, ran)
        except Exception as exc:  # refused before it started
            ran(None, exc)

    def _feeds(self, loans: list) -> dict:
        """The batch's inputs: one request's own, or the requests' packed (into pooled buffers, in `loans`)."""
        feeds_list = self.feeds_list
        if len(feeds_list) == 1:
            return feeds_list[0]
        return {name: self._pack([f[name] for f in feeds_list], loans) for name in feeds_list[0]}

    def _split(self, outputs: list, t0: int, t1: int, run_ns: int = 0):
        """(per-request outputs, (input_ns, infer_ns, output_ns)) of a batch packed from t0 to t1 whose run computed
        from `run_ns` (t1 unless later)."""
        t2 = _now_ns()
        if len(self.feeds_list) == 1:
            per_request = [outputs]
        else:
            splits = [self.backend.scatter(out, self.counts) for out in outputs]
            per_request = [[s[i] for s in splits] for i in range(len(self.feeds_list))]
        return per_request, (t1 - t0, t2 - max(t1, run_ns), _now_ns() - t2)

    def _one_by_one(self, t0: int, t1: int):
        """The batch run failed: run each request alone, so that only the requests that fail get
        an error. A failed request's slot in the result holds its exception instead of outputs."""
        per_request: list = []
        for feeds, count in zip(self.feeds_list, self.counts):
            try:
                per_request.append(self._run_alone(feeds, count))
            except Exception as exc:  # noqa: BLE001 - handed to this request's future
                per_request.append(exc)
        return per_request, (t1 - t0, _now_ns() - t1, 0)

    def _run_alone(self, feeds: dict, count: int) -> list:
        """One request's outputs, run by itself (`_one_by_one`)."""
        return self.runner.run(feeds, self.output_names)

    def _pack(self, arrays: list, loans: list, pack=None):
        """Pack (with `pack`, default the backend's) into a pooled buffer (steady state allocates
        nothing); object arrays are packed plainly, and so are the backend's small ones (SMALL_PACK_BYTES; the
        bound path's staging, given its `pack`, keeps the pool's pinned buffers)."""
        first = arrays[0]
        if pack is None:
            pack = self.backend.pack
            if first.dtype != object and sum([a.nbytes for a in arrays]) < SMALL_PACK_BYTES:
                return pack(arrays)
        if self.pool is None or first.dtype == object:
            return pack(arrays)
        rows = sum(a.shape[0] for a in arrays)
        shape = (rows, *first.shape[1:])
        loan = self.pool.acquire(shape=shape, dtype=first.dtype)
        loans.append(loan)
        return pack(arrays, out=loan.array(shape, first.dtype))


class RaggedBatchJob(BatchJob):
    """A batch of a model with ragged batching: its settings (core/ragged.RaggedSettings) build the model's inputs
    (ragged inputs flattened and joined, batch inputs made; a lone request's too) and split its outputs."""

    __slots__ = ("ragged",)

    def __init__(self, ragged: Any, runner: Any, backend: Any, feeds_list: Sequence[dict], counts: Sequence[int],
                 input_order: Sequence[str], output_names: list[str], pool: Any = None) -> None:
        super().__init__(runner, backend, feeds_list, counts, input_order, output_names, pool)
        self.ragged = ragged

    def _feeds(self, loans: list) -> dict:
        return self.ragged.feeds(self.feeds_list, lambda arrays: self._pack(arrays, loans))

    def _split(self, outputs: list, t0: int, t1: int, run_ns: int = 0):
        t2 = _now_ns()
        per_request = self.ragged.split(outputs, self.output_names, self.feeds_list, self.counts)
        return per_request, (t1 - t0, t2 - max(t1, run_ns), _now_ns() - t2)

    def _run_alone(self, feeds: dict, count: int) -> list:
        outputs = self.runner.run(self.ragged.feeds([feeds], np.concatenate), self.output_names)
        return self.ragged.split(outputs, self.output_names, [feeds], [count])[0]


class SimpleArrayBackend:
    """Minimal pack/scatter used until a kernel backend is injected (same signatures as NumpyBackend)."""

    name = "numpy"

    @staticmethod
    def pack(arrays: Sequence[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        return np.concatenate(arrays, axis=0, out=out)

    @staticmethod
    def scatter(batch: np.ndarray, counts: Sequence[int], copy: bool = False) -> list[np.ndarray]:
        out, offset = [], 0
        for n in counts:
            out.append(batch[offset:offset + n])
            offset += n
        return out
