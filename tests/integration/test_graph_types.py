"""Models whose graphs have inputs or outputs no V2 tensor carries, on a real server: a scikit-learn classifier
exported with its default ZipMap loads without a config and serves its labels over HTTP and gRPC (tritonclient),
its sequence-of-maps output left out of the metadata and refused by name; the same output listed in a config, a
sequence input, an FP8 input and a graph of no tensor output fail their loads naming the tensor, and the server and
its other models serve on."""
from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from gt_serve.testing.feature_models import fp8_input, sequence_input, zipmap_classifier
from tests.conftest import start_server

ROWS = np.array([[0, 5, 1, 0], [9, 0, 1, 0], [0, 0, 7, 0]], dtype=np.float32)
LABELS = [[1], [0], [2]]  # the argmax of each row's first three columns, as [N, 1]: Triton's completion of [N]
REFUSED = {  # model -> what its load error names
    "zipmap_listed": "output 'output_probability' in the config is an ONNX seq(map(int64,tensor(float)))",
    "zipmap_only": "no output of the ONNX graph is a tensor of a V2 datatype (output_probability: seq(map",
    "sequence_input": "input 'S' is an ONNX seq(tensor(float)), which the KServe V2 protocol cannot carry",
    "fp8_input": "input 'X' is an ONNX tensor(float8e4m3fn), which the KServe V2 protocol cannot carry",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo_graph_types")
    zipmap_classifier(repo / "classifier" / "1" / "model.onnx")  # no config.pbtxt: completed from the graph
    zipmap_classifier(repo / "zipmap_listed" / "1" / "model.onnx")
    (repo / "zipmap_listed" / "config.pbtxt").write_text(
        'max_batch_size: 8\noutput [ { name: "output_probability" data_type: TYPE_FP32 dims: [ 3 ] } ]\n')
    zipmap_classifier(repo / "zipmap_only" / "1" / "model.onnx", probabilities=False)
    sequence_input(repo / "sequence_input" / "1" / "model.onnx")
    fp8_input(repo / "fp8_input" / "1" / "model.onnx")
    srv = start_server(repo, tmp_path_factory.mktemp("srv_graph_types"), "--model-control-mode", "explicit",
                       "--load-model", "classifier")
    yield srv
    srv.stop()


def test_metadata_and_config_show_only_the_tensor_output(server):
    client = httpclient.InferenceServerClient(server.http_url)
    meta = client.get_model_metadata("classifier")
    assert [(o["name"], o["datatype"], o["shape"]) for o in meta["outputs"]] == [("label", "INT64", [-1, 1])]
    config = client.get_model_config("classifier")
    assert config["max_batch_size"] == 4 and [o["name"] for o in config["output"]] == ["label"]
    assert server.log().count("output 'output_probability' is an ONNX seq(map(int64,tensor(float)))") == 1


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_the_labels_are_served(server, module):
    client = module.InferenceServerClient(server.http_url if module is httpclient else server.grpc_url)
    x = module.InferInput("X", list(ROWS.shape), "FP32")
    x.set_data_from_numpy(ROWS)
    result = client.infer("classifier", [x])
    assert result.as_numpy("label").tolist() == LABELS
    assert result.as_numpy("output_probability") is None


def test_asking_for_the_sequence_output_is_a_400_naming_it(server):
    client = httpclient.InferenceServerClient(server.http_url)
    x = httpclient.InferInput("X", list(ROWS.shape), "FP32")
    x.set_data_from_numpy(ROWS)
    with pytest.raises(InferenceServerException, match="unexpected inference output 'output_probability'") as info:
        client.infer("classifier", [x], outputs=[httpclient.InferRequestedOutput("output_probability")])
    assert info.value.status() == "400"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_graph_tensor_of_no_v2_datatype_fails_the_load_naming_it(server, name):
    client = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException) as info:
        client.load_model(name)
    assert REFUSED[name] in str(info.value), str(info.value)
    assert not client.is_model_ready(name)
    assert client.is_server_live() and client.is_model_ready("classifier")
    x = httpclient.InferInput("X", list(ROWS.shape), "FP32")
    x.set_data_from_numpy(ROWS)
    assert client.infer("classifier", [x]).as_numpy("label").tolist() == LABELS
