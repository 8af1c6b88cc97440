"""Issue #15 item 3: TLS on the serving ports, the Triton way (--grpc-use-ssl, --grpc-server-cert/-key,
--grpc-root-cert, --grpc-use-ssl-mutual, and the same for HTTP), on both gRPC transports.

Real gt-serve processes, certificates made at test time (gt_serve/testing/tls_certs.py), real tritonclient with
ssl=True, raw sockets for the plaintext-to-TLS and silent-client cases. Loopback only.
"""
from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from gt_serve.testing import model_builders as mb
from gt_serve.testing.launcher import launch
from gt_serve.testing.tls_certs import TestCA

pytestmark = pytest.mark.security

TIMEOUT_S = 20.0
HANDSHAKE_TIMEOUT_S = 1.0  # --header-timeout-s: bounds the HTTPS handshake too
WIDE = 400_000  # a "wide" request: 2 x 1.6 MB, past a stream's window and the largest HTTP/2 frame


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    base = tmp_path_factory.mktemp("pki")
    ca, other = TestCA(base / "ca", "gt-test-ca"), TestCA(base / "other", "other-ca")
    return {"ca": ca.cert, "server": ca.leaf("server"), "client": ca.leaf("client"),
            "stranger": other.leaf("stranger"), "other_ca": other.cert}


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    mb.simple_add_sub(root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(mb.SIMPLE_CONFIG)
    mb.simple_add_sub(root / "wide" / "1" / "model.onnx", size=WIDE)  # no config: completed from the graph
    return root


def tls_args(pki, *, mutual: bool = False, ports: tuple[str, ...] = ("http", "grpc")) -> list[str]:
    args = []
    for port in ports:
        args += [f"--{port}-use-ssl", f"--{port}-server-cert", str(pki["server"].cert),
                 f"--{port}-server-key", str(pki["server"].key)]
        if mutual:
            args += [f"--{port}-use-ssl-mutual", f"--{port}-root-cert", str(pki["ca"])]
    return args


def start(repo, tmp, pki, transport: str, *extra: str, mutual: bool = False):
    return launch(["--model-repository", str(repo), "--header-timeout-s", str(HANDSHAKE_TIMEOUT_S),
                   *tls_args(pki, mutual=mutual), *extra], workdir=tmp, env={"GT_GRPC_TRANSPORT": transport},
                  tls_ca=pki["ca"], tls_client=(pki["client"].cert, pki["client"].key) if mutual else None)


@pytest.fixture(scope="module", params=["native", "grpcio"])
def tls_server(request, repo, pki, tmp_path_factory):
    srv = start(repo, tmp_path_factory.mktemp(f"tls_{request.param}"), pki, request.param, "--metrics-use-ssl")
    srv.transport = request.param
    yield srv
    srv.stop()


def ssl_factory(pki, client: str | None = None, ca: str = "ca"):
    def factory() -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(pki[ca]))
        if client:
            ctx.load_cert_chain(str(pki[client].cert), str(pki[client].key))
        return ctx
    return factory


def grpc_client(url: str, pki, client: str | None = None) -> grpcclient.InferenceServerClient:
    leaf = pki[client] if client else None
    return grpcclient.InferenceServerClient(url, ssl=True, root_certificates=str(pki["ca"]),
                                            private_key=str(leaf.key) if leaf else None,
                                            certificate_chain=str(leaf.cert) if leaf else None)


def infer_simple(client, module) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    inputs = []
    for name, arr in (("INPUT0", a), ("INPUT1", b)):
        inp = module.InferInput(name, [1, 16], "INT32")
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    kwargs = {"client_timeout": TIMEOUT_S} if module is grpcclient else {}
    result = client.infer("simple", inputs, **kwargs)
    assert np.array_equal(result.as_numpy("OUTPUT0"), a + b)
    assert np.array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_http_over_tls_with_tritonclient(tls_server, pki):
    client = httpclient.InferenceServerClient(tls_server.http_url, ssl=True, ssl_context_factory=ssl_factory(pki),
                                              network_timeout=TIMEOUT_S, connection_timeout=TIMEOUT_S)
    try:
        assert client.is_server_ready()
        infer_simple(client, httpclient)
    finally:
        client.close()
    # a client that does not trust the test CA refuses the server's certificate
    with pytest.raises(ssl.SSLCertVerificationError):
        tls_connect(tls_server.http_url, ssl.create_default_context())


