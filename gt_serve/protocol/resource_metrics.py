"""Metrics and status for the node's resources: energy (J/inference per model and device, meter
totals and power) and the host buffer pool.

Triton's `nv_energy_consumption`, `nv_gpu_power_usage`, `nv_gpu_power_limit`, `nv_gpu_utilization` and
`nv_gpu_memory_{total,used}_bytes` for NVML-metered GPUs, and its CPU metrics (`nv_cpu_utilization`,
`nv_cpu_memory_{total,used}_bytes`, system-wide) for the host; `gt_*` for the rest.
"""
from __future__ import annotations

from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


def energy_metric_provider(energy: Any):
    def collect():
        energy.refresh()
        joules = CounterMetricFamily("gt_energy_joules", "Dynamic energy (above idle) attributed per model and device",
                                     labels=["model", "device"])
        per_inf = GaugeMetricFamily("gt_energy_joules_per_inference", "Attributed joules per inference",
                                    labels=["model", "device"])
        for model, device, inferences, dynamic_j in energy.accounting.pairs():
            joules.add_metric([model, device], dynamic_j)
            per_inf.add_metric([model, device], dynamic_j / inferences if inferences else 0.0)
        yield joules
        yield per_inf
        # each meter read once a scrape (an NVML call each), for gt_node_* and Triton's nv_* alike
        readings = [(device, meter, meter.energy_j(), meter.power_w())
                    for device, meter in energy.unique_meters().items()]
        node = CounterMetricFamily("gt_node_energy_joules", "Energy read by each meter since start",
                                   labels=["device", "meter"])
        power = GaugeMetricFamily("gt_node_power_watts", "Current power per meter", labels=["device", "meter"])
        for device, meter, energy_j, power_w in readings:
            node.add_metric([device, meter.name], energy_j)
            power.add_metric([device, meter.name], power_w)
        yield node
        yield power
        gpus = [(meter, energy_j, power_w) for device, meter, energy_j, power_w in readings
                if device.startswith("gpu:")]
        if gpus:
            yield from _gpu_families(gpus)

    return collect


def _gpu_families(meters: list) -> list:
    """Triton's GPU metrics from (meter, its energy J, its power W) per GPU meter, one sample each (labelled by its
    name); what a meter cannot read is left out."""
    label = ["gpu_uuid"]
    nv_energy = CounterMetricFamily("nv_energy_consumption", "GPU energy consumption in joules since start",
                                    labels=label)
    nv_power = GaugeMetricFamily("nv_gpu_power_usage", "GPU power usage in watts", labels=label)
    nv_util = GaugeMetricFamily("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", labels=label)
    nv_limit = GaugeMetricFamily("nv_gpu_power_limit", "GPU power management limit in watts", labels=label)
    nv_mem_total = GaugeMetricFamily("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", labels=label)
    nv_mem_used = GaugeMetricFamily("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", labels=label)
    for meter, energy_j, power_w in meters:
        name = [meter.name]
        nv_energy.add_metric(name, energy_j)
        nv_power.add_metric(name, power_w)
        if hasattr(meter, "utilization"):
            nv_util.add_metric(name, meter.utilization())
        limit_w = meter.power_limit_w() if hasattr(meter, "power_limit_w") else None
        if limit_w is not None:
            nv_limit.add_metric(name, limit_w)
        memory = meter.memory() if hasattr(meter, "memory") else None
        if memory is not None:
            nv_mem_total.add_metric(name, memory[0])
            nv_mem_used.add_metric(name, memory[1])
    return [nv_energy, nv_power, nv_util, nv_limit, nv_mem_total, nv_mem_used]


def host_metric_provider(usage: Any):
    """Triton's CPU metrics, system-wide (backends/host_usage.HostUsage); each left out where it can't be read."""

    def collect():
        utilization = usage.utilization()
        if utilization is not None:
            fam = GaugeMetricFamily("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]")
            fam.add_metric([], utilization)
            yield fam
        memory = usage.memory()
        if memory is not None:
            for value, name, doc in ((memory[0], "nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes"),
                                     (memory[1], "nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes")):
                fam = GaugeMetricFamily(name, doc)
                fam.add_metric([], value)
                yield fam

    return collect


def energy_status_provider(energy: Any):
    def snapshot() -> dict:
        totals = energy.totals()
        rows = [{"model": model, "device": device, "joules": dynamic_j,
                 "joules_per_inference": dynamic_j / inferences if inferences else 0.0}
                for model, device, inferences, dynamic_j in energy.accounting.pairs()]
        return {"energy": rows, "energy_total": totals["total"], "power_w": energy.power_w()}

    return snapshot


def pool_metric_provider(pool: Any):
    def collect():
        stats = pool.statistics()
        for key, doc in (("allocations", "Buffers the host pool allocated"), ("hits", "Acquires served from the pool"),
                         ("misses", "Acquires that had to allocate")):
            fam = CounterMetricFamily(f"gt_host_pool_{key}", doc)
            fam.add_metric([], stats.get(key, 0))
            yield fam
        for key in ("bytes_in_use", "bytes_cached"):
            fam = GaugeMetricFamily(f"gt_host_pool_{key}", f"Host pool {key.replace('_', ' ')}")
            fam.add_metric([], stats.get(key, 0))
            yield fam

    return collect


def device_pool_statistics(pools: dict) -> dict:
    """Per device: bytes the CuPy MemoryPool holds for live buffers, holds in all (cached
    included), its cap (0 = none), and its free blocks."""
    return {device: {"used_bytes": int(pool.used_bytes()), "total_bytes": int(pool.total_bytes()),
                     "limit_bytes": int(pool.get_limit()), "free_blocks": int(pool.n_free_blocks())}
            for device, pool in sorted(pools.items())}


def device_pool_metric_provider(pools: dict):
    def collect():
        stats = device_pool_statistics(pools)
        for key, doc in (("used_bytes", "Device pool bytes in live buffers"),
                         ("total_bytes", "Device pool bytes held, cached blocks included"),
                         ("limit_bytes", "Device pool cap (0 = none)")):
            fam = GaugeMetricFamily(f"gt_device_pool_{key}", doc, labels=["device"])
            for device, values in stats.items():
                fam.add_metric([device], values[key])
            yield fam

    return collect


def fleet_metric_provider(fleet: Any, view: Any, clock: Any):
    """Router decisions (where requests were served) and peers by health, for the edge cluster."""

    def collect():
        decisions = CounterMetricFamily("gt_router_decisions", "Routing decisions by the node that served",
                                        labels=["target"])
        for target, count in sorted(fleet.decisions.items()):
            decisions.add_metric([target], count)
        yield decisions
        peers = GaugeMetricFamily("gt_peers", "Peer nodes by health", labels=["state"])
        counts: dict[str, int] = {}
        for peer in view.peers(clock()):
            counts[peer.health.value] = counts.get(peer.health.value, 0) + 1
        for state in ("live", "suspect", "draining", "offline", "dead"):
            peers.add_metric([state], counts.get(state, 0))
        yield peers

    return collect
