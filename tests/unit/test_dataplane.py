"""The DataPlane façade over its collaborators (core/dataplane.py): metadata, readiness, local
inference with its checks and outputs, routing to the fleet (empty link, connected link, hop limit,
shared memory pinned here), model control and typed errors.

Real parts: a real ModelRegistry over real ONNX files (described by onnxruntime), a real FleetRouter
and NodeView. Fakes only where the real thing needs threads or sockets: the executor (a numpy
stand-in for batcher + lanes, which tests/unit/test_model_executor.py covers) and the peer client.
"""
from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from gt_serve.testing import model_builders as mb
from gt_serve.backends.onnx_runner import describe_model
from gt_serve.core.dataplane import HOPS_PARAMETER, DataPlane
from gt_serve.core.fleet import FleetRouter
from gt_serve.core.fleet_call import VISITED_PARAMETER
from gt_serve.core.fleet_link import FleetLink
from gt_serve.core.model_control import ModelControl, Readiness
from gt_serve.core.node_view import NodeView
from gt_serve.core.outlier import OutlierDetector
from gt_serve.core.registry import ModelRegistry, Opened
from gt_serve.core.router import Router
from gt_serve.core.sequences import held_here
from gt_serve.core.shared_memory import SystemSharedMemory
from gt_serve.edge.messages import Caps, Status, Telemetry
from gt_serve.errors import (
    InvalidArgument,
    InvalidInput,
    ModelNotFound,
    Unavailable,
    Unsupported,
)
from gt_serve.types import InferRequest, InferResponse, RequestedOutput, Tensor

BOUND_S = 5.0  # every async test ends long before this


class ScaleExecutor:
    """Stands in for ModelExecutor: OUTPUT = INPUT * factor, recording what it was given."""

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.calls: list[tuple[int, tuple, int, float | None]] = []

    async def submit(self, feeds, batch_size, shape_key, priority, deadline_s):
        self.calls.append((batch_size, shape_key, priority, deadline_s))
        return [feeds["INPUT"] * self.factor]

    async def close(self, drain_timeout_s: float) -> None:
        pass


class NumpyHost:
    """A ModelHost that gives each model a ScaleExecutor (factor 2) instead of sessions on lanes."""

    def __init__(self) -> None:
        self.opened: list[str] = []

    def open(self, model) -> Opened:
        self.opened.append(model.name)
        return Opened(ScaleExecutor(2.0), ["numpy"])

    async def close(self, model, drain_timeout_s: float) -> None:
        await model.executor.close(drain_timeout_s)


class FakePeers:
    """The peer client (edge/peer_client.PeerClient's two calls), answering from memory."""

    def __init__(self) -> None:
        self.forwarded: list[tuple[str, str, InferRequest, frozenset, bool]] = []

    async def forward(self, node, endpoint, request, deadline_s, visited, verified) -> InferResponse:
        self.forwarded.append((node, endpoint, request, visited, verified))
        x = request.inputs[0].data
        return InferResponse(request.model_name, "1", request.id, [Tensor("OUTPUT", "FP32", x.shape, x * 10)],
                             {"gt_served_by": node})

    async def describe(self, node, endpoint, model, verified):
        raise AssertionError("no pipeline in these tests")


def make_repo(root):
    mb.scale(root / "scaled" / "1" / "model.onnx")
    mb.scale(root / "other" / "1" / "model.onnx")
    mb.add_one_fixed(root / "fixed" / "1" / "model.onnx")
    return root


async def make_plane(tmp_path, *, mode: str = "explicit", fleet: FleetLink | None = None, load=("scaled", "fixed"),
                     **kwargs) -> tuple[DataPlane, ModelRegistry, Readiness]:
    registry = ModelRegistry(make_repo(tmp_path), describe_model, NumpyHost())
    for name in load:
        await registry.load(name)
    readiness = Readiness(registry)
    plane = DataPlane(registry, ModelControl(registry, mode), readiness, fleet=fleet, **kwargs)
    return plane, registry, readiness


def request(model: str = "scaled", batch: int = 1, **kwargs) -> InferRequest:
    x = np.arange(4 * batch, dtype=np.float32).reshape(batch, 4)
    return InferRequest(model, "", "r1", [Tensor("INPUT", "FP32", (batch, 4), x)], **kwargs)


