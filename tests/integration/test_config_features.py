"""config.pbtxt fields from Triton repositories, against a real gt-serve process and tritonclient:
model_warmup runs before READY, reshape is served with the client's shapes (and completed as Triton completes it
for an output of the batch dimension alone), onnxruntime parameters
reach the session (log), the response cache answers repeats (stats and /metrics; an ensemble's own requests as
Triton caches them, its steps not run on a hit), Triton's checksum repository agent guards a model's files (a
changed file fails the reload and the loaded version serves on), and the fields gt_serve does not implement fail
the load with an error naming them.
"""
from __future__ import annotations

import hashlib
import json
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from gt_serve.testing import model_builders as mb
from gt_serve.core.model_dir import model_files
from gt_serve.testing.feature_models import add_with_initializer, move_weights_out
from tests.conftest import start_server

CACHE_BYTES = 1 << 20
SIMPLE_IO = ('input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, '
             '{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]\n')

WARM = SIMPLE_IO + '''max_batch_size: 8
dynamic_batching { }
model_warmup [
  { name: "zeros" batch_size: 2 count: 3
    inputs { key: "INPUT0" value: { data_type: TYPE_INT32 dims: [ 16 ] zero_data: true } }
    inputs { key: "INPUT1" value: { data_type: TYPE_INT32 dims: [ 16 ] random_data: true } } },
  { name: "from_file" batch_size: 1
    inputs { key: "INPUT0" value: { data_type: TYPE_INT32 dims: [ 16 ] input_data_file: "ones.bin" } }
    inputs { key: "INPUT1" value: { data_type: TYPE_INT32 dims: [ 16 ] input_data_file: "ones.bin" } } }
]
'''
RESHAPED = '''max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 2, 2 ] reshape: { shape: [ 4 ] } } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 2, 2 ] reshape: { shape: [ 4 ] } } ]
'''
TUNED = '''max_batch_size: 8
optimization { graph: { level: 1 } }
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
parameters { key: "inter_op_thread_count" value: { string_value: "1" } }
parameters { key: "enable_mem_pattern" value: { string_value: "0" } }
parameters { key: "share_session_between_instances" value: { string_value: "true" } }
parameters { key: "owner.team" value: { string_value: "vision" } }
'''
CACHED = 'max_batch_size: 8\nresponse_cache { enable: true }\n'
TAGGED = 'max_batch_size: 8\nmetric_tags { key: "team" value: "vision" }\nmetric_tags { key: "tier" value: "gold" }\n'
LEVELS = ('max_batch_size: 8\ndynamic_batching { priority_levels: 2 default_priority_level: 2\n'
          '  priority_queue_policy { key: 1 value: { max_queue_size: 4 default_timeout_microseconds: 1000000 } } }\n')
COUNTED = 'max_batch_size: 8\nparameters { key: "intra_op_thread_count" value: { string_value: "2" } }\n'
CACHED_ENSEMBLE = '''platform: "ensemble" max_batch_size: 8 response_cache { enable: true }
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ { model_name: "tuned" model_version: -1
  input_map { key: "INPUT" value: "X" } output_map { key: "OUTPUT" value: "Y" } } ] }
'''
REFUSED = {
    "seq": ("max_batch_size: 8\nsequence_batching { iterative_sequence: true }\n",
            "sequence_batching.iterative_sequence"),
    "ens": ('platform: "ensemble"\n', "ensemble"),
    "decoupled": ("model_transaction_policy { decoupled: true }\n", "model_transaction_policy.decoupled"),
    "openvino": ('optimization { execution_accelerators { cpu_execution_accelerator: [ { name: "openvino" } ] } }\n',
                 "openvino"),
    "badparam": ('parameters { key: "execution_mode" value: { string_value: "2" } }\n', "execution_mode"),
    "passive": ('instance_group [ { kind: KIND_CPU passive: true } ]\n', "instance_group.passive"),
    "pytorch": ('backend: "pytorch"\n', "backend"),
}


