"""bench/transport_floor.py: the floor server answers perf_analyzer's requests as gt-serve answered them (the same
bytes for an infer, whatever its input), and counts what it answered in its statistics, where the bench
reads any server's count (issue #17)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import perf_sweep  # noqa: E402
import sweep_servers  # noqa: E402
import transport_floor  # noqa: E402

from gt_serve.testing.launcher import launch  # noqa: E402


def test_the_floor_answers_as_gt_serve_did_and_counts(tmp_path):
    repo = perf_sweep.build_repo(tmp_path / "repo", [transport_floor.MODEL], triton=False)
    server = launch(["--model-repository", str(repo)], workdir=tmp_path)
    try:
        answers = transport_floor.record(server.ports["http"])
    finally:
        server.stop()
    assert answers["infer"].startswith(b"HTTP/1.1 200 OK\r\n") and b"Inference-Header-Content-Length" in answers["infer"]
    with transport_floor.floor_server(answers, tmp_path) as (pid, port):
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            assert client.is_server_ready() and client.get_model_metadata(transport_floor.MODEL)["name"] == "mlp"
            x = httpclient.InferInput("INPUT", [1, 256], "FP32")
            x.set_data_from_numpy(np.ones((1, 256), np.float32), binary_data=True)
            out = httpclient.InferRequestedOutput("OUTPUT", binary_data=True)
            for _ in range(3):
                result = client.infer(transport_floor.MODEL, [x], outputs=[out])
                assert result.as_numpy("OUTPUT").shape == (1, 10)  # the recorded answer, decoded by tritonclient
            assert sweep_servers.Served("floor", pid, port, 0).inference_count(transport_floor.MODEL) == 3
            stats = client.get_inference_statistics(transport_floor.MODEL)["model_stats"][0]
            assert int(stats["inference_count"]) == 3  # perf_analyzer reads these before and after a window
        finally:
            client.close()