def test_grpc_over_tls_with_tritonclient(tls_server, pki):
    client = grpc_client(tls_server.grpc_url, pki)
    try:
        assert client.is_server_ready(client_timeout=TIMEOUT_S)
        infer_simple(client, grpcclient)
        # tensors of megabytes: frames of the largest size, read through TLS into their own buffers, and flow control
        a = np.arange(2 * WIDE, dtype=np.int32).reshape(2, WIDE)
        b = np.full((2, WIDE), 7, dtype=np.int32)
        inputs = [grpcclient.InferInput(name, [2, WIDE], "INT32") for name in ("INPUT0", "INPUT1")]
        for inp, arr in zip(inputs, (a, b)):
            inp.set_data_from_numpy(arr)
        result = client.infer("wide", inputs, client_timeout=TIMEOUT_S)
        assert np.array_equal(result.as_numpy("OUTPUT0"), a + b) and np.array_equal(result.as_numpy("OUTPUT1"), a - b)
    finally:
        client.close()
    plain = grpcclient.InferenceServerClient(tls_server.grpc_url)  # plaintext to the TLS port: refused
    try:
        with pytest.raises(InferenceServerException):
            plain.is_server_ready(client_timeout=3.0)
    finally:
        plain.close()
    assert tls_server.proc.poll() is None


def test_metrics_port_over_tls(tls_server, pki):
    with tls_connect(tls_server.metrics_url, ssl_factory(pki)()) as tls:
        tls.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        body = read_all(tls)
    assert body.startswith(b"HTTP/1.1 200") and b"nv_inference_request_success" in body


def tls_connect(url: str, ctx: ssl.SSLContext, alpn: tuple[str, ...] = ()) -> ssl.SSLSocket:
    host, port = url.rsplit(":", 1)
    if alpn:
        ctx.set_alpn_protocols(list(alpn))
    sock = socket.create_connection((host, int(port)), timeout=TIMEOUT_S)
    try:
        return ctx.wrap_socket(sock, server_hostname=host)
    except BaseException:
        sock.close()
        raise


def read_all(sock: socket.socket, limit_bytes: int = 1 << 20) -> bytes:
    data = b""
    while len(data) < limit_bytes:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def closed_within_s(url: str, payload: bytes, limit_s: float) -> float:
    """Seconds until the server closes a raw plaintext connection that sent `payload` (bounded by limit_s)."""
    host, port = url.rsplit(":", 1)
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=limit_s) as sock:
        if payload:
            sock.sendall(payload)
        try:
            while len(sock.recv(4096)) > 0:  # a TLS alert at most, then EOF
                pass
        except ConnectionResetError:
            pass
    return time.monotonic() - started


@pytest.mark.parametrize("port", ["http", "grpc"])
def test_plaintext_client_to_tls_port_is_closed_fast_and_others_are_served(tls_server, pki, port):
    url = tls_server.http_url if port == "http" else tls_server.grpc_url
    payload = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n" if port == "http" else \
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00" * 9
    assert closed_within_s(url, payload, TIMEOUT_S) < 2.0
    # a silent client holds a handshake open no longer than the handshake timeout, and never blocks others
    host, p = url.rsplit(":", 1)
    with socket.create_connection((host, int(p)), timeout=TIMEOUT_S) as silent:
        started = time.monotonic()
        with tls_connect(url, ssl_factory(pki)(), alpn=("http/1.1",) if port == "http" else ("h2",)) as probe:
            assert probe.version() in ("TLSv1.2", "TLSv1.3")
            assert probe.selected_alpn_protocol() == ("http/1.1" if port == "http" else "h2")
        assert time.monotonic() - started < 2.0
        if port == "http" or tls_server.transport == "native":  # grpcio: its own handshake timeout
            silent.settimeout(HANDSHAKE_TIMEOUT_S + TIMEOUT_S)
            assert silent.recv(16) == b""  # closed by the handshake timeout
            assert time.monotonic() - started < HANDSHAKE_TIMEOUT_S + 10.0
    assert tls_server.proc.poll() is None


