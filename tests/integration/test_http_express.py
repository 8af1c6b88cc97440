"""The HTTP express lane (protocol/http_express.py) against the full path: two real servers in this process over
real loopback sockets, one with `server.express` (the default) and one without, sent the same requests.

What a client gets must not depend on which way a request went: the same bytes (status line, headers, body), the
same statistics, the same errors; pipelined requests answered in order; a connection that goes away while its
request waits loses nothing for anyone else; anything the full path would treat differently (compression, a wrong
token, a reloaded or unloaded model) is not served from a plan.
"""
from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import zlib
from pathlib import Path

import numpy as np
import orjson
import pytest

from gt_serve.app import App
from tests.conftest import assert_same_counts, in_process_server
from tests.models import GATHER_TABLE, gather_repository

TIMEOUT_S = 30.0
BOTH = ["OUTPUT0", "OUTPUT1"]
TABLE = np.array(GATHER_TABLE, dtype=np.float32)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    return gather_repository(tmp_path_factory.mktemp("express_repo"))


def serving(repo: Path, **server):
    return in_process_server(repo, allow_grpc=False, **server)


async def until(condition, message: str) -> None:
    """Wait for `condition()` (a state of the server in this process), polling the loop, up to TIMEOUT_S."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TIMEOUT_S
    while not condition():
        assert loop.time() < deadline, message
        await asyncio.sleep(0.005)


def served(app: App) -> int:
    return app.http._express.served


def unparsed(app: App) -> int:
    """Requests offered to the express lane unparsed, their heads known (http_parsing.KnownHead), and taken."""
    return app.http._server.known_heads_served


def infer_bytes(path: str, inputs: dict, *, outputs: list[str] | None = None, params: dict | None = None,
                request_id: str | None = None, headers: dict | None = None) -> bytes:
    """One binary-extension infer request as it goes on the wire (JSON part, then the tensors)."""
    doc: dict = {}
    if request_id is not None:
        doc["id"] = request_id
    doc["inputs"] = [{"name": n, "datatype": dt, "shape": list(a.shape), "parameters": {"binary_data_size": a.nbytes}}
                     for n, (dt, a) in inputs.items()]
    if outputs is not None:
        doc["outputs"] = [{"name": o, "parameters": {"binary_data": True}} for o in outputs]
    if params is not None:
        doc["parameters"] = params
    head = orjson.dumps(doc)
    body = head + b"".join(a.tobytes() for _, a in inputs.values())
    fields = {"Host": "127.0.0.1", "Content-Type": "application/octet-stream",
              "Inference-Header-Content-Length": str(len(head)), "Content-Length": str(len(body)), **(headers or {})}
    head = f"POST {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items()) + "\r\n"
    return head.encode("latin-1") + body


def get_bytes(path: str, headers: dict | None = None) -> bytes:
    fields = {"Host": "127.0.0.1", **(headers or {})}
    return (f"GET {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items()) + "\r\n").encode()


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict, bytes, bytes]:
    """(status, headers, body, the whole response's bytes)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT_S)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    body = await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", "0"))), TIMEOUT_S)
    return int(lines[0].split()[1]), headers, body, head + body


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, app: App) -> Connection:
        return cls(*await asyncio.open_connection("127.0.0.1", app.http.port))

    async def send(self, *requests: bytes) -> list[tuple[int, dict, bytes, bytes]]:
        """Write the requests in one piece (pipelined), read their responses."""
        self.writer.write(b"".join(requests))
        await self.writer.drain()
        return [await read_response(self.reader) for _ in requests]

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


def outputs_of(body: bytes, headers: dict) -> dict[str, np.ndarray]:
    """The answer's outputs by name, binary or JSON (not those written to shared memory)."""
    n = int(headers.get("inference-header-content-length", len(body)))
    doc = orjson.loads(body[:n])
    arrays, at = {}, n
    for out in doc["outputs"]:
        dtype = {"INT32": np.int32, "FP32": np.float32}[out["datatype"]]
        if "data" in out:
            arrays[out["name"]] = np.array(out["data"], dtype).reshape(out["shape"])
            continue
        if "parameters" not in out:  # written to a shared-memory region
            continue
        size = out["parameters"]["binary_data_size"]
        arrays[out["name"]] = np.frombuffer(body[at:at + size], dtype).reshape(out["shape"])
        at += size
    assert at == len(body) or "inference-header-content-length" not in headers
    return arrays


