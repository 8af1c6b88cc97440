"""Model-memory budget per device, with eviction of idle models and reload on demand (issue #18 item 2).

MemoryBook: what each loaded model version really takes per device, measured by the ModelHost after the
load (LoadMeasure: the process RSS delta around its session creation, per device, and again after a warm-up,
since onnxruntime's CPU arena grows on the first runs; on a GPU device the device's used-bytes delta around
its sessions' creation and warm-up, read through the injected `device_bytes` (backends/device_memory.py),
the RSS delta only where that cannot be read), and each device's budget. It is pure bookkeeping.

Measurement and its noise: RSS counts every page the process touched, so a load running at the same
time as another load, a large request or the allocator returning memory makes one delta too big or too
small (a few MB at most on an idle server; observed ~1-3 MB for ~1 MB of weights). A session's arena
growing later (a bigger batch than warm-up's) is not seen until the model is reloaded. A device's used
bytes are the whole device's: another process, or a CuPy pool growing for requests meanwhile, counts too.

The spill path (core/spill.py, applied by the ModelHost): a KIND_AUTO model that does not fit on its GPU
(onnxruntime's out-of-memory, or a footprint that would take the device past its budget) loads on the CPU
lanes instead when its SLO allows; the book counts spills per model (`spills`).

MemoryGovernor: once a load has pushed a device over its budget, unloads the least recently used idle
models there (never one with requests queued or running, never the one just loaded), those with a live
replica elsewhere in the fleet first; an evicted model shows UNAVAILABLE, "evicted (memory budget)", and a
request for it reloads it and waits up to `reload_wait_s` (every request waits on one reload).
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..errors import GtServeError, Unavailable
from ..execution.process_tuning import release_free_heap

log = logging.getLogger(__name__)

EVICTED_REASON = "evicted (memory budget)"


def no_device_bytes(device: str) -> int | None:
    """The default `device_bytes`: no device is measurable (footprints fall back to the RSS delta)."""
    return None


def process_rss_bytes() -> int:
    """The process's resident set size (Linux /proc/self/statm); 0 where it cannot be read. With glibc, freed heap
    is handed back to the system first (malloc_trim), so that the difference of two readings counts memory in use,
    not the freed heap the server keeps for its next requests (execution/process_tuning.tune_malloc): a session
    created from that heap would not have grown the RSS."""
    release_free_heap()
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@dataclass(frozen=True)
class Candidate:
    """A loaded model version as the eviction policy sees it."""

    name: str
    footprint_bytes: int  # on the device being freed
    idle_since_s: float  # wall time of its last inference, or of its load when it has run none
    busy: bool  # requests queued or running
    replica_elsewhere: bool  # a live replica on another node of the fleet


def choose_victims(candidates: list[Candidate], excess_bytes: int, keep: str = "") -> list[str]:
    """The models to evict to free `excess_bytes`: idle ones only, not `keep`; those with a replica
    elsewhere first, then the longest idle first. Fewer than needed when not enough are idle."""
    eligible = [c for c in candidates if not c.busy and c.name != keep and c.footprint_bytes > 0]
    eligible.sort(key=lambda c: (not c.replica_elsewhere, c.idle_since_s))
    chosen, freed = [], 0
    for c in eligible:
        if freed >= excess_bytes:
            break
        chosen.append(c.name)
        freed += c.footprint_bytes
    return chosen


class MemoryBook:
    """Budgets per device and the measured footprint of each loaded model version on each device.
    `budget_bytes`: every device's budget (0 = unlimited); `per_device`: {"cpu" | "gpu" | "gpu:N": bytes}."""

    def __init__(self, budget_bytes: int = 0, per_device: Mapping[str, int] | None = None,
                 rss_bytes: Callable[[], int] = process_rss_bytes,
                 device_bytes: Callable[[str], int | None] = no_device_bytes) -> None:
        """`device_bytes(device)`: a GPU device's used bytes, None where not measurable (app.py injects
        backends/device_memory.device_used_bytes)."""
        self._budget_bytes = budget_bytes
        self._per_device = dict(per_device or {})
        self.rss_bytes = rss_bytes
        self.device_bytes = device_bytes
        self.spills: dict[str, int] = {}  # model name -> loads that spilled from a GPU to the CPU lanes
        self._footprints: dict[tuple[str, str], dict[str, int]] = {}  # (name, version) -> {device: bytes}
        self._loaded_at_s: dict[tuple[str, str], float] = {}

    @property
    def enabled(self) -> bool:
        return self._budget_bytes > 0 or any(v > 0 for v in self._per_device.values())

    def budget_for(self, device: str) -> int:
        kind = device.split(":")[0]
        return self._per_device.get(device, self._per_device.get(kind, self._budget_bytes))

    def record(self, name: str, version: str, footprint: Mapping[str, int]) -> None:
        self._footprints[(name, version)] = {d: max(0, int(b)) for d, b in footprint.items()}
        self._loaded_at_s[(name, version)] = time.time()

    def forget(self, name: str, version: str) -> None:
        self._footprints.pop((name, version), None)
        self._loaded_at_s.pop((name, version), None)

    def footprint(self, name: str, version: str) -> dict[str, int]:
        return dict(self._footprints.get((name, version), {}))

    def loaded_at_s(self, name: str, version: str) -> float:
        return self._loaded_at_s.get((name, version), 0.0)

    def record_spill(self, name: str) -> None:
        self.spills[name] = self.spills.get(name, 0) + 1

    def used_bytes(self, device: str) -> int:
        return sum(f.get(device, 0) for f in self._footprints.values())

    def over_budget(self) -> dict[str, int]:
        """{device: bytes above its budget} for each device over it."""
        devices = {d for f in self._footprints.values() for d in f}
        excess = {d: self.used_bytes(d) - self.budget_for(d) for d in devices if self.budget_for(d) > 0}
        return {d: e for d, e in sorted(excess.items()) if e > 0}

    def as_dict(self) -> dict:
        devices = sorted({d for f in self._footprints.values() for d in f})
        return {d: {"used_bytes": self.used_bytes(d), "budget_bytes": self.budget_for(d)} for d in devices}


