"""The spill path (issue #18 item 2): a KIND_AUTO model that does not fit on its GPU loads on the CPU lanes
(core/spill.py, LocalModelHost), device memory measured per GPU (backends/device_memory.py), and
onnxruntime's out-of-memory text mapped to DeviceOutOfMemory in one place (backends/onnx_runner.py).

The host is the real one (real OnnxRunner sessions on a real CPU lane, real ONNX files). The GPU is a fake:
a Lane named "gpu:0" that is never started (no batch may reach it: the tests check it ran none), whose
sessions are CPU sessions that either raise DeviceOutOfMemory or grow a fake device's used bytes.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from gt_serve.backends.cuda_devices import detect_gpus
from gt_serve.backends.device_memory import device_used_bytes
from gt_serve.backends.onnx_runner import OnnxRunner, describe_model, is_out_of_memory
from gt_serve.core.dataplane import DataPlane
from gt_serve.core.memory_budget import MemoryBook, MemoryGovernor
from gt_serve.core.model_control import ModelControl, Readiness
from gt_serve.core.model_host import LocalModelHost
from gt_serve.core.registry import ModelRegistry
from gt_serve.core.spill import may_spill, slo_miss
from gt_serve.core.stream_scheduler import StreamScheduler
from gt_serve.errors import Code, DeviceOutOfMemory, GtServeError
from gt_serve.execution.batch_job import SimpleArrayBackend
from gt_serve.execution.job_factory import JobFactory
from gt_serve.execution.lanes import Lane
from gt_serve.protocol.metrics import memory_metric_provider
from gt_serve.testing import model_builders as mb
from gt_serve.types import InferRequest, Tensor

MB = 1 << 20
WARMUP = ('model_warmup [ { name: "w" batch_size: 1 count: 3 inputs { key: "INPUT" value: '
          '{ data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]\n')


class FakeGpu:
    """Sessions for "gpu:*" devices: DeviceOutOfMemory when `oom`, else a CPU session that takes
    `session_bytes` of the fake device's used bytes until it is closed. `events` records opens and closes."""

    def __init__(self, *, oom: bool = False, session_bytes: int = 0, oom_on_run: bool = False) -> None:
        self.oom, self.session_bytes, self.oom_on_run = oom, session_bytes, oom_on_run  # oom_on_run: the arena
        self.used = 100 * MB
        self.events: list[tuple[str, str]] = []

    def device_bytes(self, device: str) -> int | None:
        return self.used if device == "gpu:0" else None

    def factory(self, path: str, device: str, lane, *settings):
        if device.startswith("gpu"):
            if self.oom:
                self.events.append(("oom", device))
                raise DeviceOutOfMemory(device, "m", "onnxruntime could not allocate the session: "
                                                     "CUDA failure 2: out of memory")
            self.used += self.session_bytes
        self.events.append(("open", device))
        return TrackedRunner(OnnxRunner(path), self, device)


class TrackedRunner:
    def __init__(self, inner: OnnxRunner, gpu: FakeGpu, device: str) -> None:
        self._inner, self._gpu, self._device = inner, gpu, device

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def run(self, feeds, output_names=None):
        if self._device.startswith("gpu") and self._gpu.oom_on_run:
            self._gpu.events.append(("oom on run", self._device))
            raise DeviceOutOfMemory(self._device, "m", "onnxruntime could not allocate a run's memory: "
                                                       "Failed to allocate memory for requested buffer")
        return self._inner.run(feeds, output_names)

    def close(self) -> None:
        self._gpu.events.append(("close", self._device))
        if self._device.startswith("gpu"):
            self._gpu.used -= self._gpu.session_bytes
        self._inner.close()


@dataclass
class Served:
    plane: DataPlane
    registry: ModelRegistry
    governor: MemoryGovernor | None
    gpu_lane: Lane
    cpu_lane: Lane

    async def close(self) -> None:
        await self.registry.close_all()
        self.cpu_lane.stop()


async def serve(tmp_path, gpu: FakeGpu, *, config: str = "", knobs=None, book: MemoryBook | None = None,
                slo_s=None) -> Served:
    mb.scale(tmp_path / "m" / "1" / "model.onnx", factor=2)
    if config:
        (tmp_path / "m" / "config.pbtxt").write_text(config)
    loop = asyncio.get_running_loop()
    gpu_lane = Lane("gpu0.s0", "gpu:0", loop)  # never started: a batch sent to it would never come back
    cpu_lane = Lane("cpu.0", "cpu", loop)
    cpu_lane.start()
    lanes = [gpu_lane, cpu_lane]
    host = LocalModelHost(loop, StreamScheduler(loop, lanes), lanes, gpu.factory, JobFactory(SimpleArrayBackend()),
                          knobs, memory=book, slo_s=slo_s)
    registry = ModelRegistry(tmp_path, describe_model, host)
    governor = MemoryGovernor(book, registry) if book is not None else None
    plane = DataPlane(registry, ModelControl(registry, "explicit", memory=governor), Readiness(registry),
                      memory=governor)
    return Served(plane, registry, governor, gpu_lane, cpu_lane)