def simple_pair(rng) -> tuple[np.ndarray, np.ndarray]:
    return (rng.integers(-1000, 1000, (1, 16), dtype=np.int32), rng.integers(-1000, 1000, (1, 16), dtype=np.int32))


async def stats(app: App, model: str) -> dict:
    conn = await Connection.open(app)
    try:
        (status, _, body, _), = await conn.send(get_bytes(f"/v2/models/{model}/stats"))
    finally:
        await conn.close()
    assert status == 200
    return orjson.loads(body)["model_stats"][0]


@pytest.mark.asyncio
async def test_same_bytes_and_statistics_as_the_full_path(repo):
    """Forms that differ in what they ask (all outputs, a subset in another order, binary_data_output, an id, a
    version in the path), each sent six times with new data: byte-for-byte the answers of the full path."""
    forms = [("/v2/models/simple/infer", {}), ("/v2/models/simple/infer", {"outputs": ["OUTPUT1", "OUTPUT0"]}),
             ("/v2/models/simple/infer", {"outputs": ["OUTPUT1"]}),
             ("/v2/models/simple/infer", {"params": {"binary_data_output": True}}),
             ("/v2/models/simple/infer", {"request_id": "req-7", "outputs": ["OUTPUT0"]}),
             ("/v2/models/simple/versions/1/infer", {"outputs": ["OUTPUT0", "OUTPUT1"]})]
    async with serving(repo) as fast, serving(repo, express=False) as full:
        assert full.http._express is None
        conns = [await Connection.open(fast), await Connection.open(full)]
        rng = np.random.default_rng(3)
        for path, kw in forms:
            for _ in range(6):
                a, b = simple_pair(rng)
                request = infer_bytes(path, {"INPUT0": ("INT32", a), "INPUT1": ("INT32", b)}, **kw)
                (got,), (want,) = [await c.send(request) for c in conns]
                assert got[0] == 200, got[2]
                assert got[3] == want[3]  # status line, headers and body
                expect = {"OUTPUT0": a + b, "OUTPUT1": a - b}
                for name, array in outputs_of(got[2], got[1]).items():
                    assert np.array_equal(array, expect[name])
        for c in conns:
            await c.close()
        # each form: the first request decoded in full, the second learns its skeleton, the third its plan; not the
        # first form, whose outputs go back as JSON (no binary_data asked): its answers are encoded each time
        assert served(fast) == (len(forms) - 1) * 3
        assert unparsed(fast) == (len(forms) - 1) * 2  # the first express one of each form taught its head
        got, want = await stats(fast, "simple"), await stats(full, "simple")
        assert_same_counts(got, want)
        assert got["inference_stats"]["success"]["count"] == len(forms) * 6


@pytest.mark.asyncio
async def test_pipelined_requests_are_answered_in_order(repo):
    """An express request holds the connection: what arrives behind it (more infers, a metadata request, a last
    one asking to close) is answered after it, in order, and the connection then closes."""
    rng = np.random.default_rng(5)
    async with serving(repo) as app:
        conn = await Connection.open(app)
        data = [simple_pair(rng) for _ in range(7)]

        def req(i: int, **headers) -> bytes:
            a, b = data[i]
            return infer_bytes("/v2/models/simple/infer", {"INPUT0": ("INT32", a), "INPUT1": ("INT32", b)},
                               outputs=BOTH, headers=headers)

        for i in range(3):  # learn the plan
            assert (await conn.send(req(i)))[0][0] == 200
        before = served(app)
        answers = await conn.send(req(3), req(4), get_bytes("/v2/models/simple"), req(5), req(6, Connection="close"))
        assert served(app) > before
        assert [a[0] for a in answers] == [200] * 5
        assert orjson.loads(answers[2][2])["name"] == "simple"
        for i, answer in zip((3, 4, None, 5, 6), answers):
            if i is None:
                continue
            a, b = data[i]
            assert np.array_equal(outputs_of(answer[2], answer[1])["OUTPUT0"], a + b)
        assert answers[-1][1].get("connection") == "close"
        assert await asyncio.wait_for(conn.reader.read(), TIMEOUT_S) == b""  # closed after the last answer
        await conn.close()