INITIALIZED = '''max_batch_size: 0
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 5, 5 ] },
  { name: "INITIALIZER" data_type: TYPE_FP32 dims: [ 5, 5 ] optional: true } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 5, 5 ] } ]
'''  # Triton's onnxruntime backend test (test/initializer_as_input): an initializer the graph lists as an input
SEALED = ('max_batch_size: 8\nmodel_repository_agents { agents [ { name: "checksum"\n'
          '  parameters { key: "MD5:1/model.onnx" value: "%s" } } ] }\n')


def _repo(root: Path) -> Path:
    mb.simple_add_sub(root / "warm" / "1" / "model.onnx")
    (root / "warm" / "config.pbtxt").write_text('name: "warm"\n' + WARM)
    (root / "warm" / "warmup").mkdir()
    (root / "warm" / "warmup" / "ones.bin").write_bytes(np.ones(16, dtype=np.int32).tobytes())
    for name, text in (("reshaped", RESHAPED), ("tuned", TUNED), ("cached", CACHED), ("counted", COUNTED),
                       ("levels", LEVELS), ("tagged", TAGGED)):
        mb.scale(root / name / "1" / "model.onnx", factor=2.0, width=4)
        (root / name / "config.pbtxt").write_text(f'name: "{name}"\n' + text)
    mb.argmax(root / "argmax" / "1" / "model.onnx")  # no config.pbtxt
    mb.mlp(root / "mlp" / "1" / "model.onnx")
    (root / "mlp" / "config.pbtxt").write_text('name: "mlp"\nmax_batch_size: 8\n')
    (root / "cached_ensemble" / "1").mkdir(parents=True)
    (root / "cached_ensemble" / "config.pbtxt").write_text('name: "cached_ensemble"\n' + CACHED_ENSEMBLE)
    for name, (text, _) in REFUSED.items():
        mb.scale(root / name / "1" / "model.onnx", factor=2.0, width=4)
        (root / name / "config.pbtxt").write_text(text)
    mb.scale(root / "packed" / "1" / "model.onnx" / "model.onnx", factor=2.0, width=4)  # a directory, as Triton's
    move_weights_out(root / "packed" / "1" / "model.onnx" / "model.onnx")  # onnxruntime backend takes one
    (root / "packed" / "config.pbtxt").write_text('max_batch_size: 8\n')
    add_with_initializer(root / "initialized" / "1" / "model.onnx")
    (root / "initialized" / "config.pbtxt").write_text(INITIALIZED)
    mb.scale(root / "sealed" / "1" / "model.onnx", factor=2.0, width=4)
    digest = hashlib.md5((root / "sealed" / "1" / "model.onnx").read_bytes()).hexdigest()
    (root / "sealed" / "config.pbtxt").write_text(SEALED % digest)
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = _repo(tmp_path_factory.mktemp("repo_features"))
    srv = start_server(repo, tmp_path_factory.mktemp("srv_features"), "--model-control-mode", "explicit",
                       "--load-model", "warm", "--load-model", "reshaped", "--load-model", "tuned",
                       "--load-model", "cached", "--load-model", "argmax", "--load-model", "cached_ensemble",
                       "--load-model", "counted", "--load-model", "mlp", "--load-model", "levels",
                       "--load-model", "sealed", "--load-model", "tagged", "--load-model", "packed",
                       "--load-model", "initialized",
                       "--cache-config", f"local,size={CACHE_BYTES}")
    yield srv
    srv.stop()


def _stats(client, name: str) -> dict:
    return client.get_inference_statistics(name)["model_stats"][0]


