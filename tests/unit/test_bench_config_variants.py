"""bench/config_variants.py: the sweep's mlp under the Triton configs users write (`dynamic_batching { }`, none,
preferred sizes, a long delay, a large max_batch_size, two instances, answers in order) loads in gt-serve as written, answers what
onnxruntime computes, and batches as Triton would: a model without `dynamic_batching` runs every request alone
(issue #17: "with models and configs of our own")."""
from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import config_variants  # noqa: E402

from gt_serve.core.model_config import parse_pbtxt  # noqa: E402
from gt_serve.core.model_host import batching_from_config  # noqa: E402
from gt_serve.testing.launcher import launch  # noqa: E402

httpclient = pytest.importorskip("tritonclient.http")


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    return config_variants.build(tmp_path_factory.mktemp("variants"))


@pytest.fixture(scope="module")
def server(repo, tmp_path_factory):
    served = launch(["--model-repository", str(repo)], workdir=tmp_path_factory.mktemp("run"))
    yield served
    served.stop()


def test_each_variant_batches_as_its_config_says(repo):
    """(max_batch_size the batcher uses, preferred sizes, queue delay) of each config as gt-serve reads it."""
    seen = {name: batching_from_config(parse_pbtxt((repo / name / "config.pbtxt").read_text(), name), {})[0]
            for name in config_variants.VARIANTS}
    got = {name: (b.max_batch_size, b.preferred_batch_sizes, b.max_queue_delay_s, b.preserve_ordering)
           for name, b in seen.items()}
    assert got == {"mlp_d0": (32, (), 0.0, False), "mlp_nodb": (0, (), 0.0, False),
                   "mlp_pref": (32, (4, 8), 0.0005, False), "mlp_d10ms": (32, (), 0.01, False),
                   "mlp_b128": (128, (), 0.0005, False), "mlp_ig2": (32, (), 0.0005, False),
                   "mlp_order": (32, (), 0.0005, True), "mlp_ig2_order": (32, (), 0.0005, True)}


def test_the_server_serves_each_variant_with_its_config_and_onnxruntimes_answers(repo, server):
    import onnxruntime as ort

    x = np.random.default_rng(0).standard_normal((3, 256)).astype(np.float32)
    (want,) = ort.InferenceSession(str(repo / "mlp_d0" / "1" / "model.onnx"),
                                   providers=["CPUExecutionProvider"]).run(None, {"INPUT": x})
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        for name in config_variants.VARIANTS:
            cfg = client.get_model_config(name)
            assert cfg["max_batch_size"] == (128 if name == "mlp_b128" else 32), name
            assert ("dynamic_batching" in cfg) == (name != "mlp_nodb"), name
            assert cfg["instance_group"][0]["count"] == (2 if name.startswith("mlp_ig2") else 1), name
            assert cfg.get("dynamic_batching", {}).get("preserve_ordering", False) == name.endswith("_order"), name
            tensor = httpclient.InferInput("INPUT", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x, binary_data=True)
            got = client.infer(name, [tensor]).as_numpy("OUTPUT")
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=name)
        assert client.get_model_config("mlp_pref")["dynamic_batching"]["preferred_batch_size"] == [4, 8]
    finally:
        client.close()


def test_requests_of_the_model_without_dynamic_batching_each_run_alone(server):
    """16 clients' requests at once, 8 each: as many executions as inferences (Triton's default scheduler merges
    nothing without `dynamic_batching`), where mlp_d0 under the same load may merge them."""
    x = np.ones((1, 256), np.float32)

    def client_requests(_: int) -> int:
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            for _ in range(8):
                tensor = httpclient.InferInput("INPUT", [1, 256], "FP32")
                tensor.set_data_from_numpy(x, binary_data=True)
                assert client.infer("mlp_nodb", [tensor]).as_numpy("OUTPUT").shape == (1, 10)
            return 8
        finally:
            client.close()

    def counts() -> tuple[int, int]:
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            stats = client.get_inference_statistics("mlp_nodb")["model_stats"][0]
        finally:
            client.close()
        return int(stats["inference_count"]), int(stats["execution_count"])

    before = counts()
    with ThreadPoolExecutor(16) as pool:
        assert sum(pool.map(client_requests, range(16))) == 128
    after = counts()
    assert (after[0] - before[0], after[1] - before[1]) == (128, 128)