def peer_fleet(node: str = "a", peer: str = "b") -> FleetRouter:
    """A real FleetRouter whose view holds one ready peer serving 'scaled' fast; nothing local to score."""
    view = NodeView(self_node=node, period_s=1.0)
    now_s = time.monotonic()
    view.update(Status(node=peer, epoch=1, state="ready", ts_s=0.0), now_s, verified=True)
    view.update(Caps(node=peer, epoch=1, endpoints={"grpc": f"{peer}:8001"}, models=("scaled",)), now_s,
                verified=True)
    view.update(Telemetry(node=peer, epoch=1, seq=1, ts_s=0.0, queue_depth=0, latency_ms={"scaled": 1.0}), now_s,
                verified=True)
    return FleetRouter(node, view, Router("latency"), local_row=lambda model, now_s: None, budget_s=BOUND_S,
                       outliers=OutlierDetector())


# ------------------------------------------------------------------------------- metadata

@pytest.mark.asyncio
async def test_metadata_config_and_model_readiness(tmp_path):
    plane, _, _ = await make_plane(tmp_path)
    meta = await plane.model_metadata("scaled")
    assert meta["versions"] == ["1"] and meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [{"name": "INPUT", "datatype": "FP32", "shape": [-1, 4]}]
    assert (await plane.model_metadata("fixed"))["outputs"] == [{"name": "OUTPUT", "datatype": "FP32", "shape": [4]}]
    assert (await plane.model_config("scaled")).max_batch_size == 4
    assert await plane.model_ready("scaled") and await plane.model_ready("scaled", "1")
    assert not await plane.model_ready("scaled", "7") and not await plane.model_ready("nope")
    assert not await plane.model_ready("other")  # on disk, not loaded
    with pytest.raises(ModelNotFound, match="'nope'") as info:
        await plane.model_metadata("nope")
    assert info.value.kind == "model_not_found"
    server = plane.server_metadata()
    assert server["name"] == "gt_serve" and "model_repository" in server["extensions"]


# ------------------------------------------------------------------------------- readiness

@pytest.mark.asyncio
async def test_strict_readiness_waits_for_a_failed_start_up_model_then_draining_ends_it(tmp_path):
    plane, _, readiness = await make_plane(tmp_path)
    assert plane.live() and not plane.ready()  # not ready until App says so
    readiness.set_ready(True, waiting_for=("other",))
    assert not plane.ready()
    await plane.load_model("other", {})
    assert plane.ready() and await plane.model_ready("other")
    readiness.set_draining()
    assert not plane.ready() and plane.live()
    with pytest.raises(Unavailable, match="shutting down"):
        await plane.infer(request())


# ------------------------------------------------------------------------------- local inference

@pytest.mark.asyncio
async def test_infer_here_runs_the_checked_request_and_echoes_free_parameters(tmp_path):
    plane, registry, _ = await make_plane(tmp_path, default_timeout_s=30.0)
    before_s = time.monotonic()
    resp = await plane.infer(request(batch=2, priority=3, parameters={"tag": "x", HOPS_PARAMETER: 1}))
    (out,) = resp.outputs
    assert out.name == "OUTPUT" and out.shape == (2, 4)
    np.testing.assert_array_equal(out.data, np.arange(8, dtype=np.float32).reshape(2, 4) * 2)
    assert resp.parameters == {"tag": "x"}  # gt_hops is a transport directive, not echoed
    ((batch, shape_key, priority, deadline_s),) = registry.get("scaled").executor.calls
    assert batch == 2 and shape_key == ((4,),) and priority == 3
    assert before_s + 30.0 <= deadline_s <= time.monotonic() + 30.0  # the server's default timeout


@pytest.mark.asyncio
async def test_requested_outputs_and_classification(tmp_path):
    plane, _, _ = await make_plane(tmp_path)
    resp = await plane.infer(request(outputs=[RequestedOutput("OUTPUT", {"classification": 2})]))
    (out,) = resp.outputs
    assert out.datatype == "BYTES" and out.shape == (1, 2)
    assert list(out.data[0]) == [b"6.000000:3", b"4.000000:2"]  # top 2 of [0, 2, 4, 6]


