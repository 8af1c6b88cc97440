"""Triton ensembles end to end: a real server over a repository of generated ONNX models and
`platform: "ensemble"` configs; tritonclient over HTTP and gRPC; bad ensembles refused by name."""
from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from gt_serve.testing import model_builders as mb
from tests.conftest import start_server

STEP = '''  {{ model_name: "{model}" model_version: -1
    input_map {{ key: "{ki}" value: "{vi}" }}
    output_map {{ key: "{ko}" value: "{vo}" }} }}'''


def _ensemble(root: Path, name: str, steps: list[str], inputs: str, outputs: str, mbs: int = 4) -> None:
    (root / name / "1").mkdir(parents=True)  # Triton's layout: an empty version directory
    (root / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {mbs}\n'
        f"input [ {inputs} ]\noutput [ {outputs} ]\n"
        "ensemble_scheduling { step [\n" + ",\n".join(steps) + "\n] }\n")


def _step(model: str, ki: str, vi: str, ko: str, vo: str) -> str:
    return STEP.format(model=model, ki=ki, vi=vi, ko=ko, vo=vo)


def _fp32(name: str, width: int = 4) -> str:
    return f'{{ name: "{name}" data_type: TYPE_FP32 dims: [ {width} ] }}'


JOIN = ('''  { model_name: "join" model_version: -1
    input_map { key: "A" value: "left" } input_map { key: "B" value: "right" }
    output_map { key: "SUM" value: "SUM" } }''')


TABLE = np.arange(20, dtype=np.float32).reshape(5, 4)


def build(root: Path) -> Path:
    for name, factor in (("pre", 2.0), ("mid", 3.0), ("post", 10.0), ("side", 5.0)):
        mb.scale(root / name / "1" / "model.onnx", factor=factor, width=4)
    mb.add_pair(root / "join" / "1" / "model.onnx", width=4)
    # preprocess -> model -> postprocess: RESULT = RAW * 2 * 3 * 10
    _ensemble(root, "chain", [_step("pre", "INPUT", "RAW", "OUTPUT", "h1"), _step("mid", "INPUT", "h1", "OUTPUT", "h2"),
                              _step("post", "INPUT", "h2", "OUTPUT", "RESULT")], _fp32("RAW"), _fp32("RESULT"))
    # a diamond: pre feeds mid and side, join adds them: SUM = 2x*3 + 2x*5 (steps listed out of order)
    _ensemble(root, "diamond", [JOIN, _step("side", "INPUT", "h", "OUTPUT", "right"),
                                _step("mid", "INPUT", "h", "OUTPUT", "left"), _step("pre", "INPUT", "X", "OUTPUT", "h")],
              _fp32("X"), _fp32("SUM"))
    # a lookup (Gather): an index out of range fails inside onnxruntime's run, after every check
    mb.gather(root / "lookup" / "1" / "model.onnx", TABLE)
    _ensemble(root, "lookup_ens", [_step("lookup", "INDICES", "I", "OUTPUT", "ROWS")],
              '{ name: "I" data_type: TYPE_INT64 dims: [ 1 ] }', '{ name: "ROWS" data_type: TYPE_FP32 dims: [ 1, 4 ] }')
    bad = {
        "bad_cycle": [_step("mid", "INPUT", "b", "OUTPUT", "a"), _step("side", "INPUT", "a", "OUTPUT", "b"),
                      _step("post", "INPUT", "X", "OUTPUT", "Y")],
        "bad_missing": [_step("no_such_model", "INPUT", "X", "OUTPUT", "Y")],
        "bad_twice": [_step("pre", "INPUT", "X", "OUTPUT", "Y"), _step("mid", "INPUT", "X", "OUTPUT", "Y")],
        "bad_input": [_step("pre", "NOPE", "X", "OUTPUT", "Y")],
        "bad_unproduced": [_step("pre", "INPUT", "X", "OUTPUT", "Z")],
    }
    for name, steps in bad.items():
        _ensemble(root, name, steps, _fp32("X"), _fp32("Y"))
    _ensemble(root, "bad_dtype", [_step("pre", "INPUT", "X", "OUTPUT", "Y")],
              '{ name: "X" data_type: TYPE_INT32 dims: [ 4 ] }', _fp32("Y"))
    _ensemble(root, "bad_shape", [_step("pre", "INPUT", "X", "OUTPUT", "Y")], _fp32("X", 3), _fp32("Y", 3))
    return root


