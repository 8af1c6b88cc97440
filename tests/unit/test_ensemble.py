"""core.ensemble: the config read into a plan, the DAG checked against step specs, and the step
engine's order and concurrency with fake step runners (no server, no onnxruntime)."""
from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from gt_serve.core.ensemble import (StepNeedsInputs, complete_ensemble_config, plan_from_config, prepare_ensemble,
                                    run_dag, run_ensemble, step_request)
from gt_serve.core.model_config import parse_pbtxt, spec_from_config
from gt_serve.core.ragged import RaggedSettings
from gt_serve.errors import ConfigError, InvalidArgument, Unavailable
from gt_serve.types import InferRequest, InferResponse, RequestedOutput, Tensor

WAIT_S = 5.0


def model_spec(name: str, inputs: dict, outputs: dict, mbs: int = 8, dtype: str = "TYPE_FP32"):
    tensors = lambda kind, items: " ".join(  # noqa: E731
        f'{kind} {{ name: "{n}" data_type: {dtype} dims: [ {w} ] }}' for n, w in items.items())
    cfg = parse_pbtxt(f'name: "{name}" max_batch_size: {mbs} {tensors("input", inputs)} {tensors("output", outputs)}',
                      name)
    return spec_from_config(cfg, Path("/nonexistent"))


SPECS = {"pre": model_spec("pre", {"INPUT": 4}, {"OUTPUT": 4}),
         "mid": model_spec("mid", {"INPUT": 4}, {"OUTPUT": 4}),
         "join": model_spec("join", {"A": 4, "B": 4}, {"SUM": 4})}


def step(model: str, ins: dict, outs: dict) -> str:
    maps = "".join(f' input_map {{ key: "{k}" value: "{v}" }}' for k, v in ins.items())
    maps += "".join(f' output_map {{ key: "{k}" value: "{v}" }}' for k, v in outs.items())
    return f'{{ model_name: "{model}" model_version: -1{maps} }}'


DIAMOND = [step("pre", {"INPUT": "X"}, {"OUTPUT": "h"}), step("mid", {"INPUT": "h"}, {"OUTPUT": "l"}),
           step("mid", {"INPUT": "h"}, {"OUTPUT": "r"}), step("join", {"A": "l", "B": "r"}, {"SUM": "Y"})]


def config(steps: list[str], x: str = "TYPE_FP32 dims: [ 4 ]", y: str = "TYPE_FP32 dims: [ 4 ]",
           extra: str = "") -> mc.ModelConfig:
    return parse_pbtxt(f'name: "e" platform: "ensemble" max_batch_size: 4 {extra}'
                       f' input {{ name: "X" data_type: {x} }} output {{ name: "Y" data_type: {y} }}'
                       f' ensemble_scheduling {{ step [ {", ".join(steps)} ] }}', "e")


def prepare(cfg: mc.ModelConfig, plans: dict | None = None):
    def step_spec(s):
        if s.model not in SPECS:
            raise InvalidArgument(f"{s.label}: unknown model")
        return SPECS[s.model]

    return prepare_ensemble(cfg, "e", step_spec, lambda m: (plans or {}).get(m))


def test_a_valid_diamond_becomes_a_plan():
    plan = prepare(config(DIAMOND))
    assert [s.model for s in plan.steps] == ["pre", "mid", "mid", "join"]
    assert plan.steps[3].needs == ("l", "r") and plan.steps[0].gives == ("h",)
    assert plan.inputs == ("X",) and plan.outputs == ("Y",)