@pytest.mark.asyncio
async def test_a_failed_run_gives_the_full_paths_error_and_count(repo):
    """A request of a planned form whose data makes onnxruntime's run fail (an index out of range): the same
    status and message as the full path, counted as a failure, and the model serves the next one."""
    async with serving(repo) as fast, serving(repo, express=False) as full:
        conns = [await Connection.open(fast), await Connection.open(full)]

        def req(index: int) -> bytes:
            return infer_bytes("/v2/models/gather/infer", {"INDICES": ("INT64", np.array([[index]], np.int64))},
                               outputs=["OUTPUT"])

        for index in (1, 2, 3, 4):
            (got,), (want,) = [await c.send(req(index)) for c in conns]
            assert got[0] == 200 and got[3] == want[3]
        before = served(fast)
        (got,), (want,) = [await c.send(req(100)) for c in conns]
        assert served(fast) == before + 1
        assert got[0] == want[0] and got[0] >= 400
        assert got[3] == want[3]
        assert orjson.loads(got[2])["error"].startswith("model 'gather': inference failed on lane cpu.")
        (got,), (want,) = [await c.send(req(9)) for c in conns]
        assert got[0] == 200 and got[3] == want[3]
        for c in conns:
            await c.close()
        got, want = await stats(fast, "gather"), await stats(full, "gather")
        assert got["inference_stats"]["fail"]["count"] == want["inference_stats"]["fail"]["count"] == 1
        assert got["inference_stats"]["success"]["count"] == want["inference_stats"]["success"]["count"] == 5


@pytest.mark.asyncio
async def test_requests_that_come_one_at_a_time_run_at_once_as_the_queue_would_run_them(repo):
    """One client, one request at a time: once a row's shape has been timed, each request runs at once on the loop
    (ModelExecutor.run_now) with no queue entry or future of its own. Answers, errors and statistics are those of a
    server that queues every request (lanes.inline_max_us 0), byte for byte and count for count."""
    # any run of this model is short enough to run on the loop: that rule is not what is tested here
    async with serving(repo, environ={"GT_LANES__INLINE_MAX_US": "1000000"}) as fast, \
            serving(repo, express=False, environ={"GT_LANES__INLINE_MAX_US": "0"}) as full:
        conns = [await Connection.open(fast), await Connection.open(full)]

        def req(index: int) -> bytes:
            return infer_bytes("/v2/models/gather/infer", {"INDICES": ("INT64", np.array([[index]], np.int64))},
                               outputs=["OUTPUT"])

        async def both(index: int) -> None:
            (got,), (want,) = [await c.send(req(index)) for c in conns]
            assert got[3] == want[3]
            if index < len(TABLE):
                assert np.array_equal(outputs_of(got[2], got[1])["OUTPUT"].ravel(), TABLE[index])

        executor = fast.registry.get("gather", "").executor
        for index in (1, 2, 3):  # the form learnt, its row's run time measured
            await both(index)
        # how far apart requests come is timing, covered by the unit tests: here they count as a millisecond apart
        executor._gap_ns = 10**12
        before = executor.ran["at_once"]
        for index in (4, 5, 100, 6, 7, 8):  # 100: out of range, the run fails
            await both(index)
        assert executor.ran["at_once"] == before + 6
        # the sixth request on bound (test_http_bound.py), run at once and answered in its turn; not the failed one
        assert fast.http._express.bound_served == 4 and fast.http._express.joined == 3
        assert full.registry.get("gather", "").executor.ran["at_once"] == 0
        for c in conns:
            await c.close()
        got, want = await stats(fast, "gather"), await stats(full, "gather")
        assert_same_counts(got, want)
        assert got["inference_stats"]["fail"]["count"] == 1 and got["inference_stats"]["success"]["count"] == 8


