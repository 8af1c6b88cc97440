"""core.pipeline.PipelineSet with fake stages: tensor flow by name, readiness, metadata, errors;
and the `pipelines` key of the node config."""
from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from gt_serve.config_layers import parse_config
from gt_serve.core.pipeline import Pipeline, PipelineSet, StageInfo
from gt_serve.errors import ConfigError, InvalidArgument, ModelNotFound, PeerUnavailable, Unavailable
from gt_serve.types import InferRequest, InferResponse, RequestedOutput, Tensor


def info(name: str, inputs: list[str], outputs: list[str], mbs: int = 8) -> StageInfo:
    cfg = mc.ModelConfig(name=name, max_batch_size=mbs)
    for n in inputs:
        cfg.input.add(name=n, data_type=mc.TYPE_FP32, dims=[4])
    for n in outputs:
        cfg.output.add(name=n, data_type=mc.TYPE_FP32, dims=[4])
    tensors = lambda names: [{"name": n, "datatype": "FP32", "shape": [-1, 4]} for n in names]  # noqa: E731
    return StageInfo({"name": name, "versions": ["1"], "platform": "onnxruntime_onnx",
                      "inputs": tensors(inputs), "outputs": tensors(outputs)}, cfg)


# s0: x -> h (x + 1) here; s1: h, x -> y (h * x) only on peer "b"
STAGES = {"s0": info("s0", ["x"], ["h"]), "s1": info("s1", ["h", "x"], ["y"])}


class Fakes:
    def __init__(self) -> None:
        self.local = {"s0"}
        self.peers = {"s1": ["b"]}
        self.describe_calls = 0
        self.requests: list[InferRequest] = []
        self.down: set[str] = set()

    def local_info(self, model: str):
        return STAGES[model] if model in self.local else None

    def peer_targets(self, model: str) -> list:
        return [p for p in self.peers.get(model, []) if p not in self.down]

    async def describe(self, target, model: str) -> StageInfo:
        self.describe_calls += 1
        if target in self.down:
            raise PeerUnavailable(f"{target} is down", target)
        return STAGES[model]

    async def infer(self, request: InferRequest) -> InferResponse:
        self.requests.append(request)
        feeds = {t.name: t.data for t in request.inputs}
        if request.model_name == "s0":
            return InferResponse("s0", "1", request.id, [Tensor("h", "FP32", feeds["x"].shape, feeds["x"] + 1)])
        if request.model_name == "s1":
            if "b" in self.down:
                raise Unavailable("model 's1': no node could serve the request")
            y = feeds["h"] * feeds["x"]
            return InferResponse("s1", "1", request.id, [Tensor("y", "FP32", y.shape, y)], {"gt_served_by": "b"})
        raise ModelNotFound(f"Request for unknown model: '{request.model_name}' is not found")

    def pipelines(self) -> PipelineSet:
        return PipelineSet([Pipeline("p", ("s0", "s1"))], local_info=self.local_info,
                           peer_targets=self.peer_targets, describe_peer=lambda: self.describe,
                           infer=self.infer, node="a")


def request(x: np.ndarray, **kw) -> InferRequest:
    return InferRequest("p", "", "r1", [Tensor("x", "FP32", x.shape, x)], **kw)


@pytest.mark.asyncio
async def test_stages_feed_each_other_by_name():
    fakes = Fakes()
    pipes = fakes.pipelines()
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    resp = await pipes.infer(request(x, priority=3, deadline_s=123.0, hops=1,
                                     outputs=[RequestedOutput("y")], parameters={"k": "v"}))
    assert resp.model_name == "p" and resp.id == "r1"
    np.testing.assert_array_equal(resp.outputs[0].data, (x + 1) * x)
    assert resp.parameters == {"gt_stages_served_by": "a,b"}
    s0, s1 = fakes.requests
    assert [t.name for t in s1.inputs] == ["h", "x"]
    assert s0.outputs is None and [o.name for o in s1.outputs] == ["y"]  # requested outputs: last stage only
    assert all(r.priority == 3 and r.deadline_s == 123.0 and r.hops == 1 and r.parameters == {"k": "v"}
               for r in (s0, s1))
    await pipes.infer(request(x))
    assert fakes.describe_calls == 1  # the peer's description is kept


@pytest.mark.asyncio
async def test_metadata_and_config_span_first_inputs_and_last_outputs():
    pipes = Fakes().pipelines()
    meta = await pipes.metadata("p")
    assert meta["name"] == "p" and meta["platform"] == "pipeline"
    assert [t["name"] for t in meta["inputs"]] == ["x"] and [t["name"] for t in meta["outputs"]] == ["y"]
    cfg = await pipes.config("p")
    assert cfg.name == "p" and cfg.max_batch_size == 8
    assert [t.name for t in cfg.input] == ["x"] and [t.name for t in cfg.output] == ["y"]
    with pytest.raises(ModelNotFound):
        await pipes.metadata("p", "2")


def test_ready_needs_every_stage_somewhere():
    fakes = Fakes()
    pipes = fakes.pipelines()
    assert pipes.ready("p") and not pipes.ready("p", "7")
    fakes.down.add("b")
    assert not pipes.ready("p")


@pytest.mark.asyncio
async def test_errors_name_the_stage():
    fakes = Fakes()
    pipes = fakes.pipelines()
    x = np.ones((1, 4), np.float32)
    with pytest.raises(InvalidArgument, match="unexpected inference input 'z'"):
        await pipes.infer(InferRequest("p", "", "", [Tensor("x", "FP32", (1, 4), x), Tensor("z", "FP32", (1, 4), x)]))
    fakes.down.add("b")
    with pytest.raises(Unavailable, match=r"stage 1 \('s1'\)"):
        await pipes.infer(request(x))
    with pytest.raises(Unavailable, match=r"stage 1 \('s1'\) is not ready here and no live peer"):
        await fakes.pipelines().metadata("p")  # a fresh set: nobody left to describe s1
    fakes.down.clear()
    STAGES["s2"] = info("s2", ["y"], ["w"])
    try:
        broken = PipelineSet([Pipeline("q", ("s0", "s2"))], local_info=lambda m: STAGES.get(m),
                             peer_targets=lambda m: [], describe_peer=lambda: None, infer=fakes.infer)
        with pytest.raises(InvalidArgument, match=r"stage 1 \('s2'\) needs input\(s\) \['y'\]"):
            await broken.infer(InferRequest("q", "", "", [Tensor("x", "FP32", (1, 4), x)]))
    finally:
        del STAGES["s2"]


def test_pipelines_cannot_nest():
    with pytest.raises(ValueError, match="is a pipeline"):
        PipelineSet([Pipeline("p", ("q",)), Pipeline("q", ("s0",))], local_info=lambda m: None,
                    peer_targets=lambda m: [], describe_peer=lambda: None, infer=None)
    with pytest.raises(ValueError):
        Pipeline("p", ())


def test_config_pipelines_key():
    cfg = parse_config({"pipelines": {"cnn": {"stages": ["cnn_stage0", "cnn_stage1"]}}})
    assert cfg.pipelines == {"cnn": ("cnn_stage0", "cnn_stage1")}
    assert parse_config({}).pipelines == {}
    for bad in ({"cnn": {"stages": []}}, {"cnn": {"stages": ["a", ""]}}, {"cnn": {"stages": "a"}},
                {"cnn": {"stages": ["a"], "extra": 1}}, {"cnn": ["a"]}, ["cnn"],
                {"p": {"stages": ["q"]}, "q": {"stages": ["a"]}}):
        with pytest.raises(ConfigError, match="pipelines"):
            parse_config({"pipelines": bad})