@pytest.mark.asyncio
async def test_bad_requests_are_typed_errors_naming_the_problem_and_count_as_failures(tmp_path):
    plane, registry, _ = await make_plane(tmp_path, max_batch_size=2)
    bad = [
        (request(batch=3), "batch-size must be <= 2"),
        (InferRequest("scaled", inputs=[Tensor("NOPE", "FP32", (1, 4), np.zeros((1, 4), np.float32))]),
         "unexpected inference input 'NOPE'"),
        (InferRequest("scaled", inputs=[Tensor("INPUT", "INT32", (1, 4), np.zeros((1, 4), np.int32))]),
         "data-type is 'INT32'"),
        (InferRequest("scaled", inputs=[Tensor("INPUT", "FP32", (1, 3), np.zeros((1, 3), np.float32))]),
         "unexpected shape for input 'INPUT' for model 'scaled'"),
        (request(outputs=[RequestedOutput("OUTPUT", {"classification": 0})]), "positive integer"),
        (request(outputs=[RequestedOutput("NOPE")]), "unexpected inference output 'NOPE'"),
        (InferRequest("scaled", inputs=[Tensor("INPUT", "FP32", (1, 4), None)]), "input 'INPUT' has no data"),
    ]
    for req, words in bad:
        with pytest.raises(InvalidArgument, match=words):
            await plane.infer(req)
    assert registry.get("scaled").executor.calls == []  # nothing reached the executor
    stats = await plane.statistics("scaled")
    assert stats["model_stats"][0]["inference_stats"]["fail"]["count"] == len(bad)
    with pytest.raises(ModelNotFound):
        await plane.infer(request("nope"))
    await plane.unload_model("fixed")
    with pytest.raises(Unavailable, match="no available versions"):  # known, unloaded
        await plane.infer(InferRequest("fixed", inputs=[Tensor("INPUT", "FP32", (4,), np.zeros(4, np.float32))]))


@pytest.mark.asyncio
async def test_a_request_form_is_checked_once_per_loaded_model(tmp_path):
    plane, registry, _ = await make_plane(tmp_path, load=("scaled",))
    form = object()  # what a front end's request skeleton is: one object per form
    wanted = [RequestedOutput("OUTPUT")]
    first = await plane.infer(request(batch=2, outputs=list(wanted), form=form))
    model = registry.get("scaled")
    assert set(model.checked_forms) == {form}
    # a later request of the form runs without its checks, with its own data, outputs and shape key
    later = request(batch=2, outputs=list(wanted), form=form)
    later.inputs[0].data = later.inputs[0].data + 1
    resp = await plane.infer(later)
    np.testing.assert_array_equal(resp.outputs[0].data, (first.outputs[0].data / 2 + 1) * 2)
    assert [c[:2] for c in model.executor.calls] == [(2, ((4,),)), (2, ((4,),))]
    # a reloaded model is a new version object: its forms start empty, and a bad form is never kept
    await plane.unload_model("scaled")
    await plane.load_model("scaled", {})
    assert registry.get("scaled").checked_forms == {}
    bad = object()
    for _ in range(2):
        with pytest.raises(InvalidArgument, match="unexpected inference output 'NOPE'"):
            await plane.infer(request(outputs=[RequestedOutput("NOPE")], form=bad))
    assert bad not in registry.get("scaled").checked_forms
    # an output written to shared memory is checked every time (its region may be unregistered in between)
    shm_out = RequestedOutput("OUTPUT", {"shared_memory_region": "r0", "shared_memory_byte_size": 16})
    with pytest.raises(InvalidArgument, match="r0"):
        await plane.infer(request(outputs=[shm_out], form=object()))
    assert registry.get("scaled").checked_forms == {}


@pytest.mark.asyncio
async def test_a_form_in_shared_memory_reads_and_looks_up_its_regions_each_time(tmp_path):
    root = tmp_path / "shm"
    root.mkdir()
    for key in ("in", "out"):
        (root / key).write_bytes(bytes(16))
    plane, registry, _ = await make_plane(tmp_path, load=("scaled",), shm=SystemSharedMemory(str(root)))
    await plane.shm_register("in", "/in", 0, 16)
    await plane.shm_register("out", "/out", 0, 16)
    form = object()

    def shm_request() -> InferRequest:
        return InferRequest("scaled", "", "r1", [Tensor("INPUT", "FP32", (1, 4), None, {
            "shared_memory_region": "in", "shared_memory_byte_size": 16})], [RequestedOutput("OUTPUT", {
                "shared_memory_region": "out", "shared_memory_byte_size": 16})], form=form)

    for step in range(3):  # the client writes new data into its region between requests
        with open(root / "in", "r+b") as f:
            f.write((np.arange(4, dtype=np.float32) + step).tobytes())
        resp = await plane.infer(shm_request())
        assert resp.outputs[0].data is None and resp.outputs[0].parameters["shared_memory_region"] == "out"
        np.testing.assert_array_equal(np.frombuffer((root / "out").read_bytes(), np.float32),
                                      (np.arange(4) + step) * 2)
    assert set(registry.get("scaled").checked_forms) == {form}
    # a region unregistered after the form was checked: the error a first request gets
    await plane.shm_unregister("out")
    with pytest.raises(InvalidArgument, match="'out'.*not registered"):
        await plane.infer(shm_request())
    await plane.shm_unregister("in")
    with pytest.raises(InvalidArgument, match="'in'.*not registered"):
        await plane.infer(shm_request())
    plane.close()


