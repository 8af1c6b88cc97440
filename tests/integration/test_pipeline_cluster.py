"""A pipeline across two nodes: the benchmark CNN split by gt_serve.tools.shard, stage 0 on node a,
stage 1 only on node b; the pipeline is addressed on a over HTTP and gRPC like a model and its
answers equal the unsplit model run with onnxruntime here."""
from __future__ import annotations

import shutil
import signal

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from gt_serve.testing import model_builders as mb
from gt_serve.tools import shard
from tests.integration.cluster_nodes import EdgeCluster, peer_states, wait_for
from gt_serve.testing.mosquitto import mosquitto_binary

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(mosquitto_binary() is None,
                       reason="mosquitto binary not installed (apt-get install mosquitto): "
                              "cluster tests need a real broker"),
]

PIPELINES = ("pipelines:\n"
             "  cnn: {stages: [cnn_stage0, cnn_stage1]}\n"
             "  nowhere: {stages: [cnn_stage0, no_such_stage]}\n")


@pytest.fixture(scope="module")
def split_cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipeline_cluster")
    src = root / "cnn.onnx"
    mb.cnn(src, head="gap")
    plans = shard.split_model(src, shard.parse_cuts("c3_r"), "cnn", root / "stages")
    repos = {}
    for node, plan in zip("ab", plans):
        repos[node] = root / f"repo_{node}"
        shutil.copytree(root / "stages" / plan.name, repos[node] / plan.name)
    with EdgeCluster(root, "pipe") as cluster:
        cluster.start({"a": [], "b": []}, extra={"a": PIPELINES}, repos=repos)
        cluster.wait_mesh()
        yield cluster, src


def expected(src, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    return session.run(["OUTPUT"], {"INPUT": x})[0]


def test_pipeline_is_addressable_like_a_model(split_cluster):
    cluster, _ = split_cluster
    a = cluster.nodes["a"]
    http = httpclient.InferenceServerClient(a.http_url)
    grpc = grpcclient.InferenceServerClient(a.grpc_url)
    try:
        wait_for(lambda: http.is_model_ready("cnn"), 10, "pipeline 'cnn' ready on a")
        assert grpc.is_model_ready("cnn")
        assert not http.is_model_ready("nowhere") and not grpc.is_model_ready("nowhere")
        meta = http.get_model_metadata("cnn")
        assert meta["platform"] == "pipeline"
        assert meta["inputs"] == [{"name": "INPUT", "datatype": "FP32", "shape": [-1, 3, 64, 64]}]
        assert meta["outputs"] == [{"name": "OUTPUT", "datatype": "FP32", "shape": [-1, 10]}]
        gmeta = grpc.get_model_metadata("cnn")
        assert [list(t.shape) for t in gmeta.outputs] == [[-1, 10]]  # stage 1's, described by node b
        config = http.get_model_config("cnn")
        assert config["name"] == "cnn" and config["max_batch_size"] == 4
        assert [t["name"] for t in config["output"]] == ["OUTPUT"]
        with pytest.raises(InferenceServerException, match="unknown model"):
            http.get_model_metadata("cnn", "2")
    finally:
        http.close()
        grpc.close()


def test_pipeline_infer_over_http_and_grpc_equals_the_whole_model(split_cluster):
    cluster, src = split_cluster
    a = cluster.nodes["a"]
    x = np.random.default_rng(7).standard_normal((2, 3, 64, 64)).astype(np.float32)
    want = expected(src, x)
    http = httpclient.InferenceServerClient(a.http_url)
    grpc = grpcclient.InferenceServerClient(a.grpc_url)
    try:
        inp = httpclient.InferInput("INPUT", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        result = http.infer("cnn", [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT")])
        np.testing.assert_allclose(result.as_numpy("OUTPUT"), want, rtol=1e-4, atol=1e-5)
        response = result.get_response()
        assert response["model_name"] == "cnn"
        assert response["parameters"]["gt_stages_served_by"] == "a,b"  # stage 1 ran on b

        ginp = grpcclient.InferInput("INPUT", list(x.shape), "FP32")
        ginp.set_data_from_numpy(x)
        gresult = grpc.infer("cnn", [ginp])
        np.testing.assert_allclose(gresult.as_numpy("OUTPUT"), want, rtol=1e-4, atol=1e-5)
        assert gresult.get_response().parameters["gt_stages_served_by"].string_param == "a,b"

        # top-k on the last stage's output, computed where that stage ran
        top = http.infer("cnn", [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT", class_count=3)])
        best = [int(item.decode().split(":")[1]) for item in top.as_numpy("OUTPUT")[0]]
        assert best == list(np.argsort(-want[0], kind="stable")[:3])

        with pytest.raises(InferenceServerException, match="no_such_stage"):
            http.infer("nowhere", [inp])
        bad = httpclient.InferInput("BOGUS", [1, 4], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 4), np.float32))
        with pytest.raises(InferenceServerException, match="unexpected inference input 'BOGUS'"):
            http.infer("cnn", [bad])
    finally:
        http.close()
        grpc.close()


def test_pipeline_without_its_remote_stage_fails_fast(split_cluster):
    """Last (destructive): with b gone the pipeline is not ready and requests get a clear error."""
    cluster, _ = split_cluster
    a, b = cluster.nodes["a"], cluster.nodes["b"]
    b.stop(signal.SIGKILL)
    wait_for(lambda: peer_states(a).get("b") not in (None, "live"), 5, "a to see b gone")
    http = httpclient.InferenceServerClient(a.http_url)
    try:
        assert not http.is_model_ready("cnn")
        inp = httpclient.InferInput("INPUT", [1, 3, 64, 64], "FP32")
        inp.set_data_from_numpy(np.zeros((1, 3, 64, 64), np.float32))
        with pytest.raises(InferenceServerException, match=r"stage 1 \('cnn_stage1'\)"):
            http.infer("cnn", [inp])
    finally:
        http.close()