@pytest.mark.parametrize("steps, x, words", [
    ([step("mid", {"INPUT": "b"}, {"OUTPUT": "a"}), step("mid", {"INPUT": "a"}, {"OUTPUT": "b"}),
      step("pre", {"INPUT": "X"}, {"OUTPUT": "Y"})], None, r"cycle: step 0 \('mid'\), step 1 \('mid'\)"),
    ([step("pre", {"INPUT": "X"}, {"OUTPUT": "Y"}), step("mid", {"INPUT": "X"}, {"OUTPUT": "Y"})], None,
     r"tensor 'Y' is produced twice \(step 0 \('pre'\) and step 1 \('mid'\)\)"),
    ([step("pre", {"INPUT": "X"}, {"OUTPUT": "X"})], None, "tensor 'X' is produced twice"),
    ([step("pre", {"INPUT": "X"}, {"OUTPUT": "h"})], None, "output 'Y' is not produced by any step"),
    ([step("pre", {"INPUT": "nowhere"}, {"OUTPUT": "Y"})], None, "reads tensor 'nowhere'"),
    ([step("join", {"A": "X"}, {"SUM": "Y"})], None, r"step 0 \('join'\) leaves input 'B'"),
    ([step("pre", {"NOPE": "X", "INPUT": "X"}, {"OUTPUT": "Y"})], None, "maps input 'NOPE'"),
    ([step("pre", {"INPUT": "X"}, {"NOPE": "Y"})], None, "maps output 'NOPE'"),
    ([step("ghost", {"INPUT": "X"}, {"OUTPUT": "Y"})], None, r"step 0 \('ghost'\): unknown model"),
    ([step("e", {"INPUT": "X"}, {"OUTPUT": "Y"})], None, "is the ensemble itself"),
    ([step("pre", {"INPUT": "X"}, {"OUTPUT": "Y"})], "TYPE_INT32 dims: [ 4 ]", "takes FP32 but tensor 'X'"),
    ([step("pre", {"INPUT": "X"}, {"OUTPUT": "Y"})], "TYPE_FP32 dims: [ 2, 2 ]", r"shape \[-1, 4\]"),
])
def test_bad_dags_are_refused_naming_step_and_tensor(steps, x, words):
    with pytest.raises(InvalidArgument, match=words):
        prepare(config(steps, x=x or "TYPE_FP32 dims: [ 4 ]"))


def test_unused_input_and_batch_limit_and_nested_cycle():
    two_inputs = config([step("pre", {"INPUT": "X"}, {"OUTPUT": "Y"})], extra='input { name: "Z" data_type: '
                        "TYPE_FP32 dims: [ 4 ] }")
    with pytest.raises(InvalidArgument, match="input 'Z' is not read by any step"):
        prepare(two_inputs)
    big = config([step("pre", {"INPUT": "X"}, {"OUTPUT": "Y"})])
    big.max_batch_size = 16
    with pytest.raises(InvalidArgument, match="max_batch_size 8, less than the ensemble's 16"):
        prepare(big)
    SPECS["inner"] = SPECS["pre"]
    try:
        inner = prepare(config([step("pre", {"INPUT": "X"}, {"OUTPUT": "Y"})]))
        looping = type(inner)("inner", (type(inner.steps[0])(0, "e", "", (), ()),), (), ())
        with pytest.raises(InvalidArgument, match="leads back to 'e' through nested ensembles"):
            prepare(config([step("inner", {"INPUT": "X"}, {"OUTPUT": "Y"})]), {"inner": looping})
    finally:
        del SPECS["inner"]


@pytest.mark.parametrize("text, words", [
    ('name: "e" platform: "ensemble" input { name: "X" data_type: TYPE_FP32 dims: [4] } '
     'output { name: "Y" data_type: TYPE_FP32 dims: [4] }', "needs ensemble_scheduling with at least one step"),
    ('name: "e" platform: "ensemble" instance_group { count: 2 } ensemble_scheduling { step [ { model_name: "pre" } ] }',
     "config field 'instance_group.count' does not apply to an ensemble"),
    ('name: "e" platform: "ensemble" input { name: "X" } output { name: "Y" data_type: TYPE_FP32 dims: [4] } '
     'ensemble_scheduling { step [ { model_name: "pre" } ] }', "input 'X' needs data_type and dims"),
    ('name: "other" platform: "ensemble" ensemble_scheduling { step [ { model_name: "pre" } ] }',
     "does not match the directory name"),
    ('name: "e" platform: "ensemble" metric_tags { key: "bad key" value: "x" } '
     'ensemble_scheduling { step [ { model_name: "pre" } ] }', "metric_tags key 'bad key'"),
])
def test_ensemble_configs_are_checked(text, words):
    with pytest.raises(ConfigError, match=words):
        complete_ensemble_config(parse_pbtxt(text, "e"), "e")