async def infer_scaled(plane: DataPlane) -> np.ndarray:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    resp = await asyncio.wait_for(plane.infer(InferRequest("m", "", "r1", [Tensor("INPUT", "FP32", (2, 4), x)])), 30)
    return resp.outputs[0].data


def spills_metric(governor: MemoryGovernor) -> dict[str, float]:
    families = {f.name: f for f in memory_metric_provider(governor)()}
    return {s.labels["model"]: s.value for s in families["gt_model_spills"].samples if s.name.endswith("_total")}


def test_out_of_memory_on_the_gpu_spills_to_the_cpu_lane_and_serves(tmp_path, caplog):
    async def main():
        gpu = FakeGpu(oom=True)
        s = await serve(tmp_path, gpu, book=MemoryBook(per_device={"cpu": 1 << 40}, device_bytes=gpu.device_bytes))
        with caplog.at_level(logging.WARNING, logger="gt_serve.core.model_host"):
            await s.registry.load("m")
        model = s.registry.get("m")
        assert model.executor.lanes == (s.cpu_lane,)
        assert model.config.instance_group[0].count == 1  # the default count, filled in for the CPU lanes
        np.testing.assert_allclose(await infer_scaled(s.plane), np.arange(8, dtype=np.float32).reshape(2, 4) * 2)
        assert s.cpu_lane.batches_run == 1 and s.gpu_lane.batches_run == 0 and not s.gpu_lane.busy
        assert gpu.events == [("oom", "gpu:0"), ("open", "cpu")]
        stats = await s.plane.statistics("m")
        spilled = stats["model_stats"][0]["spilled"]
        assert (spilled["from"], spilled["to"]) == ("gpu:0", "cpu") and "out of memory" in spilled["reason"]
        assert stats["memory_budget"]["spills"] == {"m": 1}
        assert [r["type"] for r in stats["model_stats"][0]["memory_usage"]] == ["CPU"]
        assert spills_metric(s.governor) == {"m": 1.0}
        warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("model m" in w and "gpu:0" in w and "out of memory" in w for w in warning), warning
        await s.close()
    asyncio.run(main())


@pytest.mark.parametrize("config, knobs", [
    ("instance_group [ { kind: KIND_GPU } ]\n", None),  # an explicit KIND_GPU is never moved
    ("", {"m": {"spill_to_cpu": False}}),  # the knob turns the spill off
])
def test_no_spill_for_kind_gpu_or_with_the_knob_off(tmp_path, config, knobs):
    async def main():
        gpu = FakeGpu(oom=True)
        s = await serve(tmp_path, gpu, config=config, knobs=knobs)
        with pytest.raises(GtServeError) as caught:
            await s.registry.load("m")
        assert caught.value.code is Code.RESOURCE_EXHAUSTED
        assert "'m'" in caught.value.message and "gpu:0" in caught.value.message
        assert gpu.events == [("oom", "gpu:0")]  # no CPU session was made
        assert not s.registry.is_loaded("m")
        await s.close()
    asyncio.run(main())


@pytest.mark.parametrize("budget, spills", [(5 * MB - 1, True), (5 * MB, False)])
def test_a_device_footprint_over_the_gpu_budget_spills(tmp_path, budget, spills):
    async def main():
        gpu = FakeGpu(session_bytes=5 * MB)
        book = MemoryBook(per_device={"gpu": budget}, device_bytes=gpu.device_bytes)
        s = await serve(tmp_path, gpu, book=book)
        await s.registry.load("m")
        model = s.registry.get("m")
        stats = (await s.plane.statistics("m"))["model_stats"][0]
        if spills:
            assert gpu.events == [("open", "gpu:0"), ("close", "gpu:0"), ("open", "cpu")]  # GPU closed first
            assert model.executor.lanes == (s.cpu_lane,)
            assert stats["spilled"]["from"] == "gpu:0" and "budget" in stats["spilled"]["reason"]
            assert book.footprint("m", "1").keys() == {"cpu"} and book.spills == {"m": 1}
            np.testing.assert_allclose(await infer_scaled(s.plane), np.arange(8).reshape(2, 4) * 2)
            assert s.gpu_lane.batches_run == 0
        else:  # it fits: it stays on the GPU lane, its footprint the device delta (not the RSS delta)
            assert gpu.events == [("open", "gpu:0")]
            assert model.executor.lanes == (s.gpu_lane,)
            assert stats["spilled"] == {} and book.spills == {}
            assert book.footprint("m", "1") == {"gpu:0": 5 * MB}
            assert stats["memory_usage"] == [{"type": "GPU", "id": 0, "byte_size": 5 * MB}]
        await s.close()
    asyncio.run(main())


