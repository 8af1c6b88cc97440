"""The command line as a new user meets it: the bundled demo with no flags, and clear start-up errors."""
import socket
import subprocess
import sys

import numpy as np
import tritonclient.http as httpclient

from gt_serve.testing.launcher import launch


def test_no_flags_serves_the_bundled_demo(tmp_path):
    with launch([], workdir=tmp_path) as srv:  # only the port flags: no repository, no config
        client = httpclient.InferenceServerClient(srv.http_url)
        try:
            index = {row["name"]: row["state"] for row in client.get_model_repository_index()}
            assert index == {"simple": "READY", "classifier": "READY"}
            a = np.arange(16, dtype=np.int32).reshape(1, 16)
            i0 = httpclient.InferInput("INPUT0", [1, 16], "INT32")
            i1 = httpclient.InferInput("INPUT1", [1, 16], "INT32")
            i0.set_data_from_numpy(a)
            i1.set_data_from_numpy(np.ones_like(a))
            result = client.infer("simple", [i0, i1])
            assert result.as_numpy("OUTPUT0").tolist() == (a + 1).tolist()
            assert client.get_server_metadata()["name"] == "gt_serve"
        finally:
            client.close()


def run_cli(*args, timeout_s=60):
    return subprocess.run([sys.executable, "-m", "gt_serve", *args], capture_output=True, text=True,
                          timeout=timeout_s)


def test_port_in_use_is_a_clear_error():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = run_cli("--host", "127.0.0.1", "--http-port", str(port), "--grpc-port", "0", "--metrics-port", "0")
    assert done.returncode == 1
    assert "cannot start" in done.stderr and "address already in use" in done.stderr
    assert "Traceback" not in done.stderr


def test_bad_config_names_the_key(tmp_path):
    cfg = tmp_path / "node.yaml"
    cfg.write_text("router: {policy: fastest}\n")
    done = run_cli("--config", str(cfg), "--http-port", "0")
    assert done.returncode == 2
    assert "router.policy" in done.stderr and "fastest" in done.stderr


def test_missing_repository_is_a_clear_error(tmp_path):
    done = run_cli("--model-repository", str(tmp_path / "nope"), "--host", "127.0.0.1",
                   "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0")
    assert done.returncode != 0
    assert "is not a directory" in done.stderr