def test_warmup_ran_on_every_lane_before_ready(server):
    client = httpclient.InferenceServerClient(server.http_url)
    warmup = _stats(client, "warm")["warmup"]
    runs_per_lane = 3 + 1  # "zeros" 3 times, "from_file" once
    assert warmup["count"] >= runs_per_lane and warmup["count"] % runs_per_lane == 0
    assert warmup["ns"] > 0
    log = server.log()
    assert "warmup 'zeros'" in log and "warmup 'from_file'" in log
    # the warmup lines come before the model's READY log line: runs happened during the load
    assert log.index("warmup 'from_file'") < log.index("loaded model warm")
    assert _stats(client, "warm")["inference_stats"]["success"]["count"] == 0  # warmups are not requests


def test_reshape_is_served_with_the_client_shapes(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    meta = client.get_model_metadata("reshaped", as_json=True)
    assert [int(d) for d in meta["inputs"][0]["shape"]] == [-1, 2, 2]
    data = np.arange(12, dtype=np.float32).reshape(3, 2, 2)
    inp = grpcclient.InferInput("INPUT", [3, 2, 2], "FP32")
    inp.set_data_from_numpy(data)
    result = client.infer("reshaped", [inp])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT"), data * 2)
    bad = grpcclient.InferInput("INPUT", [3, 4], "FP32")  # the model's shape is not the client's
    bad.set_data_from_numpy(data.reshape(3, 4))
    with pytest.raises(InferenceServerException, match="unexpected shape"):
        client.infer("reshaped", [bad])


def test_an_output_of_the_batch_dimension_alone_is_served_as_triton_completes_it(server):
    """An ArgMax [N] without config.pbtxt: dims [1] with an empty reshape, answered [N, 1] over both protocols."""
    http = httpclient.InferenceServerClient(server.http_url)
    (output,) = http.get_model_config("argmax")["output"]
    assert output["dims"] == [1] and output["reshape"] == {"shape": []}
    assert http.get_model_metadata("argmax")["outputs"][0]["shape"] == [-1, 1]
    data = np.random.default_rng(0).standard_normal((3, 10)).astype(np.float32)
    inp = httpclient.InferInput("INPUT", [3, 10], "FP32")
    inp.set_data_from_numpy(data)
    answer = http.infer("argmax", [inp]).as_numpy("CLASS")
    assert answer.shape == (3, 1) and answer[:, 0].tolist() == data.argmax(axis=1).tolist()
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    ginp = grpcclient.InferInput("INPUT", [3, 10], "FP32")
    ginp.set_data_from_numpy(data)
    assert grpc.infer("argmax", [ginp]).as_numpy("CLASS").tolist() == answer.tolist()


def test_onnxruntime_parameters_reach_the_session(server):
    client = httpclient.InferenceServerClient(server.http_url)
    config = client.get_model_config("tuned")
    assert config["parameters"]["intra_op_thread_count"]["string_value"] == "1"
    assert config["optimization"]["graph"]["level"] == 1
    # the session's own options, read back from onnxruntime, in the load log
    lines = [line for line in server.log().splitlines() if "model tuned v1 session:" in line]
    assert lines, server.log()[-2000:]
    assert all("intra_op_threads=1" in line and "inter_op_threads=1" in line for line in lines)
    assert all("ORT_ENABLE_EXTENDED" in line and "enable_mem_pattern=False" in line for line in lines)
    # a key the onnxruntime backend does not read loads, as in Triton, and the log says it is ignored
    assert config["parameters"]["owner.team"]["string_value"] == "vision"
    assert "model tuned: parameters key 'owner.team' is ignored" in server.log()
    assert "share_session_between_instances' is ignored" not in server.log()  # read: CPU lanes share anyway


def test_an_initializer_listed_as_an_input_is_an_optional_input_as_in_triton(server):
    """Triton's own test: left out, the stored initializer (ones) is used; sent, the request's value."""
    client = httpclient.InferenceServerClient(server.http_url)
    assert [t["name"] for t in client.get_model_metadata("initialized")["inputs"]] == ["INPUT", "INITIALIZER"]
    zeros = np.zeros((5, 5), np.float32)
    inputs = [httpclient.InferInput("INPUT", [5, 5], "FP32"), httpclient.InferInput("INITIALIZER", [5, 5], "FP32")]
    inputs[0].set_data_from_numpy(zeros, binary_data=False)
    inputs[1].set_data_from_numpy(zeros + 3, binary_data=False)
    np.testing.assert_array_equal(client.infer("initialized", inputs[:1]).as_numpy("OUTPUT"), zeros + 1)
    np.testing.assert_array_equal(client.infer("initialized", inputs).as_numpy("OUTPUT"), zeros + 3)


def test_a_model_kept_in_a_directory_with_external_data_loads_and_uploads(server):
    """Triton's onnxruntime backend: where VERSION/model.onnx is a directory, the model is VERSION/model.onnx/
    model.onnx, beside its external data files; loaded from the repository and uploaded with a load request, in
    that form and in the one the placement loop sends a peer."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    data = np.arange(8, dtype=np.float32).reshape(2, 4)

    def doubled(model: str) -> np.ndarray:
        inp = grpcclient.InferInput("INPUT", [2, 4], "FP32")
        inp.set_data_from_numpy(data)
        return client.infer(model, [inp]).as_numpy("OUTPUT")

    np.testing.assert_array_equal(doubled("packed"), data * 2)
    folder = server.repo / "packed" / "1" / "model.onnx"
    files = {f"file:1/model.onnx/{f.name}": f.read_bytes() for f in folder.iterdir()}
    assert sorted(files) == ["file:1/model.onnx/model.onnx", "file:1/model.onnx/weights.bin"]
    client.load_model("packed_upload", config=json.dumps({"max_batch_size": 8}), files=files)
    np.testing.assert_array_equal(doubled("packed_upload"), data * 2)
    # what the placement loop sends a peer (edge/placement_loop._upload_files): the files model_files names
    copy = {f"file:1/{name}": path.read_bytes() for name, path in model_files(folder / "model.onnx", "packed").items()}
    assert sorted(copy) == ["file:1/model.onnx", "file:1/weights.bin"]
    client.load_model("packed_copy", config=json.dumps({"max_batch_size": 8}), files=copy)
    np.testing.assert_array_equal(doubled("packed_copy"), data * 2)
    without = {k: v for k, v in files.items() if k.endswith("model.onnx")}  # the weights left behind
    with pytest.raises(InferenceServerException, match="weights.bin"):
        client.load_model("packed_broken", config=json.dumps({"max_batch_size": 8}), files=without)
    assert client.is_model_ready("packed_upload") and not client.is_model_ready("packed_broken")


def test_tiny_models_are_told_at_load_and_get_one_intra_op_thread_unless_their_config_counts_them(server):
    """core/tiny_models.py: a Mul of 8 x 4 floats runs in microseconds, mlp's 8 rows in hundreds of them (a margin
    of ~10x either side of the bound). The session lines are onnxruntime's own options, read back."""
    log = server.log()

    def session(name: str) -> str:
        (line,) = [line for line in log.splitlines() if f"model {name} v1 session:" in line]
        return line

    assert "model cached v1 is tiny" in log and "intra_op_threads=1," in session("cached")
    assert "model counted v1 is tiny" in log and "intra_op_threads=2," in session("counted")  # the config's count
    assert "model mlp v1 is tiny" not in log and "intra_op_threads=1," not in session("mlp")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    data = np.arange(32, dtype=np.float32).reshape(8, 4)
    inp = grpcclient.InferInput("INPUT", [8, 4], "FP32")
    inp.set_data_from_numpy(data)
    np.testing.assert_array_equal(client.infer("counted", [inp]).as_numpy("OUTPUT"), data * 2)