class LoadMeasure:
    """One load's footprint per device (run in the loading thread): the RSS delta around each session's
    creation, plus the warm-up's RSS growth on the first host-measured device; a GPU device whose used bytes
    can be read gets its device delta from before its first session to after the warm-up instead."""

    def __init__(self, book: MemoryBook | None) -> None:
        self._rss = book.rss_bytes if book is not None else (lambda: 0)
        self._device = book.device_bytes if book is not None else no_device_bytes
        self._device_before: dict[str, int] = {}
        self._warmup_before = 0
        self.footprint: dict[str, int] = {}

    def before_session(self, device: str) -> int:
        """Call before creating a session on `device`; pass what it returns to after_session."""
        if device.startswith("gpu") and device not in self._device_before:
            used = self._device(device)
            if used is not None:
                self._device_before[device] = used
        return self._rss()

    def after_session(self, device: str, rss_before: int) -> None:
        self.footprint[device] = self.footprint.get(device, 0) + self._rss() - rss_before

    def before_warmup(self) -> None:
        self._warmup_before = self._rss()

    def after_warmup(self) -> None:
        """onnxruntime's CPU arena grew on the warm-up runs: counted on the first device measured by RSS."""
        host = [d for d in self.footprint if d not in self._device_before]
        if host:
            self.footprint[host[0]] += self._rss() - self._warmup_before

    def finish(self) -> dict[str, int]:
        """The footprint, each measurable GPU device's entry being its device delta."""
        for device, before in self._device_before.items():
            after = self._device(device)
            if after is not None:
                self.footprint[device] = after - before
        return self.footprint