REFUSED = {
    "bad_cycle": "cycle",
    "bad_missing": "step 0 ('no_such_model') is not a model of the repository",
    "bad_twice": "tensor 'Y' is produced twice",
    "bad_input": "maps input 'NOPE'",
    "bad_unproduced": "output 'Y' is not produced by any step",
    "bad_dtype": "takes FP32 but tensor 'X' (ensemble input) is INT32",
    "bad_shape": "has shape [-1, 4] but tensor 'X' (ensemble input) has shape [-1, 3]",
}


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    server = start_server(build(tmp_path_factory.mktemp("ens_repo")), tmp_path_factory.mktemp("ens_srv"),
                          "--exit-on-error=false", "--strict-readiness=false")
    yield server
    server.stop()


def _http_infer(srv, model: str, name: str, x: np.ndarray, **kw):
    client = httpclient.InferenceServerClient(srv.http_url)
    inp = httpclient.InferInput(name, list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer(model, [inp], **kw)


def _grpc_infer(srv, model: str, name: str, x: np.ndarray, **kw):
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    inp = grpcclient.InferInput(name, list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer(model, [inp], **kw)


def test_chain_over_http_and_grpc(srv):
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_allclose(_http_infer(srv, "chain", "RAW", x).as_numpy("RESULT"), x * 60)
    np.testing.assert_allclose(_grpc_infer(srv, "chain", "RAW", x).as_numpy("RESULT"), x * 60)


def test_diamond_over_http_and_grpc(srv):
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_allclose(_http_infer(srv, "diamond", "X", x).as_numpy("SUM"), x * 16, rtol=1e-6)
    np.testing.assert_allclose(_grpc_infer(srv, "diamond", "X", x).as_numpy("SUM"), x * 16, rtol=1e-6)


def test_concurrent_requests_each_get_their_own_rows_and_a_bad_one_fails_alone(srv):
    """Requests that come together run the ensemble's steps together (core/ensemble_groups.py); one whose index is out
    of range fails the lookup's run, and gets its own error, while the others get their own rows."""
    async def main():
        async with grpcaio.InferenceServerClient(srv.grpc_url) as client:
            async def one(index: int):
                inp = grpcaio.InferInput("I", [1, 1], "INT64")
                inp.set_data_from_numpy(np.array([[index]], np.int64))
                return (await client.infer("lookup_ens", [inp])).as_numpy("ROWS")
            indices = [i % 5 for i in range(40)]
            indices[17] = 99
            return indices, await asyncio.gather(*(one(i) for i in indices), return_exceptions=True)

    indices, results = asyncio.run(main())
    for index, result in zip(indices, results):
        if index == 99:
            assert isinstance(result, InferenceServerException) and "lookup" in str(result), result
        else:
            np.testing.assert_array_equal(result, TABLE[index].reshape(1, 1, 4))
    stats = {s["name"]: s for s in httpclient.InferenceServerClient(srv.http_url).get_inference_statistics(
        "lookup_ens")["model_stats"]}
    assert stats["lookup_ens"]["inference_stats"]["fail"]["count"] >= 1


def test_classification_on_an_ensemble_output(srv):
    x = np.array([[0.1, 0.4, 0.2, 0.3]], dtype=np.float32)
    out = httpclient.InferRequestedOutput("RESULT", class_count=2)
    result = _http_infer(srv, "chain", "RAW", x, outputs=[out]).as_numpy("RESULT")
    assert [v.decode().split(":")[1] for v in result[0]] == ["1", "3"]


def test_ensemble_is_a_model_like_any_other(srv):
    http = httpclient.InferenceServerClient(srv.http_url)
    grpc = grpcclient.InferenceServerClient(srv.grpc_url)
    assert http.is_model_ready("diamond") and grpc.is_model_ready("diamond")
    meta = http.get_model_metadata("diamond")
    assert meta["platform"] == "ensemble" and meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "X", "datatype": "FP32", "shape": [-1, 4]}]
    assert meta["outputs"] == [{"name": "SUM", "datatype": "FP32", "shape": [-1, 4]}]
    cfg = http.get_model_config("diamond")
    assert cfg["platform"] == "ensemble" and len(cfg["ensemble_scheduling"]["step"]) == 4
    assert grpc.get_model_config("diamond").config.ensemble_scheduling.step[0].model_name == "join"
    rows = {r["name"]: r for r in http.get_model_repository_index()}
    assert rows["chain"]["state"] == "READY" and rows["diamond"]["state"] == "READY"