def test_response_cache_hits_and_misses(server):
    client = httpclient.InferenceServerClient(server.http_url)
    before = _stats(client, "cached")
    data = np.array([[1, 2, 3, 4]], dtype=np.float32)

    def infer(array):
        inp = httpclient.InferInput("INPUT", list(array.shape), "FP32")
        inp.set_data_from_numpy(array)
        return client.infer("cached", [inp]).as_numpy("OUTPUT")

    first, second = infer(data), infer(data)
    third = infer(data + 1)
    np.testing.assert_array_equal(first, data * 2)
    np.testing.assert_array_equal(second, first)
    np.testing.assert_array_equal(third, (data + 1) * 2)
    after = _stats(client, "cached")

    def delta(key):
        return after["inference_stats"][key]["count"] - before["inference_stats"][key]["count"]

    assert (delta("cache_hit"), delta("cache_miss"), delta("success")) == (1, 2, 3)
    assert after["execution_count"] - before["execution_count"] == 2  # the hit ran nothing
    with urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=30) as r:
        text = r.read().decode()
    hits = [line for line in text.splitlines() if line.startswith('nv_cache_num_hits_per_model{model="cached"')]
    assert hits and float(hits[0].split()[-1]) >= 1
    assert "nv_cache_num_misses_per_model" in text and "gt_response_cache_bytes" in text
    # no cache for models without response_cache: the same request twice counts no hit
    stats = _stats(client, "tuned")["inference_stats"]
    assert stats["cache_hit"]["count"] == 0 and stats["cache_miss"]["count"] == 0


