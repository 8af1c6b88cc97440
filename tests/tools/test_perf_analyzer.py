"""NVIDIA's perf_analyzer (tritonclient 2.34.0's binary, installed by bench/install-perf-analyzer.sh) against a
real gt-serve: HTTP and gRPC; sync, async and gRPC streaming; system shared memory; batch > 1; real JSON data
(checked against validation_data), zero and random data; BYTES inputs and dynamic dims (--shape); a sequence model;
mutual TLS on both protocols with a bearer token sent by `-H`.
Each run is short (count windows of 50 requests); it must exit 0, report a throughput > 0 in its CSV, print no
warnings (it reads our server-side statistics too), and our /v2/models/NAME/stats must have counted its requests."""
from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import urllib.request
from pathlib import Path

import pytest

from gt_serve.testing import model_builders as mb
from gt_serve.testing.launcher import launch
from tests.conftest import start_server
from tests.models import build_repository

pytestmark = pytest.mark.tools

RUN_TIMEOUT_S = 60.0
OUTPUT_LIMIT_BYTES = 1 << 20


def _perf_analyzer() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "gt_serve" / "perf_analyzer" / "perf_analyzer"


PERF_ANALYZER = _perf_analyzer()
if not os.access(PERF_ANALYZER, os.X_OK):
    pytest.skip(f"perf_analyzer is not installed at {PERF_ANALYZER}: run bench/install-perf-analyzer.sh "
                "(.ci/run does)", allow_module_level=True)

SIMPLE_ROWS = [
    ({"INPUT0": list(range(16)), "INPUT1": {"content": [1] * 16, "shape": [16]}},
     {"OUTPUT0": [i + 1 for i in range(16)], "OUTPUT1": [i - 1 for i in range(16)]}),
    ({"INPUT0": [5] * 16, "INPUT1": [2] * 16}, {"OUTPUT0": [7] * 16, "OUTPUT1": [3] * 16}),
]
STRING_ROWS = [{"INPUT": {"content": ["alpha", "", "gamma ray"], "shape": [3]}},
               {"INPUT": {"content": ["x", "yy"], "shape": [2]}}]


@pytest.fixture(scope="module")
def data_files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pa_data")
    files = {
        # perf_analyzer checks every response against validation_data (not with shared memory: it compares
        # the response's own bytes, which an output in shared memory does not carry, with Triton too)
        "simple_checked": {"data": [i for i, _ in SIMPLE_ROWS], "validation_data": [o for _, o in SIMPLE_ROWS]},
        "simple": {"data": [i for i, _ in SIMPLE_ROWS]},
        "strings": {"data": STRING_ROWS},  # steps of different shapes (a dynamic dim)
        # perf_analyzer batches a step's tensors only when their shapes agree
        "strings_same_shape": {"data": [STRING_ROWS[0], {"INPUT": {"content": ["x", "yy", "z"], "shape": [3]}}]},
    }
    paths = {}
    for name, doc in files.items():
        paths[name] = root / f"{name}.json"
        paths[name].write_text(json.dumps(doc))
    return paths


@pytest.fixture(scope="module")
def pa_server(tmp_path_factory):
    repo = build_repository(tmp_path_factory.mktemp("pa_repo"))
    mb.accumulator(repo / "acc" / "1" / "model.onnx", echo=False)  # a sequence model (perf_analyzer reads its config)
    (repo / "acc" / "config.pbtxt").write_text(mb.ACCUMULATOR_CONFIG % (10_000_000, "TYPE_UINT64"))
    srv = start_server(repo, tmp_path_factory.mktemp("pa_srv"))
    yield srv
    srv.stop()


# (id, model, protocol, extra perf_analyzer arguments; "@name" is the path of data file `name`)
CASES = [
    ("http-sync", "simple", "http", []),
    ("grpc-sync", "simple", "grpc", []),
    ("http-async", "simple", "http", ["--async", "--concurrency-range", "2"]),
    ("grpc-async", "simple", "grpc", ["--async", "--concurrency-range", "2"]),
    ("grpc-streaming", "simple", "grpc", ["--streaming"]),
    ("http-shm", "simple", "http", ["--shared-memory", "system", "--input-data", "@simple"]),
    ("grpc-shm-batch4", "simple", "grpc", ["--shared-memory", "system", "-b", "4"]),
    ("http-batch4-zero", "simple", "http", ["-b", "4", "--input-data", "zero"]),
    ("http-json-validated", "simple", "http", ["--input-data", "@simple_checked"]),
    ("grpc-json-validated-async", "simple", "grpc", ["--input-data", "@simple_checked", "--async"]),
    ("http-bytes-random", "strings", "http", ["--shape", "INPUT:3", "--input-data", "random"]),
    ("grpc-bytes-json-batch2", "strings", "grpc", ["--input-data", "@strings_same_shape", "-b", "2"]),
    ("http-bytes-shm", "strings", "http", ["--shared-memory", "system", "--shape", "INPUT:4"]),
    ("grpc-streaming-bytes-shm", "strings", "grpc", ["--streaming", "--shared-memory", "system",
                                                     "--input-data", "@strings"]),
    ("grpc-dtypes", "dtypes", "grpc", ["-b", "2"]),
    ("http-nobatch-shm", "nobatch", "http", ["--shared-memory", "system"]),
    # sequences: perf_analyzer sends sequence_id / start / end (not validated: at a window's end it may close a
    # sequence early with its last step's data, whose expected output then cannot match, with Triton too)
    ("http-sequence", "acc", "http", ["--sequence-length", "4"]),
    ("grpc-streaming-sequences", "acc", "grpc", ["--streaming", "--concurrency-range", "4", "--sequence-length", "4"]),
    ("http-async-sequences", "acc", "http", ["--async", "--concurrency-range", "4", "--sequence-id-range", "100:200"]),
]


