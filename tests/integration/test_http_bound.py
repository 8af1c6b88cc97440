"""Bound HTTP requests (protocol/http_known.py, `HttpExpress.bind` / `serve_bound` / `bound_answer`): a request whose
head and JSON part, byte for byte, are those of one the express lane took from a known head is submitted from what the
lane resolved it to, and answered from its plan's encoded head joined with the outputs.

Against the full path, as tests/integration/test_http_express.py does for the express lane: two real servers in this
process over real loopback sockets, one with the express lane (the default) and one without, sent the same requests;
the same bytes, the same statistics, the same errors, whichever way a request went. A bound request whose client goes
away while it waits: tests/integration/test_http_express.py (test_a_client_that_goes_away_..., "bound").
"""
from __future__ import annotations

import asyncio
import zlib
from pathlib import Path

import numpy as np
import orjson
import pytest

from gt_serve.app import App
from tests.conftest import assert_same_counts
from tests.integration.test_http_express import (BOTH, TABLE, Connection, infer_bytes, outputs_of, read_response,
                                                 repo, served, serving, stats, unparsed, until)
from tests.models import gather_repository

__all__ = ["repo"]  # the module's repository fixture, shared


def bound(app: App) -> int:
    return app.http._express.bound_served


def joined(app: App) -> int:
    return app.http._express.joined


@pytest.mark.asyncio
async def test_bound_requests_answer_byte_for_byte_as_the_full_path(repo):
    """Forms with no id, a fixed id (keyed with the id cut out), perf_analyzer's empty id, a subset of the outputs, and
    compression asked for (an answer too short to be compressed, and one compressed): eight requests each with new
    data on one connection. The first three teach the skeleton and the plan, the fourth (the first served from the
    plan) the head, the fifth (the head's first unparsed request) binds it; the last three are bound, and answered
    with the plan's encoded head joined to the outputs unless compressed. Every answer is the full path's, byte for
    byte, and the statistics count the same."""
    gzip = {"Accept-Encoding": "gzip"}
    forms = [({"outputs": BOTH}, 1), ({"outputs": BOTH, "request_id": "fixed-1"}, 1),
             ({"outputs": ["OUTPUT1"], "request_id": ""}, 1), ({"outputs": ["OUTPUT1", "OUTPUT0"], "headers": gzip}, 1),
             ({"outputs": BOTH, "headers": gzip}, 8)]
    rng = np.random.default_rng(41)
    async with serving(repo) as fast, serving(repo, express=False) as full:
        for form, rows in forms:  # 8 rows: an answer large enough to be compressed
            conns = [await Connection.open(fast), await Connection.open(full)]
            served0, bound0, unparsed0, joined0 = served(fast), bound(fast), unparsed(fast), joined(fast)
            compressed = rows == 8
            for _ in range(8):
                a, b = (rng.integers(-1000, 1000, (rows, 16), dtype=np.int32) for _ in range(2))
                request = infer_bytes("/v2/models/simple/infer", {"INPUT0": ("INT32", a), "INPUT1": ("INT32", b)},
                                      **form)
                (got,), (want,) = [await c.send(request) for c in conns]
                assert got[0] == 200, got[2]
                assert got[3] == want[3]  # status line, headers and body
                body = got[2]
                assert got[1].get("content-encoding") == ("gzip" if compressed else None)
                if compressed:
                    body = zlib.decompress(body, 31)
                    got[1]["content-length"] = str(len(body))
                assert np.array_equal(outputs_of(body, got[1])["OUTPUT1"], a - b)
                if "request_id" in form:
                    n = int(got[1]["inference-header-content-length"])
                    assert orjson.loads(body[:n]).get("id", "") == form["request_id"]  # an empty id is not echoed
            assert (served(fast) - served0, unparsed(fast) - unparsed0, bound(fast) - bound0) == (5, 4, 3), form
            assert joined(fast) - joined0 == (0 if compressed else 3), form  # answered from the plan's joined head
            for c in conns:
                await c.close()
        got, want = await stats(fast, "simple"), await stats(full, "simple")
        assert_same_counts(got, want)
        assert got["inference_stats"]["success"]["count"] == 8 * len(forms)
        # the joined answers' encoded heads are the full path's, kept with the template as its `_write` keeps them
        assert joined(fast) == 3 * (len(forms) - 1)