def test_invalid_input_names_the_input_once():
    named = InvalidInput("x", "bad data")
    assert named.message == "input 'x': bad data" and named.input_name == "x"
    assert InvalidInput.for_input("x", named) is named
    other = InvalidInput.for_input("y", named)  # another input's error is prefixed, never dropped
    assert other.message == "input 'y': input 'x': bad data" and other.input_name == "y"
    plain = InvalidInput.for_input("x", InvalidArgument("invalid datatype 'F99'"))
    assert plain.message == "input 'x': invalid datatype 'F99'"


# ------------------------------------------------------------------------------- fleet routing

@pytest.mark.asyncio
async def test_an_empty_fleet_link_serves_here_until_connected_then_the_router_picks_the_peer(tmp_path):
    link = FleetLink(max_hops=2)
    plane, registry, _ = await make_plane(tmp_path, fleet=link)
    resp = await plane.infer(request())
    assert resp.outputs[0].data[0, 1] == 2.0  # here (x2): the link is not connected yet
    peers = FakePeers()
    link.connect(peer_fleet(), peers)
    with pytest.raises(RuntimeError, match="already connected"):
        link.connect(peer_fleet(), peers)
    async with asyncio.timeout(BOUND_S):
        resp = await plane.infer(request(parameters={VISITED_PARAMETER: "z"}))
    assert resp.parameters["gt_served_by"] == "b" and resp.outputs[0].data[0, 1] == 10.0
    ((node, endpoint, _, visited, verified),) = peers.forwarded
    assert (node, endpoint, verified) == ("b", "b:8001", True)
    assert visited == {"a", "z"}  # this node and the ones the request passed
    assert len(registry.get("scaled").executor.calls) == 1  # only the first request ran here


@pytest.mark.asyncio
async def test_hop_limit_and_shared_memory_keep_a_request_here(tmp_path):
    link = FleetLink(max_hops=2)
    link.connect(peer_fleet(), FakePeers())
    plane, registry, _ = await make_plane(tmp_path, fleet=link)
    resp = await plane.infer(request(parameters={HOPS_PARAMETER: 2}))
    assert "gt_served_by" not in resp.parameters and resp.outputs[0].data[0, 1] == 2.0
    shm_out = RequestedOutput("OUTPUT", {"shared_memory_region": "r0", "shared_memory_byte_size": 16})
    with pytest.raises(InvalidArgument, match="r0"):  # checked here: this node's region table has no 'r0'
        await plane.infer(request(outputs=[shm_out]))
    assert len(registry.get("scaled").executor.calls) == 1


@pytest.mark.asyncio
async def test_a_sequence_stays_where_its_state_is_and_a_stateless_request_naming_one_is_routed(tmp_path):
    link = FleetLink(max_hops=2)
    link.connect(peer_fleet(), FakePeers())
    plane, registry, _ = await make_plane(tmp_path, fleet=link)
    async with asyncio.timeout(BOUND_S):
        resp = await plane.infer(request(parameters={"sequence_id": 7, "sequence_start": True}))
    assert resp.parameters["gt_served_by"] == "b"  # 'scaled' keeps no state: routed as any request is
    mb.accumulator(tmp_path / "acc" / "1" / "model.onnx")
    (tmp_path / "acc" / "config.pbtxt").write_text(mb.ACCUMULATOR_CONFIG % (1_000_000, "TYPE_UINT64"))
    await registry.load("acc")
    assert held_here(registry, InferRequest("acc", parameters={"sequence_id": 7}))
    assert not held_here(registry, InferRequest("acc"))  # no sequence named: the model's own error, here or there
    assert not held_here(registry, InferRequest("scaled", parameters={"sequence_id": 7}))
    assert not held_here(registry, InferRequest("elsewhere", parameters={"sequence_id": 7}))  # a peer's to serve