@pytest.fixture(scope="module", params=["native", "grpcio"])
def mutual_server(request, repo, pki, tmp_path_factory):
    srv = start(repo, tmp_path_factory.mktemp(f"mtls_{request.param}"), pki, request.param, mutual=True)
    yield srv
    srv.stop()


def test_mutual_tls_http(mutual_server, pki):
    ok = httpclient.InferenceServerClient(mutual_server.http_url, ssl=True,
                                          ssl_context_factory=ssl_factory(pki, "client"), network_timeout=TIMEOUT_S)
    try:
        infer_simple(ok, httpclient)
    finally:
        ok.close()
    for client in (None, "stranger"):  # no certificate; one from another CA
        with pytest.raises((ssl.SSLError, ConnectionError)):
            with tls_connect(mutual_server.http_url, ssl_factory(pki, client)()) as tls:
                tls.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
                assert tls.recv(1) == b""  # TLS 1.3: the refusal arrives after the handshake
                raise ConnectionError("closed without an answer")
    assert mutual_server.proc.poll() is None


def test_mutual_tls_grpc(mutual_server, pki):
    ok = grpc_client(mutual_server.grpc_url, pki, "client")
    try:
        infer_simple(ok, grpcclient)
    finally:
        ok.close()
    for client in (None, "stranger"):
        refused = grpc_client(mutual_server.grpc_url, pki, client)
        try:
            with pytest.raises(InferenceServerException):
                refused.is_server_ready(client_timeout=5.0)
        finally:
            refused.close()
    assert mutual_server.proc.poll() is None


def run_cli(args: list[str], cwd: Path, env_transport: str = "native") -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "GT_GRPC_TRANSPORT": env_transport, "PYTHONPATH": str(Path(__file__).parents[2])}
    return subprocess.run([sys.executable, "-m", "gt_serve", "--http-port", "0", "--grpc-port", "0",
                           "--metrics-port", "0", "--host", "127.0.0.1", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("transport", ["native", "grpcio"])
def test_bad_certificate_files_exit_2_naming_the_file(repo, pki, tmp_path, transport):
    not_pem = tmp_path / "not-pem.key"
    not_pem.write_text("hello\n")
    missing = tmp_path / "missing.pem"
    server = pki["server"]
    cases = [
        (["--grpc-use-ssl", "--grpc-server-cert", str(missing), "--grpc-server-key", str(server.key)], missing.name),
        (["--grpc-use-ssl", "--grpc-server-cert", str(server.cert), "--grpc-server-key", str(not_pem)], not_pem.name),
        (["--grpc-use-ssl", "--grpc-server-cert", str(server.cert), "--grpc-server-key", str(pki["client"].key)],
         "do not load as a pair"),
        (["--grpc-use-ssl-mutual", "--grpc-server-cert", str(server.cert), "--grpc-server-key", str(server.key),
          "--grpc-root-cert", str(missing)], missing.name),
        (["--http-use-ssl", "--http-server-cert", str(missing), "--http-server-key", str(server.key)], missing.name),
        (["--http-use-ssl", "--http-server-cert", str(server.cert)], "server.http_server_key"),
    ]
    for args, named in cases:
        done = run_cli(["--model-repository", str(repo), "--allow-metrics=false", *args], tmp_path, transport)
        assert done.returncode == 2, (args, done.stderr[-2000:])
        assert named in done.stderr, done.stderr[-2000:]
        assert "Traceback" not in done.stderr