def test_an_ensemble_may_tag_its_metrics():
    """Triton's ensemble scheduler reports the ensemble's metrics with its config's metric_tags, as a model's."""
    cfg = config([step("pre", {"INPUT": "X"}, {"OUTPUT": "Y"})], extra='metric_tags { key: "team" value: "v" }')
    assert prepare(cfg).steps and dict(cfg.metric_tags) == {"team": "v"}


def test_an_ensembles_parameters_load_with_a_warning(caplog):
    """Triton loads an ensemble config's parameters (a config may carry keys for other tools); no backend reads
    them, and the load says so."""
    cfg = config([step("pre", {"INPUT": "X"}, {"OUTPUT": "Y"})],
                 extra='parameters { key: "owner" value: { string_value: "vision" } }')
    with caplog.at_level("WARNING"):
        assert prepare(cfg).steps
    assert "ensemble e: parameters key 'owner' is ignored" in caplog.text


def test_step_versions_are_read():
    cfg = config([step("pre", {"INPUT": "X"}, {"OUTPUT": "Y"}).replace("model_version: -1", "model_version: 3")])
    assert plan_from_config(cfg).steps[0].version == "3"
    cfg.ensemble_scheduling.step[0].model_version = 0
    with pytest.raises(InvalidArgument, match="model_version 0"):
        plan_from_config(cfg)


def _t(name: str, value: float = 0.0) -> Tensor:
    data = np.full((1, 4), value, np.float32)
    return Tensor(name, "FP32", data.shape, data)


@pytest.mark.asyncio
async def test_ready_steps_run_concurrently_and_in_dependency_order():
    """Diamond: l and r both wait for h; each waits until the other has started (so they must overlap)."""
    started = {i: asyncio.Event() for i in range(4)}
    order: list[int] = []
    needs = [["X"], ["h"], ["h"], ["l", "r"]]
    gives = [{"h"}, {"l"}, {"r"}, {"Y"}]

    async def run_step(i, pool):
        order.append(i)
        started[i].set()
        if i in (1, 2):
            await asyncio.wait_for(started[3 - i].wait(), WAIT_S)  # both branches in flight at once
        return {n: _t(n) for n in gives[i]}

    pool = await asyncio.wait_for(run_dag(needs, {"X": _t("X")}, run_step), WAIT_S)
    assert order[0] == 0 and sorted(order[1:3]) == [1, 2] and order[3] == 3
    assert set(pool) == {"X", "h", "l", "r", "Y"}


@pytest.mark.asyncio
async def test_a_failing_step_cancels_the_others_and_stops_the_dag():
    cancelled, ran = asyncio.Event(), []

    async def run_step(i, pool):
        ran.append(i)
        if i == 0:
            raise Unavailable("step model down")
        try:
            await asyncio.Event().wait()  # a step that never finishes by itself: only a cancellation ends it
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return {}

    with pytest.raises(Unavailable, match="step model down"):
        await asyncio.wait_for(run_dag([["X"], ["X"], ["a"]], {"X": _t("X")}, run_step), WAIT_S)
    assert cancelled.is_set() and 2 not in ran


@pytest.mark.asyncio
async def test_a_step_without_inputs_is_named():
    async def run_step(i, pool):
        return {}

    with pytest.raises(StepNeedsInputs, match=r"step 1 needs input\(s\) \['b'\]"):
        await run_dag([["X"], ["b"]], {"X": _t("X")}, run_step)


