"""Model repository: discovery, config completion from real ONNX graphs, versions, load/unload."""
import asyncio

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from gt_serve.testing import model_builders as mb
from gt_serve.backends.onnx_runner import OnnxRunner, describe_model
from gt_serve.core.model_host import LocalModelHost
from gt_serve.core.stream_scheduler import StreamScheduler
from gt_serve.execution.batch_job import SimpleArrayBackend
from gt_serve.execution.job_factory import JobFactory
from gt_serve.execution.lanes import Lane
from gt_serve.core.model_config import model_config_json
from gt_serve.core.registry import ModelRegistry
from gt_serve.errors import GtServeError, InvalidArgument, ModelNotFound


class RecordingHost(LocalModelHost):
    """The real host on one real CPU lane, recording what it opened and closed."""

    def __init__(self):
        loop = asyncio.get_running_loop()
        lanes = [Lane("cpu.0", "cpu", loop)]
        lanes[0].start()
        super().__init__(loop, StreamScheduler(loop, lanes), lanes,
                         lambda path, device, lane: OnnxRunner(path), JobFactory(SimpleArrayBackend()))
        self.opened, self.closed = [], []

    def open(self, model):
        opened = super().open(model)
        self.opened.append((model.name, model.version))
        return opened

    async def close(self, model, drain_timeout_s):
        await super().close(model, drain_timeout_s)
        self.closed.append((model.name, model.version))


def make_repo(tmp_path):
    mb.scale(tmp_path / "auto" / "1" / "model.onnx")
    mb.add_one_fixed(tmp_path / "fixed" / "1" / "model.onnx")
    mb.scale(tmp_path / "multi" / "1" / "model.onnx", factor=2)
    mb.scale(tmp_path / "multi" / "2" / "model.onnx", factor=3)
    (tmp_path / "multi" / "config.pbtxt").write_text("version_policy { all { } }\nmax_batch_size: 2\n")
    mb.scale(tmp_path / "broken" / "1" / "model.onnx")
    (tmp_path / "broken" / "config.pbtxt").write_text('input [ { name: "NOPE" data_type: TYPE_FP32 dims: [4] } ]')
    return tmp_path


def test_completion_from_graph(tmp_path):
    async def main():
        host = RecordingHost()
        reg = ModelRegistry(make_repo(tmp_path), describe_model, host)
        await reg.load("auto")
        m = reg.get("auto")
        assert m.config.max_batch_size == 4  # Triton's default for a batching ONNX model
        assert m.config.HasField("dynamic_batching")
        assert [(t.name, list(t.dims), t.data_type) for t in m.config.input] == [("INPUT", [4], mc.TYPE_FP32)]
        js = model_config_json(m.config)
        assert js["max_batch_size"] == 4 and js["input"][0]["dims"] == [4] and js["input"][0]["data_type"] == "TYPE_FP32"
        await reg.load("fixed")
        assert reg.get("fixed").config.max_batch_size == 0
        assert list(reg.get("fixed").config.input[0].dims) == [4]
    asyncio.run(main())


def test_versions_and_policy(tmp_path):
    async def main():
        reg = ModelRegistry(make_repo(tmp_path), describe_model, RecordingHost())
        await reg.load("multi")
        assert reg.get("multi").version == "2"
        assert reg.get("multi", "1").version == "1"
        with pytest.raises(ModelNotFound, match="version 7"):
            reg.get("multi", "7")
        rows = [r for r in reg.index() if r["name"] == "multi"]
        assert [r["version"] for r in rows] == ["1", "2"] and all(r["state"] == "READY" for r in rows)
    asyncio.run(main())


def test_bad_config_and_unknown_model(tmp_path):
    async def main():
        reg = ModelRegistry(make_repo(tmp_path), describe_model, RecordingHost())
        with pytest.raises(InvalidArgument, match="failed to load 'broken'.*NOPE"):
            await reg.load("broken")
        with pytest.raises(InvalidArgument, match="failed to load 'ghost'"):
            await reg.load("ghost")
        with pytest.raises(GtServeError, match="Request for unknown model"):
            reg.get("ghost")
        index = {r["name"]: r for r in reg.index()}
        assert index["broken"]["state"] == "UNAVAILABLE" and "NOPE" in index["broken"]["reason"]
    asyncio.run(main())


def test_override_and_unload(tmp_path):
    async def main():
        host = RecordingHost()
        reg = ModelRegistry(make_repo(tmp_path), describe_model, host)
        await reg.load("auto", config_json='{"max_batch_size": "16"}')
        assert reg.get("auto").config.max_batch_size == 16
        await reg.load("auto")  # a plain load goes back to the repository config
        assert reg.get("auto").config.max_batch_size == 4
        assert ("auto", "1") in host.closed  # the replaced version was closed
        await reg.unload("auto")
        assert not reg.ready("auto")
        assert {r["name"]: r["state"] for r in reg.index()}["auto"] == "UNAVAILABLE"
        with pytest.raises(InvalidArgument, match="invalid config override"):
            await reg.load("auto", config_json="{not json")
    asyncio.run(main())


def test_instance_group_count_limits_lanes(tmp_path):
    async def main():
        loop = asyncio.get_running_loop()
        lanes = [Lane(f"cpu.{i}", "cpu", loop) for i in range(3)]
        for lane in lanes:
            lane.start()
        host = LocalModelHost(loop, StreamScheduler(loop, lanes), lanes,
                              lambda path, device, lane: OnnxRunner(path), JobFactory(SimpleArrayBackend()))
        mb.scale(tmp_path / "one" / "1" / "model.onnx")
        (tmp_path / "one" / "config.pbtxt").write_text("instance_group [ { kind: KIND_CPU count: 1 } ]\n")
        mb.scale(tmp_path / "all" / "1" / "model.onnx")
        reg = ModelRegistry(tmp_path, describe_model, host)
        await reg.load("one")
        await reg.load("all")
        assert len(reg.get("one").executor.lanes) == 1
        assert len(reg.get("all").executor.lanes) == 3
        assert reg.get("all").config.instance_group[0].count == 3  # the default shows what it got
        await reg.close_all()
        for lane in lanes:
            lane.stop()
    asyncio.run(main())
