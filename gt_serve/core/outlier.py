"""Outlier ejection of peers judged by their own answers (Envoy's outlier detection, plus latency).

Pure: the clock comes in as ``now_s`` arguments. Per peer the detector keeps the latencies of its
last ``window`` good answers (their median is the peer's recent normal) and a run of consecutive
failures. A failure is an error answer, or an answer (or an attempt still waiting) slower than
``slow_after_s(node)`` = max(slow_factor x median, min_slow_s). After ``consecutive_failures``
failures in a row the peer is ejected for ``base_ejection_s x 2**(ejections - 1)`` (capped at
``max_ejection_s``); a good answer ends the run and the back-off. ``eject()`` ejects at once
(e.g. on a refused connection).
"""
from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class OutlierSettings:
    consecutive_failures: int = 3
    slow_factor: float = 8.0
    min_slow_s: float = 0.25  # never call an attempt slow before this (CI jitter, cold caches)
    unknown_slow_s: float = 1.0  # threshold while a peer has no good answer yet
    base_ejection_s: float = 2.0
    max_ejection_s: float = 30.0
    window: int = 32

    def __post_init__(self) -> None:
        if self.consecutive_failures < 1 or self.window < 1:
            raise ValueError("consecutive_failures and window must be >= 1")
        if not (self.slow_factor >= 1 and self.min_slow_s > 0 and self.unknown_slow_s > 0
                and 0 < self.base_ejection_s <= self.max_ejection_s):
            raise ValueError("need slow_factor >= 1, min_slow_s > 0, unknown_slow_s > 0 and "
                             "0 < base_ejection_s <= max_ejection_s")


class _PeerRecord:
    __slots__ = ("latencies_s", "failures", "ejections", "ejected_until_s", "median_s")

    def __init__(self, window: int) -> None:
        self.latencies_s: deque[float] = deque(maxlen=window)
        self.failures = 0
        self.ejections = 0
        self.ejected_until_s = 0.0
        self.median_s: float | None = None


class OutlierDetector:
    def __init__(self, settings: OutlierSettings | None = None, max_peers: int = 4096) -> None:
        self.settings = settings or OutlierSettings()
        self._max_peers = max_peers
        self._peers: dict[str, _PeerRecord] = {}
        self.ejections_total = 0

    def _record(self, node: str) -> _PeerRecord:
        rec = self._peers.get(node)
        if rec is None:
            if len(self._peers) >= self._max_peers:
                self._peers.pop(next(iter(self._peers)))
            rec = self._peers[node] = _PeerRecord(self.settings.window)
        return rec

    # ------------------------------------------------------------ input

    def record_ok(self, node: str, latency_s: float, now_s: float) -> bool:
        """An answer after ``latency_s``; one far above the median counts as a failure. True when
        this ejected the peer."""
        rec = self._record(node)
        if latency_s > self.slow_after_s(node):
            return self.record_failure(node, now_s)
        rec.latencies_s.append(latency_s)
        rec.median_s = statistics.median(rec.latencies_s)
        rec.failures = 0
        rec.ejections = 0
        return False

    def record_failure(self, node: str, now_s: float) -> bool:
        """An error or a slow answer; True when this ejected the peer."""
        rec = self._record(node)
        rec.failures += 1
        if rec.failures < self.settings.consecutive_failures or rec.ejected_until_s > now_s:
            return False
        self._eject(rec, now_s)
        return True

    def eject(self, node: str, now_s: float) -> bool:
        """Eject now (the peer refused the connection); False if it already was."""
        rec = self._record(node)
        if rec.ejected_until_s > now_s:
            return False
        self._eject(rec, now_s)
        return True

    def _eject(self, rec: _PeerRecord, now_s: float) -> None:
        s = self.settings
        rec.ejections += 1
        rec.failures = 0
        rec.ejected_until_s = now_s + min(s.base_ejection_s * 2 ** (rec.ejections - 1), s.max_ejection_s)
        self.ejections_total += 1

    def forget(self, node: str) -> None:
        """A new incarnation of ``node``: its history says nothing about it."""
        self._peers.pop(node, None)

    # ------------------------------------------------------------ queries

    def ejected(self, node: str, now_s: float) -> bool:
        rec = self._peers.get(node)
        return rec is not None and rec.ejected_until_s > now_s

    def median_s(self, node: str) -> float | None:
        rec = self._peers.get(node)
        return None if rec is None else rec.median_s

    def slow_after_s(self, node: str) -> float:
        """How long an answer from ``node`` may take before it counts as slow."""
        median = self.median_s(node)
        s = self.settings
        if median is None:
            return s.unknown_slow_s
        return max(s.slow_factor * median, s.min_slow_s)
