"""The forward batcher (core/forward_batcher.py) against a real peer: a real gt-serve process reached
through the real PeerClient (the V2 stub over grpc.aio). Requests in one window go as one RPC, split back."""
import asyncio

import numpy as np
import pytest
import tritonclient.http as httpclient

from gt_serve.core.forward_batcher import ForwardBatcher
from gt_serve.edge.peer_client import PeerClient
from gt_serve.errors import PeerUnavailable
from gt_serve.testing import model_builders as mb
from gt_serve.types import InferRequest, Tensor
from tests.conftest import start_server


@pytest.fixture(scope="module")
def peer(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo_fwd")
    mb.scale(repo / "scale" / "1" / "model.onnx", factor=2.0, width=4)
    (repo / "scale" / "config.pbtxt").write_text('name: "scale"\nmax_batch_size: 64\n')
    srv = start_server(repo, tmp_path_factory.mktemp("srv_fwd"))
    yield srv
    srv.stop()


def request(i: int, rows: int = 1) -> InferRequest:
    x = np.full((rows, 4), float(i), np.float32)
    return InferRequest("scale", id=f"r{i}", inputs=[Tensor("INPUT", "FP32", x.shape, x)])


def peer_requests(srv) -> int:
    stats = httpclient.InferenceServerClient(srv.http_url).get_inference_statistics("scale")
    return stats["model_stats"][0]["inference_stats"]["success"]["count"]


@pytest.mark.asyncio
async def test_one_window_is_one_rpc_and_each_gets_its_rows(peer):
    client = PeerClient()
    batcher = ForwardBatcher(client.forward, window_s=0.05, max_batch=64, max_batch_for=lambda m: 64)
    before = peer_requests(peer)
    rows = [1, 2, 1, 3, 1, 2, 1, 1]
    answers = await asyncio.wait_for(asyncio.gather(
        *(batcher.forward("peer", peer.grpc_url, request(i, n)) for i, n in enumerate(rows))), 30)
    assert peer_requests(peer) - before == 1  # one RPC for the eight
    assert batcher.rpcs == 1 and batcher.merged == len(rows)
    for i, (n, answer) in enumerate(zip(rows, answers)):
        assert answer.id == f"r{i}"
        out = answer.outputs[0]
        assert out.shape == (n, 4)
        np.testing.assert_array_equal(out.data, np.full((n, 4), 2.0 * i, np.float32))


@pytest.mark.asyncio
async def test_max_batch_splits_groups_and_unbatchable_models_go_alone(peer):
    client = PeerClient()
    batcher = ForwardBatcher(client.forward, window_s=0.05, max_batch=4, max_batch_for=lambda m: 64)
    before = peer_requests(peer)
    answers = await asyncio.wait_for(asyncio.gather(
        *(batcher.forward("peer", peer.grpc_url, request(i)) for i in range(8))), 30)
    assert [a.outputs[0].data[0, 0] for a in answers] == [2.0 * i for i in range(8)]
    assert peer_requests(peer) - before == 2 and batcher.rpcs == 2  # 4 samples at most per RPC
    alone = ForwardBatcher(client.forward, window_s=0.05, max_batch=64, max_batch_for=lambda m: 0)
    before = peer_requests(peer)
    await asyncio.wait_for(asyncio.gather(*(alone.forward("peer", peer.grpc_url, request(i)) for i in range(3))), 30)
    assert peer_requests(peer) - before == 3 and alone.rpcs == 0


@pytest.mark.asyncio
async def test_a_failed_batched_rpc_fails_every_member(peer):
    batcher = ForwardBatcher(PeerClient(timeout_s=5).forward, window_s=0.02, max_batch=64, max_batch_for=lambda m: 64)
    closed_port = "127.0.0.1:1"  # nothing listens there
    results = await asyncio.wait_for(asyncio.gather(
        *(batcher.forward("gone", closed_port, request(i)) for i in range(3)), return_exceptions=True), 30)
    assert all(isinstance(r, PeerUnavailable) for r in results), results
