"""gRPC's standard health service (grpc.health.v1.Health/Check, what Kubernetes' `grpc:` probes, grpc_health_probe
and load balancers ask) on both gRPC transports, with gRPC's own health client (grpcio-health-checking): SERVING
while the server is ready, NOT_SERVING while it is not, no bearer token needed; Watch is not served, as in Triton."""
from __future__ import annotations

import grpc
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from gt_serve.testing import model_builders as mb
from gt_serve.testing.launcher import launch
from tests.conftest import start_server

TOKEN = "health-token"
TIMEOUT_S = 10.0


@pytest.fixture(scope="module", params=["grpcio", "native"])
def transport(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def servers(tmp_path_factory, transport):
    """A ready server with a bearer token, and one that stays not ready (a start-up model failed to load, with
    --exit-on-error=false and strict readiness)."""
    env = {"GT_GRPC_TRANSPORT": transport}
    root = tmp_path_factory.mktemp(f"health_repo_{transport}")
    mb.simple_add_sub(root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(mb.SIMPLE_CONFIG)
    broken = tmp_path_factory.mktemp(f"broken_repo_{transport}")
    (broken / "broken" / "1").mkdir(parents=True)
    (broken / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx model")
    ready = start_server(root, tmp_path_factory.mktemp("ready"), "--auth-token", TOKEN, env=env)
    try:
        not_ready = launch(["--model-repository", str(broken), "--exit-on-error=false"],
                           workdir=tmp_path_factory.mktemp("not_ready"), env=env, wait_ready=False)
        try:
            yield ready, not_ready
        finally:
            not_ready.stop()
    finally:  # the first server is stopped even when the second does not start
        ready.stop()


def _check(url: str, service: str = "") -> int:
    with grpc.insecure_channel(url) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT_S).status


def test_check_says_serving_when_ready_without_a_token(servers):
    ready, _ = servers
    assert _check(ready.grpc_url) == health_pb2.HealthCheckResponse.SERVING
    # as Triton, whatever service the request names
    assert _check(ready.grpc_url, "inference.GRPCInferenceService") == health_pb2.HealthCheckResponse.SERVING
    client = grpcclient.InferenceServerClient(ready.grpc_url)
    with pytest.raises(InferenceServerException, match="bearer token"):  # the control: other RPCs need the token
        client.get_model_metadata("simple")
    assert client.is_server_ready()  # Triton's own health RPCs stay open too


def test_check_says_not_serving_when_not_ready(servers):
    _, not_ready = servers
    assert not grpcclient.InferenceServerClient(not_ready.grpc_url).is_server_ready()
    assert _check(not_ready.grpc_url) == health_pb2.HealthCheckResponse.NOT_SERVING


def test_watch_is_not_served(servers):
    _, server = servers  # the one without a token: grpcio's interceptor asks for the token before the method
    with grpc.insecure_channel(server.grpc_url) as channel:
        stream = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=TIMEOUT_S)
        with pytest.raises(grpc.RpcError) as info:
            next(stream)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