@pytest.mark.asyncio
@pytest.mark.parametrize("taught", [2, 4], ids=["express", "bound"])
async def test_a_client_that_goes_away_while_its_request_waits_costs_nobody_else(repo, taught):
    """`gather_pair` runs two requests together and keeps a lone one waiting: a client drops its connection while
    its express request waits; the next pair is answered, each with its own rows, and the server goes on. After two
    pairs the lone request is served from the plan; after four, from its head's binding (test_http_bound.py)."""
    def req(index: int) -> bytes:
        return infer_bytes("/v2/models/gather_pair/infer", {"INDICES": ("INT64", np.array([[index]], np.int64))},
                               outputs=["OUTPUT"])

    async def pair(app: App, i: int, j: int) -> list:
        conns = [await Connection.open(app), await Connection.open(app)]
        answers = await asyncio.gather(conns[0].send(req(i)), conns[1].send(req(j)))
        for c in conns:
            await c.close()
        return [a for (a,) in answers]

    async with serving(repo) as app:
        for i in range(taught):  # learn the plan (and the head, and bind it)
            assert [a[0] for a in await pair(app, 2 * i, 2 * i + 1)] == [200, 200]
        before, connections = served(app), app.http._server.connection_count
        bound = app.http._express.bound_served
        lone = socket.create_connection(("127.0.0.1", app.http.port))
        lone.sendall(req(7))
        await until(lambda: served(app) > before, "the lone request was never served from its plan")
        assert app.http._express.bound_served - bound == (taught == 4)  # from the head's binding, or not
        lone.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        lone.close()  # a reset: gone while its request waits for a partner
        await until(lambda: app.http._server.connection_count == connections, "the reset was never seen")
        answers = await pair(app, 5, 6)
        assert [a[0] for a in answers] == [200, 200]
        for index, answer in zip((5, 6), answers):
            assert np.array_equal(outputs_of(answer[2], answer[1])["OUTPUT"].reshape(4), TABLE[index])
        assert served(app) >= before + 3
        assert (await stats(app, "gather_pair"))["inference_stats"]["success"]["count"] == 2 * taught + 2


@pytest.mark.asyncio
async def test_tokens_and_lengths_the_full_path_refuses_take_it(repo, caplog):
    """A wrong token and a length the full path refuses are never served from a plan: both get the full path's
    answer (a 401, a 400); the right token is served from the plan."""
    rng = np.random.default_rng(9)
    token = {"Authorization": "Bearer s3cret"}
    async with serving(repo, auth_token="s3cret") as fast, serving(repo, auth_token="s3cret",
                                                                    express=False) as full:
        conns = [await Connection.open(fast), await Connection.open(full)]
        a, b = rng.integers(0, 9, (1, 16), dtype=np.int32), rng.integers(0, 9, (1, 16), dtype=np.int32)
        inputs = {"INPUT0": ("INT32", a), "INPUT1": ("INT32", b)}
        async def both(headers: dict) -> tuple:
            (got,), (want,) = [await c.send(infer_bytes("/v2/models/simple/infer", inputs, outputs=BOTH,
                                                         headers=headers)) for c in conns]
            assert got[3] == want[3]  # status line, headers and body
            return got

        for _ in range(3):
            assert (await both(token))[0] == 200
        before = served(fast)
        assert (await both({"Authorization": "Bearer nope"}))[0] == 401
        # a length in digits that are not ASCII ('²' is a digit to str.isdigit, not to int): the full path's 400
        assert (await both({**token, "Inference-Header-Content-Length": "\u00b2"}))[0] == 400
        assert not [r for r in caplog.records if "express lane failed" in r.getMessage()]  # refused, not crashed
        assert served(fast) == before
        assert (await both(token))[0] == 200
        assert served(fast) == before + 1
        for c in conns:
            await c.close()


