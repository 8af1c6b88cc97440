"""Triton's latency summaries (`--metrics-config summary_latencies=true`): per model version, the quantiles of each
request's end-to-end, queue and compute times over a sliding window, beside their cumulative count and sum, exposed
as Prometheus summaries (nv_inference_request_summary_us, ...; protocol/metrics.py). Off by default, as in Triton:
then no model keeps anything for them.

The window is that of prometheus-cpp, Triton's metrics library, by default: 60 s in 5 age buckets, so a quantile is
read over the observations of the last 48-60 s (NaN where there were none). Each bucket keeps at most MAX_SAMPLES of a
family's observations (8-byte floats); past that it keeps every second one (then every fourth, ...), each kept one
standing for the observations it replaced, so a burst costs bounded memory and the quantiles are those of an even
sample of it.
"""
from __future__ import annotations

import time
from array import array
from collections import deque
from dataclasses import dataclass

import numpy as np

from ..config import ServerConfig

FAMILIES = ("request", "queue", "compute_input", "compute_infer", "compute_output")
DEFAULT_QUANTILES = (0.5, 0.9, 0.95, 0.99, 0.999)  # Triton's
MAX_SAMPLES = 1 << 13  # of a family in a bucket: at most 1.6 MiB for a model version's 5 families x 5 buckets


@dataclass(frozen=True)
class SummarySettings:
    quantiles: tuple[float, ...] = DEFAULT_QUANTILES
    max_age_s: float = 60.0
    age_buckets: int = 5


def summary_settings(server: ServerConfig) -> SummarySettings | None:
    """The server's summaries (None: off, the default)."""
    if not server.metrics_summary_latencies:
        return None
    return SummarySettings(tuple(server.metrics_summary_quantiles) or DEFAULT_QUANTILES)


class _Sampled:
    """One family's observations (microseconds) in one age bucket; each kept value stands for `stride` of them."""

    __slots__ = ("values", "stride", "seen")

    def __init__(self) -> None:
        self.values = array("d")
        self.stride = 1
        self.seen = 0

    def add(self, value: float, n: int) -> None:
        kept = (self.seen + n) // self.stride - self.seen // self.stride
        self.seen += n
        if kept:
            self.values.extend([value] * kept)
            while len(self.values) >= MAX_SAMPLES:
                del self.values[::2]
                self.stride *= 2


class LatencySummaries:
    """The five families of one model version. Mutated only on the event loop's thread, as ModelStats is."""

    def __init__(self, settings: SummarySettings, clock=time.monotonic_ns) -> None:
        self.quantiles = settings.quantiles
        self.count = dict.fromkeys(FAMILIES, 0)
        self.sum_us = dict.fromkeys(FAMILIES, 0.0)
        self._clock = clock
        self._span_ns = int(settings.max_age_s * 1e9 / settings.age_buckets)
        self._buckets: deque[dict[str, _Sampled]] = deque(maxlen=settings.age_buckets)
        self._opened_ns = clock()
        self._buckets.append(self._bucket())

    @staticmethod
    def _bucket() -> dict[str, _Sampled]:
        return {family: _Sampled() for family in FAMILIES}

    def _current(self) -> dict[str, _Sampled]:
        """The newest bucket, after opening those whose time has come (at most age_buckets of them)."""
        now = self._clock()
        if now - self._opened_ns >= self._span_ns:
            due = (now - self._opened_ns) // self._span_ns
            for _ in range(min(due, self._buckets.maxlen)):
                self._buckets.append(self._bucket())
            self._opened_ns += due * self._span_ns
        return self._buckets[-1]

    def observe(self, values_ns: dict[str, int], n: int = 1) -> None:
        """`n` requests each took `values_ns[family]` (a batch's compute times are each of its requests')."""
        bucket = self._current()
        for family, ns in values_ns.items():
            us = ns / 1e3
            self.count[family] += n
            self.sum_us[family] += us * n
            bucket[family].add(us, n)

    def quantile_values(self, family: str) -> list[float]:
        """The quantiles (in `quantiles` order) of the family's observations in the window; NaN without any."""
        self._current()  # opens the buckets whose time has come: the oldest leave the window
        kept = [bucket[family] for bucket in self._buckets if bucket[family].values]
        if not kept:
            return [float("nan")] * len(self.quantiles)
        values = np.concatenate([np.frombuffer(s.values, dtype=np.float64) for s in kept])
        weights = np.concatenate([np.full(len(s.values), s.stride, dtype=np.float64) for s in kept])
        order = np.argsort(values, kind="stable")
        values, cumulative = values[order], np.cumsum(weights[order])
        # the smallest value with at least q of the observations at or below it
        ranks = np.searchsorted(cumulative, np.asarray(self.quantiles) * cumulative[-1], side="left")
        return [float(values[min(r, len(values) - 1)]) for r in ranks]