def test_an_ensembles_own_requests_are_cached_and_a_hit_runs_no_step(server):
    """Triton caches top-level ensemble requests (`response_cache` in the ensemble's config); the step (`tuned`,
    no cache of its own) runs on a miss only."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    http = httpclient.InferenceServerClient(server.http_url)
    before, step_before = _stats(http, "cached_ensemble"), _stats(http, "tuned")
    data = np.array([[5, 6, 7, 8]], dtype=np.float32)

    def infer(array):
        inp = grpcclient.InferInput("X", list(array.shape), "FP32")
        inp.set_data_from_numpy(array)
        return client.infer("cached_ensemble", [inp]).as_numpy("Y")

    answers = [infer(data), infer(data), infer(data * 3)]
    for answer, x in zip(answers, (data, data, data * 3)):
        np.testing.assert_array_equal(answer, x * 2)
    after, step_after = _stats(http, "cached_ensemble"), _stats(http, "tuned")

    def delta(key, a=after, b=before):
        return a["inference_stats"][key]["count"] - b["inference_stats"][key]["count"]

    assert (delta("cache_hit"), delta("cache_miss"), delta("success")) == (1, 2, 3)
    assert after["execution_count"] - before["execution_count"] == 2
    assert delta("success", step_after, step_before) == 2  # the hit did not reach the step


def test_an_ensemble_asking_for_the_cache_needs_the_servers(tmp_path):
    mb.scale(tmp_path / "repo" / "tuned" / "1" / "model.onnx", factor=2.0, width=4)
    (tmp_path / "repo" / "tuned" / "config.pbtxt").write_text('name: "tuned"\nmax_batch_size: 8\n')
    (tmp_path / "repo" / "cached_ensemble" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "cached_ensemble" / "config.pbtxt").write_text(CACHED_ENSEMBLE)
    srv = start_server(tmp_path / "repo", tmp_path, "--model-control-mode", "explicit", "--load-model", "tuned")
    try:
        client = httpclient.InferenceServerClient(srv.http_url)
        with pytest.raises(InferenceServerException, match="response_cache.enable needs the server's response cache"):
            client.load_model("cached_ensemble")
        assert not client.is_model_ready("cached_ensemble") and client.is_model_ready("tuned")
    finally:
        srv.stop()


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_unimplemented_fields_fail_the_load_naming_them(server, name):
    client = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException) as info:
        client.load_model(name)
    message = str(info.value)
    assert REFUSED[name][1] in message, message
    assert not client.is_model_ready(name)
    assert client.is_server_live() and client.is_model_ready("warm")


def test_response_cache_without_a_server_cache_fails_the_load(tmp_path):
    repo = tmp_path / "repo"
    mb.scale(repo / "cached" / "1" / "model.onnx", factor=2.0, width=4)
    (repo / "cached" / "config.pbtxt").write_text(CACHED)
    (tmp_path / "srv").mkdir()
    with start_server(repo, tmp_path / "srv", "--model-control-mode", "explicit") as srv:
        client = httpclient.InferenceServerClient(srv.http_url)
        with pytest.raises(InferenceServerException, match="response_cache.enable needs"):
            client.load_model("cached")


def test_a_priority_levels_own_queue_policy_loads_and_each_level_serves(server):
    """(Each level's queue bound and timeout: tests/unit/test_scheduler.py, on lanes held at a gate.)"""
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        policy = client.get_model_config("levels")["dynamic_batching"]["priority_queue_policy"]["1"]
        assert int(policy["max_queue_size"]) == 4 and int(policy["default_timeout_microseconds"]) == 1_000_000
        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        for priority in (0, 1, 2):
            tensor = httpclient.InferInput("INPUT", [1, 4], "FP32")
            tensor.set_data_from_numpy(x)
            got = client.infer("levels", [tensor], priority=priority).as_numpy("OUTPUT")
            np.testing.assert_array_equal(got, 2 * x)
    finally:
        client.close()


def _doubles(client, model: str) -> bool:
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    tensor = httpclient.InferInput("INPUT", [1, 4], "FP32")
    tensor.set_data_from_numpy(x)
    return bool(np.array_equal(client.infer(model, [tensor]).as_numpy("OUTPUT"), 2 * x))


def test_the_checksum_agent_guards_the_model_files(server):
    client = httpclient.InferenceServerClient(server.http_url)
    path = server.repo / "sealed" / "1" / "model.onnx"
    sealed = path.read_bytes()
    try:
        assert client.is_model_ready("sealed") and _doubles(client, "sealed")
        mb.scale(path, factor=3.0, width=4)  # another model in its place: the digest no longer matches
        with pytest.raises(InferenceServerException, match="Mismatched MD5 hash for file 1/model.onnx, expect: "):
            client.load_model("sealed")
        assert client.is_model_ready("sealed") and _doubles(client, "sealed")  # the loaded version serves on
    finally:
        path.write_bytes(sealed)
    client.load_model("sealed")  # the file as sealed loads again
    # a load request's config may carry the agent too: it checks the uploaded files
    config = {"name": "sealed_upload", "max_batch_size": 8, "model_repository_agents": {"agents": [{
        "name": "checksum", "parameters": {"MD5:1/model.onnx": hashlib.md5(sealed).hexdigest()}}]}}
    client.load_model("sealed_upload", config=json.dumps(config), files={"file:1/model.onnx": sealed})
    assert _doubles(client, "sealed_upload")
    with pytest.raises(InferenceServerException, match="Mismatched MD5 hash"):
        client.load_model("sealed_upload", config=json.dumps(config), files={"file:1/model.onnx": sealed + b" "})
    assert _doubles(client, "sealed_upload")


def test_metric_tags_label_the_models_metrics(server):
    """Triton's metric reporter adds each metric_tags entry as a label "_KEY" to the model's metrics."""
    client = httpclient.InferenceServerClient(server.http_url)
    assert _doubles(client, "tagged")
    with urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=30) as r:
        text = r.read().decode()
    counts = [line for line in text.splitlines() if line.startswith("nv_inference_count") and 'model="tagged"' in line]
    assert counts and '_team="vision"' in counts[0] and '_tier="gold"' in counts[0]
    assert float(counts[0].split()[-1]) >= 1
    pending = [line for line in text.splitlines()
               if line.startswith("nv_inference_pending_request_count") and 'model="tagged"' in line]
    assert pending and '_team="vision"' in pending[0]
    others = [line for line in text.splitlines() if line.startswith("nv_inference_count") and 'model="tuned"' in line]
    assert others and "_team" not in others[0]  # another model's series carry no tags of this one