@pytest.mark.asyncio
async def test_a_bound_request_that_fails_or_meets_a_reloaded_model_is_answered_as_the_full_path(repo):
    """A bound request whose run fails gets the full path's error and count; after a reload, the next one is not
    served from the old plan: the head is declined and parsed, and the full path answers it (and plans it anew)."""
    async with serving(repo, model_control_mode="explicit", load_models=("gather",)) as fast, \
            serving(repo, express=False, model_control_mode="explicit", load_models=("gather",)) as full:
        conns = [await Connection.open(fast), await Connection.open(full)]

        def req(index: int) -> bytes:
            return infer_bytes("/v2/models/gather/infer", {"INDICES": ("INT64", np.array([[index]], np.int64))},
                               outputs=["OUTPUT"])

        async def both(index: int) -> tuple:
            (got,), (want,) = [await c.send(req(index)) for c in conns]
            assert got[3] == want[3]
            return got

        for index in (1, 2, 3, 4, 5):
            assert (await both(index))[0] == 200
        before = bound(fast)
        got = await both(100)  # out of range: the run fails
        assert got[0] >= 400 and orjson.loads(got[2])["error"].startswith("model 'gather': inference failed")
        assert bound(fast) == before + 1
        got = await both(6)
        assert got[0] == 200 and np.array_equal(outputs_of(got[2], got[1])["OUTPUT"].ravel(), TABLE[6])
        assert bound(fast) == before + 2
        got, want = await stats(fast, "gather"), await stats(full, "gather")
        assert_same_counts(got, want)
        assert got["inference_stats"]["fail"]["count"] == 1
        known = len(fast.http._server._known_heads)
        (status, _, body, _), = await conns[0].send(
            b"POST /v2/repository/models/gather/load HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        assert status == 200, body
        got = await conns[0].send(req(7))
        assert got[0][0] == 200 and np.array_equal(outputs_of(got[0][2], got[0][1])["OUTPUT"].ravel(), TABLE[7])
        assert bound(fast) == before + 2 and len(fast.http._server._known_heads) == known - 1
        (want,) = await conns[1].send(req(7))
        assert got[0][3] == want[3]
        for c in conns:
            await c.close()


@pytest.fixture(scope="module")
def small_queue_repo(tmp_path_factory) -> Path:
    """`gather_pair` (runs two requests together, or one alone after 1 s) with room for one waiting request."""
    root = gather_repository(tmp_path_factory.mktemp("bound_queue_repo"))
    config = root / "gather_pair" / "config.pbtxt"
    config.write_text(config.read_text().replace(
        "max_queue_delay_microseconds: 10000000", "max_queue_delay_microseconds: 1000000 "
        "default_queue_policy { max_queue_size: 1 }"))
    return root


@pytest.mark.asyncio
async def test_a_bound_request_the_queue_refuses_gets_the_full_paths_answer(small_queue_repo):
    """A bound request that finds the model's queue full is refused as `serve` refuses it: its head forgotten, the
    request parsed and answered by the full path, with the full path's error; the request waiting is served."""
    def req(index: int) -> bytes:
        return infer_bytes("/v2/models/gather_pair/infer", {"INDICES": ("INT64", np.array([[index]], np.int64))},
                           outputs=["OUTPUT"])

    async def teach(app: App) -> None:
        """Five lone requests, each run alone after its wait: the plan, the head and its binding learnt."""
        conn = await Connection.open(app)
        for i in range(5):
            (answer,) = await conn.send(req(i))
            assert answer[0] == 200
        await conn.close()

    async def refused(app: App) -> tuple:
        """A request left waiting in the queue and one more behind it: the second's answer."""
        executor = app.registry.get("gather_pair", "").executor
        waiting, late = await Connection.open(app), await Connection.open(app)
        waiting.writer.write(req(7))
        await until(lambda: executor.batcher.pending == 1, "the lone request never waited in the queue")
        (answer,) = await late.send(req(8))
        alone = await read_response(waiting.reader)
        assert alone[0] == 200 and np.array_equal(outputs_of(alone[2], alone[1])["OUTPUT"].ravel(), TABLE[7])
        await waiting.close()
        await late.close()
        return answer

    async with serving(small_queue_repo) as fast, serving(small_queue_repo, express=False) as full:
        await asyncio.gather(teach(fast), teach(full))
        before, heads = bound(fast), len(fast.http._server._known_heads)
        got, want = await refused(fast), await refused(full)
        assert bound(fast) == before + 1  # the waiting request came from the binding; the refused one did not
        assert got[0] == want[0] == 503 and got[3] == want[3], (got, want)
        assert "queue is full" in orjson.loads(got[2])["error"]
        assert len(fast.http._server._known_heads) == heads - 1  # the refused request's head forgotten
        assert_same_counts(await stats(fast, "gather_pair"), await stats(full, "gather_pair"))