class MemoryGovernor:
    """Evicts to keep each device within its budget; reloads an evicted model when a request needs it.
    `registry`: the ModelRegistry (loaded(), load(name), unload(name, reason=...));
    `replica_elsewhere(name)`: whether a peer serves the model (None on a single node)."""

    def __init__(self, book: MemoryBook, registry, *, reload_wait_s: float = 30.0,
                 replica_elsewhere: Callable[[str], bool] | None = None) -> None:
        self.book = book
        self._registry = registry
        self._reload_wait_s = reload_wait_s
        self._replica_elsewhere = replica_elsewhere or (lambda name: False)
        self.evicted: set[str] = set()
        self.evictions: dict[str, int] = {}
        self.reloads: dict[str, int] = {}
        self._reloading: dict[str, asyncio.Future] = {}

    def _candidates(self, device: str) -> list[Candidate]:
        out = []
        for m in self._registry.loaded():
            ex = m.executor
            if ex is None or m.ensemble is not None:
                continue
            last_s = max(m.stats.last_inference_ms / 1000, self.book.loaded_at_s(m.name, m.version))
            busy = bool(getattr(ex, "pending", 0) or getattr(ex, "in_flight", 0))
            out.append(Candidate(m.name, self.book.footprint(m.name, m.version).get(device, 0), last_s, busy,
                                 self._replica_elsewhere(m.name)))
        return out

    async def enforce(self, keep: str = "") -> list[str]:
        """Evict until every device is within its budget (as far as idle models allow); the evicted names."""
        if not self.book.enabled:
            return []
        evicted: list[str] = []
        for device, excess in self.book.over_budget().items():
            uploaded = {m.name for m in self._registry.loaded()} - set(self._registry.repository_models())
            candidates = [c for c in self._candidates(device) if c.name not in uploaded]
            victims = choose_victims(candidates, excess, keep)
            for name in victims:
                await self._evict(name)
                evicted.append(name)
            if sum(c.footprint_bytes for c in candidates if c.name in victims) < excess:
                log.warning("device %s stays %d bytes over its model-memory budget: no more idle models to evict",
                            device, excess)
        return evicted

    async def _evict(self, name: str) -> None:
        if not self._registry.is_loaded(name):  # another enforce got to it first
            return
        self.evicted.add(name)  # first: a request arriving while it unloads waits for the reload
        self.evictions[name] = self.evictions.get(name, 0) + 1
        log.info("evicting model %s (memory budget)", name)
        await self._registry.unload(name, reason=EVICTED_REASON)

    def forget(self, name: str) -> None:
        """An explicit load or unload: the model is no longer 'evicted'."""
        self.evicted.discard(name)

    async def reload(self, name: str) -> None:
        """Reload an evicted model, waiting up to reload_wait_s (one reload, however many requests wait)."""
        task = self._reloading.get(name)
        if task is None:
            task = self._reloading[name] = asyncio.ensure_future(self._reload(name))
            task.add_done_callback(lambda t: self._reloading.pop(name, None))
        try:
            await asyncio.wait_for(asyncio.shield(task), self._reload_wait_s)
        except asyncio.TimeoutError:
            raise Unavailable(f"model '{name}' was evicted (memory budget) and its reload did not finish "
                              f"within {self._reload_wait_s:g} s (server.reload_wait_s)") from None

    async def _reload(self, name: str) -> None:
        log.info("reloading evicted model %s on demand", name)
        try:
            await self._registry.load(name)
        except GtServeError as exc:
            raise Unavailable(f"model '{name}' was evicted (memory budget) and could not be reloaded: "
                              f"{exc.message}") from None
        self.evicted.discard(name)
        self.reloads[name] = self.reloads.get(name, 0) + 1
        await self.enforce(keep=name)

    def stats(self) -> dict:
        return {"devices": self.book.as_dict(), "evicted": sorted(self.evicted),
                "evictions": dict(sorted(self.evictions.items())), "reloads": dict(sorted(self.reloads.items())),
                "spills": dict(sorted(self.book.spills.items()))}