def _success_count(srv, model: str) -> int:
    with urllib.request.urlopen(f"http://{srv.http_url}/v2/models/{model}/stats", timeout=10) as resp:
        doc = json.loads(resp.read(OUTPUT_LIMIT_BYTES))
    return sum(s["inference_stats"]["success"]["count"] for s in doc["model_stats"])


@pytest.mark.parametrize("model,protocol,extra", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_perf_analyzer_mode(pa_server, data_files, tmp_path, model, protocol, extra):
    url = pa_server.http_url if protocol == "http" else pa_server.grpc_url
    args = [str(data_files[a[1:]]) if a.startswith("@") else a for a in extra]
    csv_path = tmp_path / "out.csv"
    before = _success_count(pa_server, model)
    proc = subprocess.run(
        [str(PERF_ANALYZER), "-m", model, "-u", url, "-i", protocol, *args,
         "--measurement-mode", "count_windows", "--measurement-request-count", "50",
         # stability is not what is tested: the first windows are taken as they come
         "--stability-percentage", "100000", "--max-trials", "3",
         "--output-shared-memory-size", "4096", "-f", str(csv_path)],
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    output = (proc.stdout + proc.stderr)[-OUTPUT_LIMIT_BYTES:]
    assert proc.returncode == 0, output
    assert not re.search(r"warn|error|fail", output, re.IGNORECASE), output
    with csv_path.open() as f:
        row = next(csv.DictReader(f))
    assert float(row["Inferences/Second"]) > 0, row
    client_requests = int(re.search(r"Request count: (\d+)", output).group(1))
    server_requests = int(re.search(r"Successful request count: (\d+)", output).group(1))
    assert client_requests > 0 and server_requests > 0, output
    # our statistics counted at least the requests of the last window (perf_analyzer sent more: earlier windows)
    assert _success_count(pa_server, model) - before >= max(client_requests, server_requests)


TOKEN = "pa-token"


@pytest.fixture(scope="module")
def pa_tls_server(tmp_path_factory):
    """Mutual TLS on both ports and a bearer token, as a site exposing gt-serve would run it."""
    from gt_serve.testing.tls_certs import TestCA

    pki = tmp_path_factory.mktemp("pa_pki")
    ca = TestCA(pki)
    server, client = ca.leaf("server"), ca.leaf("client")
    repo = build_repository(tmp_path_factory.mktemp("pa_tls_repo"))
    tls = []
    for proto in ("http", "grpc"):
        tls += [f"--{proto}-use-ssl-mutual", f"--{proto}-server-cert", str(server.cert),
                f"--{proto}-server-key", str(server.key), f"--{proto}-root-cert", str(ca.cert)]
    srv = launch(["--model-repository", str(repo), "--auth-token", TOKEN, *tls],
                 workdir=tmp_path_factory.mktemp("pa_tls_srv"), repo=repo, tls_ca=ca.cert,
                 tls_client=(client.cert, client.key))
    yield srv, ca, client
    srv.stop()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_over_mutual_tls_with_a_token(pa_tls_server, tmp_path, protocol):
    """perf_analyzer's own TLS flags and `-H`: it sends the header's value with the space after the colon, which an
    HTTP header drops and a gRPC metadata value keeps (the server strips it, as HTTP does)."""
    srv, ca, client = pa_tls_server
    if protocol == "http":
        url, tls = f"https://{srv.http_url}", ["--ssl-https-verify-peer", "1", "--ssl-https-verify-host", "2",
                                                "--ssl-https-ca-certificates-file", str(ca.cert),
                                                "--ssl-https-client-certificate-file", str(client.cert),
                                                "--ssl-https-private-key-file", str(client.key)]
    else:
        url, tls = srv.grpc_url, ["--ssl-grpc-use-ssl", "--ssl-grpc-root-certifications-file", str(ca.cert),
                                  "--ssl-grpc-certificate-chain-file", str(client.cert),
                                  "--ssl-grpc-private-key-file", str(client.key)]
    base = [str(PERF_ANALYZER), "-m", "simple", "-u", url, "-i", protocol, *tls, "--measurement-mode",
            "count_windows", "--measurement-request-count", "50", "--stability-percentage", "100000",
            "--max-trials", "3"]
    refused = subprocess.run(base, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert refused.returncode != 0 and "bearer token" in refused.stdout + refused.stderr  # the control
    proc = subprocess.run([*base, "-H", f"authorization: Bearer {TOKEN}"], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    output = (proc.stdout + proc.stderr)[-OUTPUT_LIMIT_BYTES:]
    assert proc.returncode == 0, output
    assert float(re.search(r"Throughput: ([\d.]+) infer/sec", output).group(1)) > 0, output