def test_statistics_and_metrics_count_the_ensemble_and_its_steps(srv):
    http = httpclient.InferenceServerClient(srv.http_url)
    before = {s["name"]: s for s in http.get_inference_statistics()["model_stats"]}
    x = np.ones((1, 4), np.float32)
    for _ in range(3):
        _http_infer(srv, "diamond", "X", x)
    with pytest.raises(InferenceServerException, match="unexpected shape for input 'X'"):
        _http_infer(srv, "diamond", "X", np.ones((1, 3), np.float32))
    after = {s["name"]: s for s in http.get_inference_statistics()["model_stats"]}
    gained = lambda m, k: after[m]["inference_stats"][k]["count"] - before[m]["inference_stats"][k]["count"]  # noqa: E731
    assert gained("diamond", "success") == 3 and gained("diamond", "fail") == 1
    assert after["diamond"]["inference_count"] - before["diamond"]["inference_count"] == 3
    assert gained("join", "success") == 3 and gained("pre", "success") == 3  # the steps count their own
    metrics = urllib.request.urlopen(f"http://{srv.metrics_url}/metrics", timeout=10).read().decode()
    line = next(ln for ln in metrics.splitlines()
                if ln.startswith("nv_inference_request_success{") and 'model="diamond"' in ln)
    assert float(line.rsplit(" ", 1)[1]) >= 3


def test_bad_ensembles_are_refused_by_name(srv):
    rows = {r["name"]: r for r in httpclient.InferenceServerClient(srv.http_url).get_model_repository_index()}
    for name, words in REFUSED.items():
        assert rows[name]["state"] == "UNAVAILABLE", name
        assert words in rows[name]["reason"], (name, rows[name]["reason"])
    with pytest.raises(InferenceServerException, match="bad_cycle"):
        _http_infer(srv, "bad_cycle", "X", np.ones((1, 4), np.float32))


def test_explicit_mode_loads_steps_with_the_ensemble_and_unloads_them_as_dependents(tmp_path):
    (tmp_path / "repo").mkdir()
    (tmp_path / "srv").mkdir()
    srv = start_server(build(tmp_path / "repo"), tmp_path / "srv", "--model-control-mode", "explicit")
    try:
        http = httpclient.InferenceServerClient(srv.http_url)
        http.load_model("diamond")
        assert all(http.is_model_ready(m) for m in ("diamond", "pre", "mid", "side", "join"))
        x = np.ones((2, 4), np.float32)
        np.testing.assert_allclose(_grpc_infer(srv, "diamond", "X", x).as_numpy("SUM"), x * 16)
        http.unload_model("side")  # readiness follows the steps
        assert not http.is_model_ready("diamond")
        row = next(r for r in http.get_model_repository_index() if r["name"] == "diamond")
        assert row["state"] == "UNAVAILABLE" and "step 1 ('side')" in row["reason"]
        with pytest.raises(InferenceServerException, match=r"ensemble 'diamond' step 1 \('side'\)"):
            _http_infer(srv, "diamond", "X", x)
        http.load_model("side")
        assert http.is_model_ready("diamond")
        http.unload_model("diamond", unload_dependents=True)
        states = {r["name"]: r["state"] for r in http.get_model_repository_index()}
        assert {m: states[m] for m in ("diamond", "pre", "mid", "side", "join")} == dict.fromkeys(
            ("diamond", "pre", "mid", "side", "join"), "UNAVAILABLE")
    finally:
        srv.stop()
