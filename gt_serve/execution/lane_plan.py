"""The lanes of this node, built from the config: GPU lanes with their streams, device pools and device
backends, CPU lanes sized to the CPU quota, and the host staging pool they share.

`app.py` calls `start_lanes` once and injects what it returns; CuPy is reached only through
`backends` (cuda_devices, cupy_backend).
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from ..backends.cuda_devices import detect_gpus, device_memory_pool, device_stream
from ..config import LanesConfig
from .cpu_quota import usable_cpu_cores
from .lanes import Lane, plan_cpu_lanes
from .memory_pool import HostBufferPool

log = logging.getLogger(__name__)


@dataclass
class LanePlan:
    lanes: list[Lane]
    intra_op_threads: int  # per CPU session
    lane_backends: dict[str, Any] = field(default_factory=dict)  # GPU lane id -> CupyBackend on its stream
    device_pools: dict[str, Any] = field(default_factory=dict)  # "gpu:N" -> cupy MemoryPool of its lanes
    host_pool: HostBufferPool | None = None  # batch staging buffers (page-locked where a GPU lane copies)


def start_lanes(lc: LanesConfig, loop: asyncio.AbstractEventLoop, array_backend: Any, processes: int = 1) -> LanePlan:
    """Build every lane, start their threads, and the host pool over the first device's allocator. `processes`:
    the server's worker processes (server.workers), which share the cores: this one plans its lanes on its share."""
    gpus = detect_gpus()
    if lc.gpus:
        gpus = [g for g in gpus if g in lc.gpus]
    lanes: list[Lane] = []
    lane_backends: dict[str, Any] = {}
    device_pools: dict[str, Any] = {}
    for gpu in gpus:
        device_pools[f"gpu:{gpu}"] = _gpu_lanes(gpu, lc, loop, lanes, lane_backends)
    n_cpu, intra_op = _cpu_plan(lc, bool(gpus), processes)
    lanes += [Lane(f"cpu.{i}", "cpu", loop) for i in range(n_cpu)]
    for lane in lanes:
        lane.start()
    staging = next(iter(lane_backends.values()), array_backend)
    host_pool = HostBufferPool(staging.alloc_host) if hasattr(staging, "alloc_host") else None
    return LanePlan(lanes, intra_op, lane_backends, device_pools, host_pool)


def _gpu_lanes(gpu: int, lc: LanesConfig, loop: asyncio.AbstractEventLoop, lanes: list, lane_backends: dict) -> Any:
    """`lanes.gpu_streams_per_device` lanes on `gpu`, sharing one device pool capped by
    `lanes.gpu_memory_limit_bytes`; returns the pool."""
    from ..backends.cupy_backend import CupyBackend

    pool = device_memory_pool(gpu, lc.gpu_memory_limit_bytes)
    for s in range(max(1, lc.gpu_streams_per_device)):
        lane = Lane(f"gpu{gpu}.{s}", f"gpu:{gpu}", loop, stream=device_stream(gpu))
        lanes.append(lane)
        lane_backends[lane.lane_id] = CupyBackend(stream=lane.stream, device_id=gpu, memory_pool=pool)
    return pool


def _cpu_plan(lc: LanesConfig, have_gpus: bool, processes: int = 1) -> tuple[int, int]:
    """CPU lanes x intra-op threads within the cgroup CPU quota (docker --cpus, a pod's limit), not the host's cores;
    with `processes` workers, within this one's share of them."""
    budget = usable_cpu_cores()
    cores = max(1, budget.cores // max(1, processes))
    n_cpu, intra_op = plan_cpu_lanes(cores, lc.cpu_lanes if not have_gpus else max(1, lc.cpu_lanes or 1),
                                     lc.intra_op_threads)
    log.info("CPU quota: %s, affinity %d cores%s -> %d CPU lane(s) x %d intra-op thread(s)",
             "none" if budget.quota_cores is None else f"{budget.quota_cores:g} cores", budget.affinity_cores,
             f", shared by {processes} workers" if processes > 1 else "", n_cpu, intra_op)
    return n_cpu, intra_op
