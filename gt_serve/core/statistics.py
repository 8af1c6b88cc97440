"""Per model-version statistics in Triton's statistics-extension shape (PROTOCOL.md §6).

Updated per batch (compute) and per request (success/fail/queue); read by /stats and metrics.
"""
from __future__ import annotations

import time

from ..errors import DeadlineExceeded, Internal, QueueFull, ResourceExhausted
from .latency_summary import LatencySummaries, SummarySettings


class Duration:
    __slots__ = ("count", "ns")

    def __init__(self) -> None:
        self.count = 0
        self.ns = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def as_dict(self) -> dict:
        return {"count": self.count, "ns": self.ns}


class BatchStat:
    __slots__ = ("compute_input", "compute_infer", "compute_output")

    def __init__(self) -> None:
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()


# Triton's `reason` label of nv_inference_request_failure: REJECTED (the scheduler refused the request: its queue was
# full, or it timed out waiting), BACKEND (the model's run failed), OTHER (anything else: bad input, not ready, ...).
# Triton's fourth, CANCELED, is not counted: a request its client gave up on is no failure here.
FAILURE_REASONS = ("REJECTED", "BACKEND", "OTHER")


def failure_reason(error: BaseException) -> str:
    if isinstance(error, (QueueFull, DeadlineExceeded)):
        return "REJECTED"
    return "BACKEND" if isinstance(error, (Internal, ResourceExhausted)) else "OTHER"


_INFER_KEYS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")


class ModelStats:
    """Counters for one model version. Mutated only on the event loop thread."""

    def __init__(self, name: str, version: str, summaries: SummarySettings | None = None) -> None:
        """`summaries`: keep Triton's latency summaries too (--metrics-config summary_latencies=true)."""
        self.name = name
        self.version = version
        self.last_inference_ms = 0
        self.inference_count = 0
        self.execution_count = 0
        self.durations = {k: Duration() for k in _INFER_KEYS}
        self.batches: dict[int, BatchStat] = {}
        self.energy_j = 0.0
        self.warmup = Duration()  # model_warmup runs at load (all lanes), before the model was READY
        self.memory_usage: list[dict] = []  # Triton's shape: [{"type": "CPU", "id": 0, "byte_size": N}] (measured at load)
        self.spilled: dict = {}  # set at load when it left its GPU for the CPU lanes: {"from", "to", "reason"}
        self.summaries = LatencySummaries(summaries) if summaries is not None else None
        self.failures = dict.fromkeys(FAILURE_REASONS, 0)

    def record_batch(self, batch_size: int, input_ns: int, infer_ns: int, output_ns: int, request_count: int) -> None:
        """One model execution of `batch_size` samples formed from `request_count` requests."""
        self.execution_count += 1
        self.inference_count += batch_size
        self.last_inference_ms = int(time.time() * 1000)
        d = self.durations
        d["compute_input"].add(input_ns * request_count, request_count)
        d["compute_infer"].add(infer_ns * request_count, request_count)
        d["compute_output"].add(output_ns * request_count, request_count)
        b = self.batches.get(batch_size)
        if b is None:
            b = self.batches[batch_size] = BatchStat()
        b.compute_input.add(input_ns)
        b.compute_infer.add(infer_ns)
        b.compute_output.add(output_ns)
        if self.summaries is not None:
            self.summaries.observe({"compute_input": input_ns, "compute_infer": infer_ns,
                                    "compute_output": output_ns}, request_count)

    def record_success(self, request_ns: int, queue_ns: int) -> None:
        self.durations["success"].add(request_ns)
        self.durations["queue"].add(queue_ns)
        if self.summaries is not None:
            self.summaries.observe({"request": request_ns, "queue": queue_ns})

    def record_failure(self, request_ns: int, error: BaseException | None = None) -> None:
        self.durations["fail"].add(request_ns)
        self.failures[failure_reason(error)] += 1

    def record_cache_hit(self, request_ns: int, lookup_ns: int) -> None:
        """Answered from the response cache (Triton: a success, no execution; cache_hit = lookup time)."""
        self.durations["success"].add(request_ns)
        self.durations["cache_hit"].add(lookup_ns)
        if self.summaries is not None:  # Triton's request and queue summaries include cached requests
            self.summaries.observe({"request": request_ns, "queue": 0})
        self.last_inference_ms = int(time.time() * 1000)

    def record_cache_miss(self, lookup_and_insert_ns: int) -> None:
        self.durations["cache_miss"].add(lookup_and_insert_ns)

    def record_warmup(self, runs: int, ns: int) -> None:
        self.warmup.add(ns, runs)

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "version": self.version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {k: v.as_dict() for k, v in self.durations.items()},
            "response_stats": {},
            "batch_stats": [
                {"batch_size": size, "compute_input": b.compute_input.as_dict(),
                 "compute_infer": b.compute_infer.as_dict(), "compute_output": b.compute_output.as_dict()}
                for size, b in sorted(self.batches.items())
            ],
            "memory_usage": list(self.memory_usage),
            # gt_serve extension: model_warmup runs at load and their total time
            "warmup": self.warmup.as_dict(),
            # gt_serve extension: the spill path moved this version from its GPU to the CPU lanes ({} if not)
            "spilled": dict(self.spilled),
            # gt_serve extension: dynamic energy attributed to this model version (J above idle)
            "energy": {"dynamic_j": round(self.energy_j, 9),
                       "dynamic_j_per_inference": round(self.energy_j / self.inference_count, 9)
                       if self.inference_count else 0.0},
        }
