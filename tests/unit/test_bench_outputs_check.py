"""bench/sweep_servers.check_outputs: a server measured against gt-serve must answer with its outputs whole. Triton
2.51's Python backend stub answers with every output empty (`binary_data_size` 0) when its venv has NumPy 2, and
the bench would then compare gt-serve with a server that sends no outputs (found in the twenty-third pass of issue
#17). Against real gt-serve (passes) and a stand-in answering as that stub does (refused, by model and output)."""
from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import perf_sweep  # noqa: E402
import sweep_servers  # noqa: E402

from gt_serve.testing.launcher import launch  # noqa: E402


def test_gt_serve_answers_its_models_outputs_whole(tmp_path):
    repo = perf_sweep.build_repo(tmp_path / "repo", ["mlp", "tiny"], triton=False)
    server = launch(["--model-repository", str(repo)], workdir=tmp_path)
    try:
        sweep_servers.check_outputs(sweep_servers.Served("gt-serve", server.pid, server.ports["http"], 0))
    finally:
        server.stop()


class _EmptyOutputs(BaseHTTPRequestHandler):
    """Answers as Triton's Python backend does under NumPy 2: the right shapes, no bytes."""

    def _json(self, doc: object, extra: dict | None = None) -> None:
        body = json.dumps(doc).encode()
        self.send_response(200)
        for key, value in {"Content-Length": str(len(body)), **(extra or {})}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        self._json({"name": "m", "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
                    "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}]})

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        if self.path.endswith("/repository/index"):
            return self._json([{"name": "m", "version": "1", "state": "READY"}])
        doc = {"model_name": "m", "outputs": [{"name": "y", "datatype": "FP32", "shape": [1, 2],
                                               "parameters": {"binary_data_size": 0}}]}
        self._json(doc, {"Inference-Header-Content-Length": str(len(json.dumps(doc)))})

    def log_message(self, *args) -> None:
        pass


def test_a_server_that_answers_with_empty_outputs_is_refused_by_model_and_output():
    stand_in = ThreadingHTTPServer(("127.0.0.1", 0), _EmptyOutputs)
    thread = threading.Thread(target=stand_in.serve_forever, daemon=True)
    thread.start()
    try:
        served = sweep_servers.Served("triton", 0, stand_in.server_address[1], 0)
        with pytest.raises(RuntimeError) as err:
            sweep_servers.check_outputs(served, "pip install 'numpy<2'")
        assert "model 'm'" in str(err.value) and "output 'y' of 0 bytes, not 8" in str(err.value)
        assert "numpy<2" in str(err.value)
    finally:
        stand_in.shutdown()
        thread.join(10)
