"""The link between the worker processes of one server (protocol/worker_link.py) over real unix sockets, and
the statistics of several workers made into one answer (core/worker_stats.py)."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gt_serve.core.worker_stats import merge_statistics
from gt_serve.errors import Code, GtServeError, ModelNotFound, Unavailable
from gt_serve.protocol.worker_link import READY_OP, WorkerLink, WorkerSpec

TIMEOUT_S = 10.0


def links(directory: Path, count: int, **kwargs) -> list[WorkerLink]:
    return [WorkerLink(WorkerSpec(directory, i, count), **kwargs) for i in range(count)]


def test_the_spec_travels_in_the_environment(tmp_path):
    spec = WorkerSpec(tmp_path, 1, 3)
    assert WorkerSpec.from_environ(spec.environ()) == spec
    assert WorkerSpec.from_environ({}) is None
    assert spec.peers == [0, 2]


@pytest.mark.asyncio
async def test_a_broadcast_reaches_every_other_worker_with_its_bytes(tmp_path):
    group = links(tmp_path, 3)
    seen: dict[int, tuple] = {}
    for link in group:
        def record(name, parameters, index=link.index):
            seen[index] = (name, parameters)
            return index
        link.handle("load_model", record)
    for link in group:
        await link.start()
    try:
        parameters = {"config": "{}", "file:1/model.onnx": b"\x00\x01binary\xff"}
        results = await asyncio.wait_for(group[1].broadcast("load_model", "m", parameters), TIMEOUT_S)
        assert results == [0, 2]
        assert seen == {0: ("m", parameters), 2: ("m", parameters)}
        every = await asyncio.wait_for(group[1].everyone("here", "load_model", "m", {}), TIMEOUT_S)
        assert every == [0, "here", 2], "every worker's answer, in worker order"
    finally:
        for link in group:
            await link.close()


@pytest.mark.asyncio
async def test_a_peers_error_comes_back_with_its_code_kind_and_worker(tmp_path):
    first, second = links(tmp_path, 2)

    async def fail(name):
        raise ModelNotFound(f"Request for unknown model: '{name}' is not found")

    second.handle("statistics", fail)
    await first.start()
    await second.start()
    try:
        with pytest.raises(GtServeError) as caught:
            await asyncio.wait_for(first.broadcast("statistics", "nope"), TIMEOUT_S)
        assert caught.value.code is Code.INVALID_ARGUMENT and caught.value.kind == "model_not_found"
        assert "worker 1" in caught.value.message and "'nope'" in caught.value.message
        with pytest.raises(GtServeError, match="unknown worker call 'no_such_op'"):
            await asyncio.wait_for(first.broadcast("no_such_op"), TIMEOUT_S)
    finally:
        await first.close()
        await second.close()


@pytest.mark.asyncio
async def test_ready_only_once_every_worker_has_said_so(tmp_path):
    group = links(tmp_path, 3)
    for link in group:
        await link.start()
    try:
        for link in group[:2]:  # what all_ready says first; once it returns, every other worker has heard it
            await asyncio.wait_for(link.broadcast(READY_OP, link.index), TIMEOUT_S)
        assert [link.peers_ready.is_set() for link in group] == [False, False, True]
        assert await asyncio.wait_for(group[2].all_ready(), TIMEOUT_S)
        assert all(link.peers_ready.is_set() for link in group)
    finally:
        for link in group:
            await link.close()


@pytest.mark.asyncio
async def test_a_worker_that_never_comes_is_unavailable_after_the_connect_timeout(tmp_path):
    (link,) = links(tmp_path, 2, connect_timeout_s=0.2)[:1]
    with pytest.raises(Unavailable, match="worker 1 cannot be reached"):
        await asyncio.wait_for(link.broadcast("statistics"), TIMEOUT_S)


def model_stats(name: str, version: str, count: int, last: int, batches: dict[int, int], energy_j: float) -> dict:
    timing = {"count": count, "ns": 1000 * count}
    return {"name": name, "version": version, "last_inference": last, "inference_count": count,
            "execution_count": sum(batches.values()),
            "inference_stats": {"success": timing, "fail": {"count": 0, "ns": 0}, "queue": timing},
            "response_stats": {},
            "batch_stats": [{"batch_size": size, "compute_infer": {"count": n, "ns": 10 * n}}
                            for size, n in sorted(batches.items())],
            "memory_usage": [], "warmup": {"count": 1, "ns": 5}, "spilled": {},
            "energy": {"dynamic_j": energy_j, "dynamic_j_per_inference": energy_j / count if count else 0.0}}


def test_statistics_of_two_workers_add_up_as_one_servers():
    zero = {"model_stats": [model_stats("mlp", "1", 10, 500, {1: 4, 3: 2}, 1.0)], "energy": {"total": {"idle_j": 7}}}
    one = {"model_stats": [model_stats("mlp", "1", 30, 900, {1: 6, 8: 3}, 2.0), model_stats("cnn", "2", 5, 100, {}, 0)],
           "energy": {"total": {"idle_j": 7}}}
    merged = merge_statistics([zero, one])
    assert [(m["name"], m["version"]) for m in merged["model_stats"]] == [("cnn", "2"), ("mlp", "1")]
    mlp = merged["model_stats"][1]
    assert mlp["inference_count"] == 40 and mlp["execution_count"] == 15 and mlp["last_inference"] == 900
    assert mlp["inference_stats"]["success"] == {"count": 40, "ns": 40_000}
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in mlp["batch_stats"]] == [(1, 10), (3, 2), (8, 3)]
    assert mlp["energy"] == {"dynamic_j": 3.0, "dynamic_j_per_inference": 3.0 / 40}
    assert list(mlp) == list(zero["model_stats"][0]), "the fields keep Triton's order"
    # node-wide extensions are not added (each worker books the node's idle power): listed per worker
    assert "energy" not in merged
    assert merged["workers"] == [{"worker": 0, "energy": {"total": {"idle_j": 7}}},
                                 {"worker": 1, "energy": {"total": {"idle_j": 7}}}]


def test_statistics_without_extensions_have_no_workers_list():
    merged = merge_statistics([{"model_stats": []}, {"model_stats": [model_stats("a", "1", 1, 1, {1: 1}, 0.0)]}])
    assert "workers" not in merged and merged["model_stats"][0]["inference_count"] == 1
