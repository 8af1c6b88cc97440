"""Triton's CPU and GPU resource metrics (issue #17: measured the way Triton users measure; Model Analyzer and
perf_analyzer's `--collect-metrics` read them): backends/host_usage.HostUsage over a /proc tree of the test's own
and over this machine's real /proc, and the metric families protocol/resource_metrics makes of it and of an NVML
meter (the NVML module is a stand-in: no GPU here; the GPU check reads a real one)."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gt_serve.backends.host_usage import HostUsage
from gt_serve.backends.power import NvmlMeter
from gt_serve.protocol.metrics import exposition
from gt_serve.protocol.resource_metrics import energy_metric_provider, host_metric_provider
from tests.unit.test_power_meters import FakeClock, fake_nvml

MEMINFO = "MemTotal:       16000 kB\nMemFree:         2000 kB\nMemAvailable:    6000 kB\nBuffers:  1 kB\n"


def proc_tree(root: Path, user: int, idle: int, iowait: int = 0, steal: int = 0) -> Path:
    """A /proc with a `cpu` line of the given ticks (nice, system, irq, softirq 0) and MEMINFO."""
    root.mkdir(exist_ok=True)
    (root / "stat").write_text(f"cpu  {user} 0 0 {idle} {iowait} 0 0 {steal} 0 0\ncpu0 1 0 0 1 0 0 0 0 0 0\n")
    (root / "meminfo").write_text(MEMINFO)
    return root


def families(provider) -> dict[str, dict]:
    """{family name: {sorted labels: value}} as a scrape reads them."""
    class Collector:
        def collect(self):
            yield from provider()

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())
    out: dict[str, dict] = {}
    for family in text_string_to_metric_families(exposition(registry).decode()):
        for sample in family.samples:
            out.setdefault(family.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_cpu_utilization_is_the_busy_share_between_reads_an_interval_apart(tmp_path):
    clock = FakeClock()
    proc = proc_tree(tmp_path, user=100, idle=900)
    usage = HostUsage(proc, interval_s=1.0, clock=clock)
    assert usage.utilization() == 0.0  # nothing measured yet
    proc_tree(tmp_path, user=400, idle=1000, iowait=100, steal=100)  # +300 user, +100 steal, +100 idle, +100 iowait
    clock.now_s += 0.5
    assert usage.utilization() == 0.0  # too soon: the last figure again, the reference kept
    clock.now_s += 0.5
    assert usage.utilization() == pytest.approx(400 / 600)  # steal is busy, iowait is not
    proc_tree(tmp_path, user=400, idle=1600, iowait=100, steal=100)
    clock.now_s += 2.0
    assert usage.utilization() == 0.0  # an idle interval
    assert usage.memory() == (16000 * 1024, 10000 * 1024)  # used = MemTotal - MemAvailable


def test_unreadable_proc_leaves_the_metrics_out(tmp_path):
    usage = HostUsage(tmp_path / "none", clock=FakeClock())
    assert usage.utilization() is None and usage.memory() is None
    assert families(host_metric_provider(usage)) == {}
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "stat").write_text("intr 1 2 3\n")
    (tmp_path / "bad" / "meminfo").write_text("MemTotal: 5 kB\n")
    usage = HostUsage(tmp_path / "bad", clock=FakeClock())
    assert usage.utilization() is None and usage.memory() is None


def test_this_machines_proc_reads_as_triton_reports_it():
    clock = FakeClock()
    usage = HostUsage(clock=clock)
    total, used = usage.memory()
    assert 0 < used < total
    with open("/proc/meminfo") as f:
        assert f"{total // 1024} kB" in f.readline()
    clock.now_s += 1.0
    assert 0.0 <= usage.utilization() <= 1.0
    got = families(host_metric_provider(usage))
    assert set(got) == {"nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes"}
    assert got["nv_cpu_memory_total_bytes"][()] == total


def test_an_nvml_gpu_has_tritons_gpu_metrics():
    meter = NvmlMeter(0, fake_nvml([0], power_mw=120_000))
    energy = SimpleNamespace(refresh=lambda: None, accounting=SimpleNamespace(pairs=lambda: []),
                             unique_meters=lambda: {"gpu:0": meter})
    got = families(energy_metric_provider(energy))
    gpu = (("gpu_uuid", "nvml:0"),)
    assert got["nv_gpu_power_usage"][gpu] == pytest.approx(120.0)
    assert got["nv_gpu_power_limit"][gpu] == pytest.approx(350.0)
    assert got["nv_gpu_utilization"][gpu] == pytest.approx(0.37)
    assert got["nv_gpu_memory_total_bytes"][gpu] == 80 << 30
    assert got["nv_gpu_memory_used_bytes"][gpu] == 3 << 30
    assert got["nv_energy_consumption"][gpu] == 0.0
