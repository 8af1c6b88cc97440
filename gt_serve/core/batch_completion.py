"""What a finished batch becomes: resolved request futures, per-batch statistics, energy.

Runs on the event loop, called by the model's ModelExecutor when its lane hands a batch back.
Statistics and energy are charged once per batch; per request there is only its future and its
latency sample. A model whose config asks to preserve the order of its answers has an AnswerOrder: a batch's futures
are then resolved once those of the batches taken before it are.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from ..errors import Internal
from .answer_order import AnswerOrder
from .batcher import Batch, Entry
from .statistics import ModelStats

_now_ns = time.monotonic_ns

# energy_observer(model, device, batch_size, latency_s) -> energy per request (J); e.g. NodeEnergy.on_batch
EnergyObserver = Callable[[str, str, int, float], float]


class BatchCompletion:
    """Completion handling of one model version; built with everything it writes to."""

    __slots__ = ("model_name", "stats", "_observe_energy", "order")

    def __init__(self, model_name: str, stats: ModelStats, energy_observer: EnergyObserver | None = None,
                 order: AnswerOrder | None = None) -> None:
        """`order`: the model's (its config's preserve_ordering), which its executor tells of each batch it takes."""
        self.model_name = model_name
        self.stats = stats
        self._observe_energy = energy_observer
        self.order = order

    def resolve(self, batch: Batch, lane: Any, result: Any, exc: BaseException | None) -> None:
        """`result` is a job's (per-request outputs, (input_ns, infer_ns, output_ns)); `exc` what it raised. With an
        AnswerOrder, once the batches taken before it are answered."""
        if self.order is None:
            self._resolve(batch, lane, result, exc)
        else:
            self.order.finished(batch, lambda: self._resolve(batch, lane, result, exc))

    def _resolve(self, batch: Batch, lane: Any, result: Any, exc: BaseException | None) -> None:
        if exc is not None:
            self.fail(batch.entries, self.run_failed(lane, exc))
            return
        per_request, (input_ns, infer_ns, output_ns) = result
        self._charge(batch, lane, per_request, input_ns, infer_ns, output_ns)
        now_ns = _now_ns()
        record_success = self.stats.record_success
        for e, outputs in zip(batch.entries, per_request):
            if e.future.done():  # timed out or went away while the batch ran
                continue
            if isinstance(outputs, BaseException):  # re-run alone after a failed batch run, and failed
                e.future.set_exception(self.run_failed(lane, outputs))
            else:
                e.future.set_result(outputs)
                record_success(now_ns - e.arrival_ns, e.dispatch_ns - e.arrival_ns)

    def lone(self, lane: Any, result: Any, exc: BaseException | None) -> list:
        """The outputs of a batch of one request run at once (ModelExecutor.run_now), or the error (raised) that its
        future would have got; charged by `lone_books`."""
        if exc is not None:
            raise self.run_failed(lane, exc)
        outputs = result[0][0]
        if isinstance(outputs, BaseException):
            raise self.run_failed(lane, outputs)
        return outputs

    def lone_books(self, batch: Batch, lane: Any, result: Any, exc: BaseException | None, done_ns: int) -> None:
        """`lone`'s batch charged as `resolve` charges one (its request answered at `done_ns`)."""
        if exc is not None:
            return
        per_request, (input_ns, infer_ns, output_ns) = result
        self._charge(batch, lane, per_request, input_ns, infer_ns, output_ns)
        if not isinstance(per_request[0], BaseException):
            self.stats.record_success(done_ns - batch.entries[0].arrival_ns, 0)

    def _charge(self, batch: Batch, lane: Any, per_request: Sequence, input_ns: int, infer_ns: int,
                output_ns: int) -> None:
        """Per-batch statistics (requests that failed alone are not counted) and energy."""
        entries = batch.entries
        failed = [isinstance(o, BaseException) for o in per_request]
        ok_size = batch.size - sum(e.batch_size for e, f in zip(entries, failed) if f)
        if ok_size:
            self.stats.record_batch(ok_size, input_ns, infer_ns, output_ns, len(entries) - sum(failed))
        if self._observe_energy is not None:
            per_sample_j = self._observe_energy(self.model_name, lane.device, batch.size, infer_ns / 1e9)
            self.stats.energy_j += per_sample_j * batch.size

    @staticmethod
    def fail(entries: Sequence[Entry], error: BaseException) -> None:
        for e in entries:
            if not e.future.done():
                e.future.set_exception(error)

    def run_failed(self, lane: Any, exc: BaseException) -> Internal:
        return Internal(f"model '{self.model_name}': inference failed on lane {lane.lane_id}: "
                        f"{type(exc).__name__}: {exc}")
