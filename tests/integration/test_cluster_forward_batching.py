"""Batches between nodes in a real cluster (issue #18 item 3): mosquitto and two gt-serve processes; the
entry forwards `classifier` to the only node that has it, with `cluster.forward_batch_window_us` on.
A burst of concurrent requests reaches the peer as fewer requests than were sent (merged forwards), and
every answer is the right one for its own input (the split is per request)."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.http as httpclient

from gt_serve.testing.mosquitto import mosquitto_binary
from tests.integration.cluster_nodes import EdgeCluster, classifier_expected

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(mosquitto_binary() is None, reason="mosquitto binary not installed (apt-get install mosquitto)"),
]

CALLERS = 24
BATCHING = {"forward_batch_window_us": 20_000, "forward_batch_models": ["classifier"], "forward_batch_max": 8}


def requests_served(node, model: str) -> int:
    client = httpclient.InferenceServerClient(node.http_url)
    try:
        stats = client.get_inference_statistics(model)["model_stats"][0]
        return int(stats["inference_stats"]["success"]["count"])
    finally:
        client.close()


def test_a_burst_of_forwards_reaches_the_peer_merged_and_each_answer_is_its_own(tmp_path):
    with EdgeCluster(tmp_path, "fwdbatch", per_node={"entry": BATCHING}) as cluster:
        entry, holder = cluster.start({"entry": ["simple"], "holder": ["classifier"]})
        cluster.wait_mesh()
        start = threading.Barrier(CALLERS)

        def call(i: int):
            x = np.full((1, 8), (i - CALLERS / 2) / CALLERS, np.float32)
            client = httpclient.InferenceServerClient(entry.http_url)
            try:
                inp = httpclient.InferInput("INPUT", [1, 8], "FP32")
                inp.set_data_from_numpy(x)
                start.wait(timeout=30)  # released together: the forwards fall in one window
                result = client.infer("classifier", [inp])
                return x, result.as_numpy("OUTPUT"), result.get_response().get("parameters", {})
            finally:
                client.close()

        with ThreadPoolExecutor(CALLERS) as pool:
            answers = list(pool.map(call, range(CALLERS)))
        for x, out, params in answers:
            np.testing.assert_allclose(out, classifier_expected(x), rtol=1e-5, atol=1e-6)
            assert params.get("gt_served_by") == "holder"
        received = requests_served(holder, "classifier")
        assert received < CALLERS, f"the holder got {received} requests for {CALLERS} forwards: none merged"