@pytest.mark.parametrize("slo_s, spills", [(1e-9, False), (60.0, True)])
def test_the_spill_waits_for_the_slo_on_the_cpu_warmup(tmp_path, slo_s, spills):
    async def main():
        gpu = FakeGpu(oom=True)
        s = await serve(tmp_path, gpu, config=WARMUP, slo_s={"m": slo_s})
        if spills:
            await s.registry.load("m")
            stats = (await s.plane.statistics("m"))["model_stats"][0]
            assert stats["spilled"]["to"] == "cpu"
            assert stats["warmup"]["count"] == 3  # the CPU lane's runs: the GPU made no session
            np.testing.assert_allclose(await infer_scaled(s.plane), np.arange(8).reshape(2, 4) * 2)
        else:
            with pytest.raises(GtServeError) as caught:
                await s.registry.load("m")
            assert caught.value.code is Code.RESOURCE_EXHAUSTED
            assert "SLO" in caught.value.message and "gpu:0" in caught.value.message
            assert gpu.events == [("oom", "gpu:0"), ("open", "cpu"), ("close", "cpu")]  # tried, then released
            assert not s.registry.is_loaded("m")
        await s.close()
    asyncio.run(main())


def test_spill_rule_conditions():
    gpu, cpu = SimpleNamespace(on_gpu=True), SimpleNamespace(on_gpu=False)
    cfg = mc.ModelConfig(instance_group=[mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_AUTO)])
    assert may_spill(cfg, [gpu], [gpu, cpu], {})
    assert not may_spill(cfg, [cpu], [gpu, cpu], {})  # already on the CPU
    assert not may_spill(cfg, [gpu], [gpu], {})  # no CPU lane to go to
    assert not may_spill(cfg, [gpu], [gpu, cpu], {"spill_to_cpu": "false"})
    assert not may_spill(cfg, [gpu], [gpu, cpu], {}, gpu_accelerators=True)  # TensorRT needs the GPU
    cfg.instance_group.add(kind=mc.ModelInstanceGroup.KIND_CPU)
    assert not may_spill(cfg, [gpu, cpu], [gpu, cpu], {})  # not every group is KIND_AUTO
    assert slo_miss(None, 0.001) == "" and slo_miss((2, 4_000_000), None) == ""
    assert slo_miss((2, 4_000_000), 0.002) == ""  # 2 ms per run meets a 2 ms SLO
    assert "SLO" in slo_miss((2, 4_000_000), 0.001)


def test_device_used_bytes_is_none_for_the_cpu_and_unknown_names():
    assert device_used_bytes("cpu") is None
    assert device_used_bytes("tpu:0") is None and device_used_bytes("gpu:x") is None
    used = device_used_bytes("gpu:0")  # None without CuPy or a GPU, bytes with one
    assert used is None or used > 0


@pytest.mark.parametrize("text, oom", [
    ("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Exception during initialization: bfc_arena.cc:376 "
     "BFCArena::AllocateRawInternal Failed to allocate memory for requested buffer of size 4194304", True),
    ("CUDA failure 2: out of memory ; GPU=0 ; hostname=x ; file=cuda_allocator.cc ; line=47", True),
    ("CUDA failure 209: no kernel image is available for execution on the device", False),
    ("Load model from model.onnx failed: Protobuf parsing failed.", False),
])
def test_onnxruntime_allocation_failures_are_recognised(text, oom):
    assert is_out_of_memory(RuntimeError(text)) is oom


def test_session_creation_out_of_memory_is_typed_on_gpu_only(tmp_path, monkeypatch):
    import onnxruntime as ort

    path = tmp_path / "m" / "1" / "model.onnx"
    mb.scale(path)

    def no_memory(*args, **kwargs):
        raise RuntimeError("CUDA failure 2: out of memory ; GPU=1")

    monkeypatch.setattr(ort, "InferenceSession", no_memory)
    with pytest.raises(DeviceOutOfMemory) as caught:
        OnnxRunner(str(path), device="gpu", device_id=1)
    assert (caught.value.device, caught.value.model, caught.value.code) == ("gpu:1", "m", Code.RESOURCE_EXHAUSTED)
    with pytest.raises(RuntimeError, match="CUDA failure 2") as plain:
        OnnxRunner(str(path), device="cpu")
    assert not isinstance(plain.value, DeviceOutOfMemory)

    def broken(*args, **kwargs):
        raise RuntimeError("Protobuf parsing failed")

    monkeypatch.setattr(ort, "InferenceSession", broken)
    with pytest.raises(RuntimeError, match="Protobuf") as other:
        OnnxRunner(str(path), device="gpu", device_id=0)
    assert not isinstance(other.value, DeviceOutOfMemory)