# ------------------------------------------------------------------------------- model control

@pytest.mark.asyncio
async def test_model_control_mode_and_repository_index(tmp_path):
    plane, _, _ = await make_plane(tmp_path, mode="none")
    with pytest.raises(Unsupported, match="explicit"):
        await plane.load_model("other", {})
    with pytest.raises(Unsupported, match="explicit"):
        await plane.unload_model("scaled")
    index = {row["name"]: row["state"] for row in await plane.repository_index()}
    assert index == {"scaled": "READY", "fixed": "READY", "other": "UNAVAILABLE"}
    assert {row["name"] for row in await plane.repository_index(ready_only=True)} == {"scaled", "fixed"}
    plane, _, _ = await make_plane(tmp_path / "explicit")
    with pytest.raises(InvalidArgument, match="'config' must be a JSON string"):
        await plane.load_model("other", {"config": 5})
    await plane.unload_model("scaled")
    assert not await plane.model_ready("scaled")


@pytest.mark.asyncio
async def test_a_pipeline_may_not_take_a_model_name(tmp_path):
    with pytest.raises(InvalidArgument, match="pipeline 'scaled' has the name of a model"):
        await make_plane(tmp_path, pipelines={"scaled": ["fixed"]})
    plane, _, _ = await make_plane(tmp_path / "p", pipelines={"chain": ["scaled"]})
    assert await plane.model_ready("chain")
    assert (await plane.model_metadata("chain"))["platform"] == "pipeline"


# ------------------------------------------------------------------------------- draining

class GatedExecutor(ScaleExecutor):
    """A ScaleExecutor whose first call waits for `gate`, saying so on `entered`."""

    def __init__(self, factor: float) -> None:
        super().__init__(factor)
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()

    async def submit(self, feeds, batch_size, shape_key, priority, deadline_s):
        if not self.entered.is_set():
            self.entered.set()
            await asyncio.wait_for(self.gate.wait(), BOUND_S)
        return await super().submit(feeds, batch_size, shape_key, priority, deadline_s)


class GatedHost(NumpyHost):
    def __init__(self) -> None:
        super().__init__()
        self.executor = GatedExecutor(2.0)

    def open(self, model) -> Opened:
        self.opened.append(model.name)
        return Opened(self.executor, ["numpy"])


TWICE = """name: "twice" platform: "ensemble" max_batch_size: 4
input { name: "X" data_type: TYPE_FP32 dims: [ 4 ] }
output { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }
ensemble_scheduling { step [
  { model_name: "scaled" model_version: -1
    input_map { key: "INPUT" value: "X" } output_map { key: "OUTPUT" value: "h" } },
  { model_name: "scaled" model_version: -1
    input_map { key: "INPUT" value: "h" } output_map { key: "OUTPUT" value: "Y" } }
] }
"""


@pytest.mark.asyncio
async def test_an_ensemble_admitted_before_the_drain_runs_its_later_steps_and_new_requests_are_refused(tmp_path):
    (tmp_path / "twice" / "1").mkdir(parents=True)
    (tmp_path / "twice" / "config.pbtxt").write_text(TWICE)
    host = GatedHost()
    registry = ModelRegistry(make_repo(tmp_path), describe_model, host)
    await registry.load("scaled")
    await registry.load("twice")
    readiness = Readiness(registry)
    plane = DataPlane(registry, ModelControl(registry, "explicit"), readiness)
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    running = asyncio.ensure_future(plane.infer(InferRequest("twice", "", "e1", [Tensor("X", "FP32", (1, 4), x)])))
    await asyncio.wait_for(host.executor.entered.wait(), BOUND_S)  # the first step is in its model's queue
    readiness.set_draining()
    with pytest.raises(Unavailable, match="shutting down"):
        await plane.infer(InferRequest("twice", "", "e2", [Tensor("X", "FP32", (1, 4), x)]))
    host.executor.gate.set()
    response = await asyncio.wait_for(running, BOUND_S)
    np.testing.assert_array_equal(response.outputs[0].data, x * 4)  # both steps ran
    assert len(host.executor.calls) == 2