@pytest.mark.asyncio
async def test_a_reloaded_or_unloaded_model_is_not_served_from_an_old_plan(repo):
    rng = np.random.default_rng(11)
    async with serving(repo, model_control_mode="explicit", load_models=("simple",)) as app:
        conn = await Connection.open(app)

        async def infer() -> tuple:
            a, b = simple_pair(rng)
            (answer,) = await conn.send(infer_bytes("/v2/models/simple/infer",
                                                    {"INPUT0": ("INT32", a), "INPUT1": ("INT32", b)}, outputs=BOTH))
            if answer[0] == 200:
                assert np.array_equal(outputs_of(answer[2], answer[1])["OUTPUT0"], a + b)
            return answer

        for _ in range(4):
            assert (await infer())[0] == 200
        assert served(app) == 1
        (status, _, body, _), = await conn.send(
            b"POST /v2/repository/models/simple/load HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        assert status == 200, body
        assert (await infer())[0] == 200
        assert served(app) == 1  # a new model: the full path, which plans it again
        assert (await infer())[0] == 200
        assert served(app) == 2
        assert unparsed(app) == 0  # the head known from the old plan was offered, declined, and parsed
        (status, _, body, _), = await conn.send(
            b"POST /v2/repository/models/simple/unload HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        assert status == 200, body
        status, _, body, _ = await infer()
        assert status >= 400 and "simple" in orjson.loads(body)["error"]
        assert served(app) == 2 and unparsed(app) == 0
        await conn.close()


@pytest.mark.asyncio
async def test_a_head_seen_before_is_not_parsed_again_and_answers_the_same(repo):
    """A request whose line and headers repeat byte for byte one the express lane took is offered to it unparsed,
    when it arrives whole, or its head alone and then its body: the same answers as the full path. A body that comes
    in pieces behind a known head, or with the next request behind it, is parsed; a head with `Connection: close` or
    `Expect: 100-continue` is never remembered (the same bytes would not be answered the same way: a close, a 100
    Continue first)."""
    rng = np.random.default_rng(13)

    def req(**headers) -> tuple[bytes, np.ndarray]:
        a, b = simple_pair(rng)
        return infer_bytes("/v2/models/simple/infer", {"INPUT0": ("INT32", a), "INPUT1": ("INT32", b)},
                           outputs=BOTH, headers=headers), a + b

    async with serving(repo) as fast, serving(repo, express=False) as full:
        conns = [await Connection.open(fast), await Connection.open(full)]
        for _ in range(8):
            request, total = req()
            (got,), (want,) = [await c.send(request) for c in conns]
            assert got[0] == 200 and got[3] == want[3]
            assert np.array_equal(outputs_of(got[2], got[1])["OUTPUT0"], total)
        assert served(fast) == 5 and unparsed(fast) == 4
        server = fast.http._server
        # the head first, the body once the server has read the head: kept, and served with its body unparsed
        request, total = req()
        split = request.index(b"\r\n\r\n") + 4
        conns[0].writer.write(request[:split])
        await until(lambda: any(c._split_head for c in server._connections), "the head was never read")
        (got,) = await conns[0].send(request[split:])
        assert got[0] == 200 and np.array_equal(outputs_of(got[2], got[1])["OUTPUT0"], total)
        assert served(fast) == 6 and unparsed(fast) == 5
        # the head, then its body in two pieces: the parser reads the head it kept and what follows
        request, total = req()
        conns[0].writer.write(request[:split])
        await until(lambda: any(c._split_head for c in server._connections), "the head was never read")
        conns[0].writer.write(request[split:split + 8])
        await until(lambda: any(c._in_message for c in server._connections), "the body's start was never read")
        (got,) = await conns[0].send(request[split + 8:])
        assert got[0] == 200 and got[3].startswith(b"HTTP/1.1 200 OK")
        assert np.array_equal(outputs_of(got[2], got[1])["OUTPUT0"], total)
        assert served(fast) == 7 and unparsed(fast) == 5
        # the head, then its body with the next request behind it in one read: both parsed, answered in order
        (first, total1), (second, total2) = req(), req()
        conns[0].writer.write(first[:split])
        await until(lambda: any(c._split_head for c in server._connections), "the head was never read")
        answers = await conns[0].send(first[split:], second)  # written in one piece
        assert [a[0] for a in answers] == [200, 200]
        for (_, headers, body, _), total in zip(answers, (total1, total2)):
            assert np.array_equal(outputs_of(body, headers)["OUTPUT0"], total)
        assert unparsed(fast) == 5
        for c in conns:
            await c.close()
        known = len(server._known_heads)
        for headers in ({"Connection": "close"}, {"Expect": "100-continue"}):
            for _ in range(5):
                conn = await Connection.open(fast)
                request, total = req(**headers)
                answers = await conn.send(request)
                if "Expect" in headers:
                    assert answers[0][0] == 100  # every time: the head is parsed
                    answers = [await read_response(conn.reader)]
                assert answers[0][0] == 200 and np.array_equal(outputs_of(answers[0][2], answers[0][1])["OUTPUT0"],
                                                               total)
                await conn.close()
        assert len(server._known_heads) == known and unparsed(fast) == 5
        assert served(fast) > 8  # served from their plans, parsed


@pytest.mark.asyncio
async def test_a_connection_whose_first_request_came_from_a_known_head_is_idle_not_mid_head(repo):
    """A new connection's first request served from a known head (another connection taught it) leaves the connection
    idle, as a parsed request does: its head timeout, counted from the accept, does not end it later (it did: 408
    once header_timeout_s had passed, at a moment between two requests). A known head kept for its body has the
    parser's body timeout."""
    rng = np.random.default_rng(17)
    header_timeout_s = 0.5

    def req() -> bytes:
        a, b = simple_pair(rng)
        return infer_bytes("/v2/models/simple/infer", {"INPUT0": ("INT32", a), "INPUT1": ("INT32", b)},
                           outputs=BOTH)

    async with serving(repo, header_timeout_s=header_timeout_s, body_timeout_s=header_timeout_s) as fast:
        teacher = await Connection.open(fast)
        for _ in range(5):  # the full path's requests teach the plan, one served from it the head
            assert [a[0] for a in await teacher.send(req())] == [200]
        taught = unparsed(fast)
        assert taught
        conn = await Connection.open(fast)
        assert [a[0] for a in await conn.send(req())] == [200]
        assert unparsed(fast) == taught + 1  # its first request came from the known head
        with pytest.raises(asyncio.TimeoutError):  # three head timeouts pass: nothing is sent, nothing closes
            await asyncio.wait_for(conn.reader.read(1), 3 * header_timeout_s)
        assert [a[0] for a in await conn.send(req())] == [200]
        request = req()
        conn.writer.write(request[:request.index(b"\r\n\r\n") + 4])  # a known head, and no body
        status, _, body, _ = await read_response(conn.reader)
        assert status == 408 and b"request body not received within 0.5 s" in body
        assert await asyncio.wait_for(conn.reader.read(), TIMEOUT_S) == b""  # and the connection closed
        assert unparsed(fast) == taught + 2
        for c in (teacher, conn):
            await c.close()


# perf_analyzer --async numbers its requests; a tritonclient user may give each a UUID; any other id is keyed as is
NUMBERED = ["8", "9", "10", "11", "12", "13"]
UUIDS = [f"3f2b8a1e-7c4d-4e0f-9a6b-2d1c5e8f7a{i:02d}" for i in range(6)]
NOT_PLAIN = ["caf\u00e9", "caf\u00e9", 'q"1', 'q"1', "q\\2", "x" * 128]


@pytest.mark.asyncio
async def test_each_request_gets_its_own_id_from_one_plan(repo):
    """Requests that differ in their ids alone are served from one plan (one per id length: the JSON part's length
    is in the headers), each answered with its own id, byte for byte as the full path answers it."""
    rng = np.random.default_rng(17)
    async with serving(repo) as fast, serving(repo, express=False) as full:
        conns = [await Connection.open(fast), await Connection.open(full)]
        for request_id in NUMBERED + UUIDS + ["", "", "", ""] + NOT_PLAIN:
            a, b = simple_pair(rng)
            request = infer_bytes("/v2/models/simple/infer", {"INPUT0": ("INT32", a), "INPUT1": ("INT32", b)},
                                  outputs=BOTH, request_id=request_id)
            (got,), (want,) = [await c.send(request) for c in conns]
            assert got[0] == 200 and got[3] == want[3]
            n = int(got[1]["inference-header-content-length"])
            assert orjson.loads(got[2][:n]).get("id", "") == request_id
            assert np.array_equal(outputs_of(got[2], got[1])["OUTPUT1"], a - b)
        for c in conns:
            await c.close()
        # "8" decoded in full, "9" teaches the skeleton (keyed without the id), "10" the plan of two-digit ids;
        # "11"-"13" express; the first UUID teaches the plan of its length, the other five express; so does the
        # first empty id (perf_analyzer's without --async: the JSON part is its own key), the other three express;
        # ids that are not plain are keys of their own, each seen at most twice: never planned
        assert served(fast) == 3 + 5 + 3


# ---- inputs and outputs in system shared memory (perf_analyzer --shared-memory system) ----

def shm_request(inputs: dict, outputs: dict) -> bytes:
    """An infer request for `simple` whose inputs are (region, offset) or an array (binary), and whose outputs are
    (region, offset) or None (binary)."""
    doc_inputs, blobs = [], []
    for name, where in inputs.items():
        if isinstance(where, np.ndarray):
            doc_inputs.append({"name": name, "datatype": "INT32", "shape": [1, 16],
                               "parameters": {"binary_data_size": where.nbytes}})
            blobs.append(where.tobytes())
        else:
            doc_inputs.append({"name": name, "datatype": "INT32", "shape": [1, 16], "parameters": {
                "shared_memory_region": where[0], "shared_memory_offset": where[1], "shared_memory_byte_size": 64}})
    doc_outputs = [{"name": name, "parameters": {"binary_data": True} if where is None else {
        "shared_memory_region": where[0], "shared_memory_offset": where[1], "shared_memory_byte_size": 64}}
        for name, where in outputs.items()]
    head = orjson.dumps({"inputs": doc_inputs, "outputs": doc_outputs})
    body = head + b"".join(blobs)
    return (f"POST /v2/models/simple/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {len(head)}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


def region_request(name: str, action: str, key: str = "", byte_size: int = 0) -> bytes:
    body = orjson.dumps({"key": key, "offset": 0, "byte_size": byte_size}) if action == "register" else b""
    return (f"POST /v2/systemsharedmemory/region/{name}/{action} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


@pytest.mark.asyncio
async def test_inputs_and_outputs_in_shared_memory_are_served_from_plans(repo):
    """Forms with inputs read from regions and outputs written to regions (all, or mixed with binary ones), each
    sent six times with new data: the full path's answer bytes and statistics, the outputs in each server's own
    regions; a region unregistered or registered too small since is the full path's error."""
    import tritonclient.utils.shared_memory as shm

    tag = f"gt_express_{id(repo)}"
    handles = {}
    try:
        for server in ("fast", "full"):
            for side in ("in", "out"):
                handles[server, side] = shm.create_shared_memory_region(f"{tag}_{server}_{side}",
                                                                        f"/{tag}_{server}_{side}", 128)
        async with serving(repo) as fast, serving(repo, express=False) as full:
            conns = {"fast": await Connection.open(fast), "full": await Connection.open(full)}
            for server, conn in conns.items():
                for side in ("in", "out"):
                    (answer,) = await conn.send(region_request(side, "register", f"/{tag}_{server}_{side}", 128))
                    assert answer[0] == 200, answer[2]
            forms = [({"INPUT0": ("in", 0), "INPUT1": ("in", 64)}, {"OUTPUT0": ("out", 0), "OUTPUT1": ("out", 64)}),
                     ({"INPUT0": ("in", 0), "INPUT1": ("in", 64)}, {"OUTPUT0": None, "OUTPUT1": None}),
                     ({"INPUT0": None, "INPUT1": ("in", 64)}, {"OUTPUT1": ("out", 64), "OUTPUT0": None})]
            rng = np.random.default_rng(23)
            for inputs, outputs in forms:
                for _ in range(6):
                    a, b = simple_pair(rng)
                    for server in conns:
                        shm.set_shared_memory_region(handles[server, "in"], [a, b])
                    request = shm_request({n: a if w is None else w for n, w in inputs.items()}, outputs)
                    (got,), (want,) = [await c.send(request) for c in conns.values()]
                    assert got[0] == 200 and got[3] == want[3], got[2]
                    expect = {"OUTPUT0": a + b, "OUTPUT1": a - b}
                    for name, where in outputs.items():
                        if where is None:
                            assert np.array_equal(outputs_of(got[2], got[1])[name], expect[name])
                            continue
                        for server in conns:
                            written = shm.get_contents_as_numpy(handles[server, "out"], np.int32, [1, 16],
                                                                offset=where[1])
                            assert np.array_equal(written, expect[name]), (server, name)
            assert served(fast) == len(forms) * 3
            before = served(fast)
            request = shm_request(*forms[0])
            for region, key_size in (("out", 128), ("in", 128), ("out", 64)):  # gone; gone; too small
                for server, conn in conns.items():
                    await conn.send(region_request(region, "unregister"))
                    if region == "out" and key_size == 64:
                        await conn.send(region_request(region, "register", f"/{tag}_{server}_{region}", 64))
                (got,), (want,) = [await c.send(request) for c in conns.values()]
                assert got[0] == 400 and got[3] == want[3]
                assert "out" in orjson.loads(got[2])["error"] or "in" in orjson.loads(got[2])["error"]
                for server, conn in conns.items():
                    await conn.send(region_request(region, "unregister"))
                    await conn.send(region_request(region, "register", f"/{tag}_{server}_{region}", 128))
            assert served(fast) == before  # looked up before the model's queue: the full path answered them
            for c in conns.values():
                await c.close()
            got, want = await stats(fast, "simple"), await stats(full, "simple")
            assert_same_counts(got, want)
            assert got["inference_stats"]["fail"]["count"] == 3
    finally:
        for handle in handles.values():
            shm.destroy_shared_memory_region(handle)


@pytest.mark.asyncio
async def test_accept_encoding_is_served_from_the_plan_and_compressed_as_the_full_path_does(repo):
    """tritonclient.http.aio asks for gzip on every request: such requests are served from their plans (learned from
    compressed answers too), and an answer of 1 KiB or more is compressed as the full path compresses it (the
    same bytes: gzip's header carries no time), a smaller one sent as it is."""
    rng = np.random.default_rng(29)
    async with serving(repo) as fast, serving(repo, express=False) as full:
        conns = [await Connection.open(fast), await Connection.open(full)]
        for rows, accept in ((1, "gzip, deflate"), (8, "gzip, deflate"), (8, "deflate"), (8, "gzip;q=0, identity")):
            for _ in range(5):
                a, b = (rng.integers(-1000, 1000, (rows, 16), dtype=np.int32) for _ in range(2))
                request = infer_bytes("/v2/models/simple/infer", {"INPUT0": ("INT32", a), "INPUT1": ("INT32", b)},
                                      outputs=BOTH, headers={"Accept-Encoding": accept})
                (got,), (want,) = [await c.send(request) for c in conns]
                assert got[0] == 200 and got[3] == want[3]
                compressed = rows == 8 and "q=0" not in accept
                assert got[1].get("content-encoding") == (accept.split(",")[0] if compressed else None)
                body = got[2]
                if compressed:
                    body = zlib.decompress(body, 31 if accept.startswith("gzip") else 15)
                    got[1]["content-length"] = str(len(body))
                assert np.array_equal(outputs_of(body, got[1])["OUTPUT1"], a - b)
        for c in conns:
            await c.close()
        # each of the two forms (1 row, 8 rows): two requests decoded in full, the third teaches the plan, and the
        # rest of its 5, 10 or 15 requests (another Accept-Encoding is the same form) come from it
        assert served(fast) == (5 - 3) + (15 - 3)