@pytest.mark.gpu
@pytest.mark.skipif(not detect_gpus(), reason="needs a CUDA GPU (CuPy and onnxruntime's CUDA provider)")
def test_real_gpu_lane_over_a_one_byte_budget_spills_to_the_cpu(tmp_path):
    from gt_serve.backends.cuda_devices import device_stream

    async def main():
        path = tmp_path / "m" / "1" / "model.onnx"
        mb.mlp(path, sizes=(256, 1024, 1024, 10))
        (tmp_path / "m" / "config.pbtxt").write_text(
            'model_warmup [ { name: "w" batch_size: 1 count: 2 inputs { key: "INPUT" value: '
            '{ data_type: TYPE_FP32 dims: [ 256 ] random_data: true } } } ]\n')
        loop = asyncio.get_running_loop()
        gpu_lane = Lane("gpu0.0", "gpu:0", loop, stream=device_stream(0))
        cpu_lane = Lane("cpu.0", "cpu", loop)
        lanes = [gpu_lane, cpu_lane]
        for lane in lanes:
            lane.start()

        def factory(model_path, device, lane, *settings):
            if device.startswith("gpu"):
                return OnnxRunner(model_path, device="gpu", device_id=0, cuda_stream_ptr=lane.stream.ptr)
            return OnnxRunner(model_path)

        book = MemoryBook(per_device={"gpu": 1}, device_bytes=device_used_bytes)
        host = LocalModelHost(loop, StreamScheduler(loop, lanes), lanes, factory, JobFactory(SimpleArrayBackend()),
                              memory=book)
        registry = ModelRegistry(tmp_path, describe_model, host)
        plane = DataPlane(registry, ModelControl(registry, "explicit"), Readiness(registry))
        await registry.load("m")
        model = registry.get("m")
        assert model.executor.lanes == (cpu_lane,)
        assert model.stats.spilled["from"] == "gpu:0" and book.spills == {"m": 1}
        x = np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32)
        resp = await asyncio.wait_for(plane.infer(InferRequest("m", "", "r", [Tensor("INPUT", "FP32", (3, 256), x)])), 60)
        expected = OnnxRunner(str(path)).run({"INPUT": x})[0]
        np.testing.assert_allclose(resp.outputs[0].data, expected, rtol=1e-5, atol=1e-5)
        assert gpu_lane.batches_run == 0
        await registry.close_all()
        for lane in lanes:
            lane.stop()
    asyncio.run(main())


def test_out_of_memory_during_the_gpu_warmup_spills_too(tmp_path):
    """The session fits but its first runs cannot grow the arena on the device: the warm-up's DeviceOutOfMemory
    is not wrapped (core/warmup.py), so the host spills as for a session that does not fit."""
    async def main():
        gpu = FakeGpu(oom_on_run=True)
        s = await serve(tmp_path, gpu, config=WARMUP)
        await s.registry.load("m")
        assert gpu.events == [("open", "gpu:0"), ("oom on run", "gpu:0"), ("close", "gpu:0"), ("open", "cpu")]
        stats = (await s.plane.statistics("m"))["model_stats"][0]
        assert stats["spilled"]["from"] == "gpu:0" and "run's memory" in stats["spilled"]["reason"]
        assert stats["warmup"]["count"] == 3  # the CPU lane's warm-up runs
        np.testing.assert_allclose(await infer_scaled(s.plane), np.arange(8).reshape(2, 4) * 2)
        await s.close()
    asyncio.run(main())


def test_a_runs_out_of_memory_text_on_a_gpu_session_is_typed(tmp_path):
    """OnnxRunner.run maps onnxruntime's allocation failure to DeviceOutOfMemory on a GPU session only."""
    path = tmp_path / "m.onnx"
    mb.scale(path, factor=2)

    def arena_full(*args):
        raise RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Failed to allocate memory for requested buffer")

    x = {"INPUT": np.zeros((1, 4), np.float32)}
    on_cpu = OnnxRunner(str(path))
    on_cpu._run = arena_full
    with pytest.raises(RuntimeError):
        on_cpu.run(x)
    on_gpu = OnnxRunner(str(path))
    on_gpu.requested_device, on_gpu.device_id = "gpu", 1  # as a GPU lane's runner (no GPU here)
    on_gpu._run = arena_full
    with pytest.raises(DeviceOutOfMemory) as caught:
        on_gpu.run(x)
    assert caught.value.device == "gpu:1" and "Failed to allocate" in caught.value.message
    on_gpu._bind_and_run = lambda *args, **kwargs: arena_full()  # the IO-binding path (lanes.io_binding)
    with pytest.raises(DeviceOutOfMemory):
        on_gpu.run_bound(x, None, np.empty)