@pytest.mark.asyncio
async def test_run_ensemble_maps_tensors_and_names_the_failing_step():
    plan = prepare(config(DIAMOND))
    seen: list[InferRequest] = []

    async def infer(req: InferRequest) -> InferResponse:
        seen.append(req)
        x = req.inputs[0].data
        if req.model_name == "join":
            y = req.inputs[0].data + req.inputs[1].data
            return InferResponse("join", "1", req.id, [Tensor("SUM", "FP32", y.shape, y)])
        factor = 2.0 if req.model_name == "pre" else 3.0
        return InferResponse(req.model_name, "1", req.id, [Tensor("OUTPUT", "FP32", x.shape, x * factor)])

    request = InferRequest("e", "", "id7", [], None, {"k": "v"}, 12.5, 2, 1)
    out = await run_ensemble(plan, request, {"X": _t("X", 1.0)}, infer)
    np.testing.assert_allclose(out["Y"].data, np.full((1, 4), 12.0))
    assert out["Y"].name == "Y" and [r.inputs[0].name for r in seen] == ["INPUT", "INPUT", "INPUT", "A"]
    assert all(r.id == "id7" and r.deadline_s == 12.5 and r.priority == 2 and r.parameters == {"k": "v"}
               and [o.name for o in r.outputs] == [("SUM" if r.model_name == "join" else "OUTPUT")] for r in seen)

    async def broken(req: InferRequest) -> InferResponse:
        if req.model_name == "join":
            raise Unavailable("model 'join' is not ready")
        return await infer(req)

    with pytest.raises(Unavailable, match=r"ensemble 'e' step 3 \('join'\): model 'join' is not ready"):
        await run_ensemble(plan, request, {"X": _t("X", 1.0)}, broken)


def test_a_steps_request_has_a_form_only_where_its_inputs_and_outputs_are_plain():
    """The form lets the step model check a step's request once per shape (core/request_checks.check_request); a
    request whose data or answer lies elsewhere (shared memory, BYTES, classification) is checked every time."""
    req = InferRequest("ens", parameters={"binary_data_output": True})
    x = np.zeros((2, 4), np.float32)

    def form(inputs, outputs=None):
        return step_request(req, "m", "", inputs, outputs).form

    plain = form([Tensor("INPUT", "FP32", (2, 4), x)], [RequestedOutput("OUTPUT")])
    assert plain is not None and plain == form([Tensor("INPUT", "FP32", [2, 4], x + 1)], [RequestedOutput("OUTPUT")])
    assert plain != form([Tensor("INPUT", "FP32", (3, 4), np.zeros((3, 4), np.float32))], [RequestedOutput("OUTPUT")])
    assert plain != form([Tensor("INPUT", "FP32", (2, 4), x)], [RequestedOutput("OTHER")])
    assert form([Tensor("S", "BYTES", (1, 1), np.array([[b"a"]], object))]) is None
    assert form([Tensor("INPUT", "FP32", (2, 4), None, {"shared_memory_region": "in"})]) is None
    assert form([Tensor("INPUT", "FP32", (2, 4), x)],
                [RequestedOutput("OUTPUT", {"shared_memory_region": "out", "shared_memory_byte_size": 32})]) is None
    assert form([Tensor("INPUT", "FP32", (2, 4), x)], [RequestedOutput("OUTPUT", {"classification": 2})]) is None


def test_an_ensemble_of_a_ragged_step_model_does_not_group_its_requests(monkeypatch):
    """Ragged batching's batch inputs count requests: a group of requests run as one request of their rows would
    change what such a step model computes (core/ragged.py), so its ensemble, and one nesting it, never groups."""
    chain = [step("pre", {"INPUT": "X"}, {"OUTPUT": "h"}), step("mid", {"INPUT": "h"}, {"OUTPUT": "Y"})]
    assert prepare(config(chain)).groups
    monkeypatch.setitem(SPECS, "mid", replace(SPECS["mid"], ragged=RaggedSettings(frozenset({"INPUT"}), (), {})))
    plan = prepare(config(chain))
    assert not plan.groups
    monkeypatch.setitem(SPECS, "inner", model_spec("inner", {"X": 4}, {"Y": 4}))  # an ensemble nesting that one
    nested = [step("inner", {"X": "X"}, {"Y": "Y"})]
    assert not prepare(config(nested), plans={"inner": plan}).groups
    plain = prepare(config([step("pre", {"INPUT": "X"}, {"OUTPUT": "Y"})]))  # no ragged step: groups
    assert prepare(config(nested), plans={"inner": plain}).groups
