"""PeerClient against a real gt-serve gRPC front end (both transports) on loopback: a forward's tensors,
parameters and outputs arrive and return intact; the peer's errors are told apart by their kind
(the `gt-error-kind` trailer), never by their text."""
from __future__ import annotations

import numpy as np
import pytest
import pytest_asyncio

from gt_serve.edge.peer_client import PeerClient
from gt_serve.errors import InvalidArgument, ModelNotFound, PeerUnavailable
from gt_serve.protocol.grpc import start_grpc
from gt_serve.protocol.grpc_native_server import start_grpc_native
from gt_serve.types import InferRequest, InferResponse, RequestedOutput, Tensor

TRANSPORTS = {"grpcio": start_grpc, "native": start_grpc_native}


class Peer:
    """The data plane of a peer: doubles `x`, echoes `names` (BYTES), remembers what it was sent."""

    def __init__(self) -> None:
        self.seen: list[InferRequest] = []

    async def infer(self, request: InferRequest) -> InferResponse:
        self.seen.append(request)
        if request.model_name == "gone":
            raise ModelNotFound("Request for unknown model: 'gone' is not found")  # same words as bad input
        if request.model_name == "picky":
            raise InvalidArgument("Request for unknown model: 'picky' is not found")
        x = request.inputs[0].data
        outputs = [Tensor("y", "FP32", x.shape, x * 2), Tensor("names", "BYTES", (2,), np.array([b"a", b"bc"], object))]
        return InferResponse(request.model_name, "3", request.id, outputs)


@pytest_asyncio.fixture(params=sorted(TRANSPORTS))
async def peer(request):
    plane = Peer()
    front = await TRANSPORTS[request.param](plane, "127.0.0.1", 0)
    client = PeerClient(timeout_s=5.0)
    try:
        yield plane, client, f"127.0.0.1:{front.port}"
    finally:
        await client.close()
        await front.stop(0)


def request_for(model: str) -> InferRequest:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    return InferRequest(model, "", "req-1", [Tensor("x", "FP32", (2, 3), x)],
                        outputs=[RequestedOutput("y"), RequestedOutput("names")],
                        parameters={"tenant": "t1", "weight": 0.5, "flag": True}, priority=2, hops=0)


@pytest.mark.asyncio
async def test_a_forward_arrives_and_returns_intact(peer) -> None:
    plane, client, endpoint = peer
    response = await client.forward("b", endpoint, request_for("m"), visited=frozenset({"a"}))
    (seen,) = plane.seen
    np.testing.assert_array_equal(seen.inputs[0].data, request_for("m").inputs[0].data)
    assert seen.id == "req-1" and seen.priority == 2
    assert seen.parameters["gt_hops"] == 1 and seen.parameters["gt_visited"] == "a"  # read by the peer's DataPlane
    assert seen.deadline_s is not None  # the forward timeout travels as the gRPC deadline
    assert {k: seen.parameters[k] for k in ("tenant", "weight", "flag")} == {"tenant": "t1", "weight": 0.5, "flag": True}
    assert [o.name for o in seen.outputs] == ["y", "names"]
    y, names = response.outputs
    np.testing.assert_array_equal(y.data, np.arange(6, dtype=np.float32).reshape(2, 3) * 2)
    assert list(names.data) == [b"a", b"bc"] and response.model_version == "3"
    assert response.parameters == {"gt_served_by": "b"}


@pytest.mark.asyncio
async def test_an_unknown_model_on_the_peer_is_the_peers_fault_bad_input_the_clients(peer) -> None:
    _, client, endpoint = peer
    with pytest.raises(PeerUnavailable) as gone:
        await client.forward("b", endpoint, request_for("gone"))
    assert gone.value.peer == "b"
    with pytest.raises(InvalidArgument) as picky:  # same words, no kind: the client's own error
        await client.forward("b", endpoint, request_for("picky"))
    assert not isinstance(picky.value, PeerUnavailable) and "picky" in picky.value.message


@pytest.mark.asyncio
async def test_a_peer_that_is_not_there_is_unavailable() -> None:
    client = PeerClient(timeout_s=2.0)
    try:
        with pytest.raises(PeerUnavailable):
            await client.forward("ghost", "127.0.0.1:1", request_for("m"))
    finally:
        await client.close()
