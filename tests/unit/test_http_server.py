"""gt_serve.protocol.http_server in-process, over raw sockets (asyncio streams), with a trivial handler."""
from __future__ import annotations

import asyncio
import json

import pytest
import pytest_asyncio

from gt_serve.protocol.http_messages import Response
from gt_serve.protocol.http_server import HttpServer

WAIT_S = 10.0  # upper bound on any single wait; tests synchronise on events, never on sleeps


class Echo:
    """Handler: echoes method, path, query, body length and a header. `/block` waits on an event."""

    def __init__(self) -> None:
        self.calls = 0
        self.heads: dict = {}
        self.release = asyncio.Event()
        self.entered = asyncio.Event()

    async def __call__(self, req):
        self.calls += 1
        if req.path == "/block":
            self.entered.set()
            await self.release.wait()
        if req.path == "/boom":
            raise RuntimeError("boom")
        if req.path == "/shared":  # answers alike: their heads kept in one dict
            return Response(200, req.body or b"same", {"X-Kind": "shared"}, self.heads)
        if req.path == "/big":
            return Response(200, [b"x" * 100_000, memoryview(b"y" * 100_000)], {"Content-Type": "text/plain"})
        doc = {"method": req.method, "path": req.path, "query": req.query_string, "body_len": len(req.body),
               "body": req.body[:64].decode("latin-1"), "x": req.headers.get("x-test")}
        return Response(200, json.dumps(doc).encode(), {"Content-Type": "application/json"})


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if line:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
    body = await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", 0))), WAIT_S)
    return status, headers, body


async def assert_closed(reader: asyncio.StreamReader) -> None:
    assert await asyncio.wait_for(reader.read(), WAIT_S) == b""


@pytest_asyncio.fixture
async def served():
    handler = Echo()
    server = HttpServer(handler, max_body_bytes=1000, max_connections=150, idle_timeout_s=30.0, body_timeout_s=0.3)
    await server.start("127.0.0.1", 0)
    yield server, handler
    handler.release.set()
    await server.close(2.0)


async def connect(server):
    return await asyncio.open_connection("127.0.0.1", server.port)


@pytest.mark.asyncio
async def test_keep_alive_many_requests_one_connection(served):
    server, handler = served
    r, w = await connect(server)
    for i in range(20):
        w.write(f"GET /a/{i}?q=1 HTTP/1.1\r\nHost: x\r\nX-Test: v{i}\r\n\r\n".encode())
        status, headers, body = await read_response(r)
        doc = json.loads(body)
        assert status == 200 and doc["path"] == f"/a/{i}" and doc["query"] == "q=1" and doc["x"] == f"v{i}"
        assert "connection" not in headers
    assert server.connection_count == 1
    w.close()


@pytest.mark.asyncio
async def test_header_names_case_insensitive_and_repeats_joined_in_order(served):
    """Headers are decoded together once the head is complete: names lower-cased, a repeated header's values
    joined with ", " in the order they came, on every request of a keep-alive connection."""
    server, _ = served
    r, w = await connect(server)
    for head in ("X-Test: a\r\nx-test: b\r\nX-TEST: c\r\n", "X-tEsT: only\r\n", ""):
        w.write(f"GET /h HTTP/1.1\r\nHost: x\r\n{head}\r\n".encode())
        status, _, body = await read_response(r)
        expected = {"X-Test: a\r\nx-test: b\r\nX-TEST: c\r\n": "a, b, c", "X-tEsT: only\r\n": "only", "": None}[head]
        assert status == 200 and json.loads(body)["x"] == expected
    w.close()


@pytest.mark.asyncio
async def test_responses_sharing_a_heads_dict_get_the_head_of_each_connection_and_length(served):
    server, handler = served
    r, w = await connect(server)
    for body in (b"", b"", b"four"):
        w.write(f"POST /shared HTTP/1.1\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        status, headers, got = await read_response(r)
        assert (status, headers.get("x-kind"), "connection" in headers, got) == (200, "shared", False, body or b"same")
    w.write(b"GET /shared HTTP/1.0\r\n\r\n")
    status, headers, got = await read_response(r)
    assert (status, headers["connection"], got) == (200, "close", b"same")
    await assert_closed(r)
    assert sorted(handler.heads) == [(False, "1.0", 4), (True, "1.1", 4)]  # one head per kind, reused


@pytest.mark.asyncio
async def test_pipelined_requests_answered_in_order(served):
    server, _ = served
    r, w = await connect(server)
    reqs = b"".join(
        f"POST /p/{i} HTTP/1.1\r\nContent-Length: {len(str(i))}\r\n\r\n{i}".encode() for i in range(50)
    )
    w.write(reqs + b"GET /last HTTP/1.1\r\nConnection: close\r\n\r\n")
    for i in range(50):
        status, _, body = await read_response(r)
        doc = json.loads(body)
        assert (status, doc["path"], doc["body"]) == (200, f"/p/{i}", str(i))
    status, headers, body = await read_response(r)
    assert json.loads(body)["path"] == "/last" and headers["connection"] == "close"
    await assert_closed(r)


@pytest.mark.asyncio
async def test_connection_close_and_http10(served):
    server, _ = served
    r, w = await connect(server)
    w.write(b"GET /x HTTP/1.1\r\nConnection: close\r\n\r\n")
    status, headers, _ = await read_response(r)
    assert status == 200 and headers["connection"] == "close"
    await assert_closed(r)
    # HTTP/1.0 without keep-alive: closed after the response
    r, w = await connect(server)
    w.write(b"GET /x HTTP/1.0\r\n\r\n")
    status, headers, _ = await read_response(r)
    assert status == 200
    await assert_closed(r)
    # HTTP/1.0 with keep-alive: stays open
    r, w = await connect(server)
    for _ in range(2):
        w.write(b"GET /x HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        status, headers, _ = await read_response(r)
        assert status == 200 and headers["connection"] == "keep-alive"
    w.close()


@pytest.mark.asyncio
async def test_chunked_body(served):
    server, _ = served
    r, w = await connect(server)
    w.write(b"POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
    w.write(b"6\r\n world\r\n0\r\n\r\n")
    status, _, body = await read_response(r)
    doc = json.loads(body)
    assert status == 200 and doc["body"] == "hello world" and doc["body_len"] == 11
    w.write(b"GET /after HTTP/1.1\r\n\r\n")
    assert json.loads((await read_response(r))[2])["path"] == "/after"
    w.close()


@pytest.mark.asyncio
async def test_expect_100_continue(served):
    server, _ = served
    r, w = await connect(server)
    w.write(b"POST /e HTTP/1.1\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
    interim = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), WAIT_S)
    assert interim.startswith(b"HTTP/1.1 100 Continue")
    w.write(b"data")
    status, _, body = await read_response(r)
    assert status == 200 and json.loads(body)["body"] == "data"
    # over the limit: 413 straight away, no 100
    w.write(b"POST /e HTTP/1.1\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n")
    status, headers, body = await read_response(r)
    assert status == 413 and "limit" in json.loads(body)["error"]
    await assert_closed(r)


@pytest.mark.asyncio
async def test_body_limit_content_length_and_chunked(served):
    server, _ = served
    r, w = await connect(server)
    w.write(b"POST /big HTTP/1.1\r\nContent-Length: 1001\r\n\r\n")
    status, headers, body = await read_response(r)
    assert status == 413 and headers["content-type"] == "application/json"
    assert "1001" in json.loads(body)["error"]
    await assert_closed(r)
    r, w = await connect(server)
    w.write(b"POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
    for _ in range(3):
        w.write(b"190\r\n" + b"z" * 400 + b"\r\n")
    status, _, body = await read_response(r)
    assert status == 413 and "error" in json.loads(body)
    await assert_closed(r)
    # exactly at the limit is fine
    r, w = await connect(server)
    w.write(b"POST /ok HTTP/1.1\r\nContent-Length: 1000\r\n\r\n" + b"a" * 1000)
    status, _, body = await read_response(r)
    assert status == 200 and json.loads(body)["body_len"] == 1000
    w.close()


@pytest.mark.asyncio
async def test_malformed_request_400_and_close(served):
    server, _ = served
    r, w = await connect(server)
    w.write(b"GET /ok HTTP/1.1\r\n\r\nTHIS IS NOT HTTP\r\n\r\n")
    status, _, body = await read_response(r)
    assert status == 200
    status, headers, body = await read_response(r)
    assert status == 400 and "malformed" in json.loads(body)["error"]
    assert headers["connection"] == "close"
    await assert_closed(r)
    # bad Content-Length
    r, w = await connect(server)
    w.write(b"POST /x HTTP/1.1\r\nContent-Length: abc\r\n\r\n")
    status, _, body = await read_response(r)
    assert status == 400
    await assert_closed(r)


@pytest.mark.asyncio
async def test_half_sent_body_times_out_without_affecting_others(served):
    server, handler = served
    r1, w1 = await connect(server)
    w1.write(b"POST /slow HTTP/1.1\r\nContent-Length: 100\r\n\r\nonly-part")
    r2, w2 = await connect(server)
    w2.write(b"GET /fine HTTP/1.1\r\n\r\n")
    status, _, body = await read_response(r2)
    assert status == 200 and json.loads(body)["path"] == "/fine"
    status, _, body = await read_response(r1)  # body_timeout_s=0.3: 408, then the connection closes
    assert status == 408 and b"body not received within 0.3 s" in body
    await assert_closed(r1)
    w2.write(b"GET /still HTTP/1.1\r\n\r\n")
    assert (await read_response(r2))[0] == 200
    w2.close()


@pytest.mark.asyncio
async def test_client_disconnect_mid_body_does_not_break_server(served):
    server, _ = served
    r, w = await connect(server)
    w.write(b"POST /x HTTP/1.1\r\nContent-Length: 100\r\n\r\nabc")
    await w.drain()
    w.close()
    await w.wait_closed()
    r, w = await connect(server)
    w.write(b"GET /y HTTP/1.1\r\n\r\n")
    assert (await read_response(r))[0] == 200
    w.close()


@pytest.mark.asyncio
async def test_handler_exception_gives_500_and_connection_survives(served):
    server, _ = served
    r, w = await connect(server)
    w.write(b"GET /boom HTTP/1.1\r\n\r\nGET /y HTTP/1.1\r\n\r\n")
    status, _, body = await read_response(r)
    assert status == 500 and "error" in json.loads(body)
    assert (await read_response(r))[0] == 200
    w.close()


@pytest.mark.asyncio
async def test_large_multipart_response_and_head(served):
    server, _ = served
    r, w = await connect(server)
    w.write(b"GET /big HTTP/1.1\r\n\r\n")
    status, headers, body = await read_response(r)
    assert status == 200 and body == b"x" * 100_000 + b"y" * 100_000
    w.write(b"HEAD /x HTTP/1.1\r\n\r\nGET /z HTTP/1.1\r\n\r\n")
    head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), WAIT_S)
    assert b"200 OK" in head and b"Content-Length: " in head
    status, _, body = await read_response(r)  # the HEAD had no body, so this parses the next response
    assert json.loads(body)["path"] == "/z"
    w.close()


@pytest.mark.asyncio
async def test_many_concurrent_keep_alive_connections(served):
    server, _ = served
    conns = [await connect(server) for _ in range(120)]

    async def use(i, r, w):
        for j in range(3):
            w.write(f"GET /c/{i}/{j} HTTP/1.1\r\n\r\n".encode())
            status, _, body = await read_response(r)
            assert status == 200 and json.loads(body)["path"] == f"/c/{i}/{j}"

    await asyncio.gather(*(use(i, r, w) for i, (r, w) in enumerate(conns)))
    assert server.connection_count == 120
    for _, w in conns:
        w.close()


@pytest.mark.asyncio
async def test_max_connections_rejects_with_503():
    server = HttpServer(Echo(), max_connections=2)
    await server.start("127.0.0.1", 0)
    try:
        kept = [await connect(server) for _ in range(2)]
        for r, w in kept:  # make sure both are accepted before the third
            w.write(b"GET / HTTP/1.1\r\n\r\n")
            assert (await read_response(r))[0] == 200
        r, w = await connect(server)
        status, _, body = await read_response(r)
        assert status == 503 and "too many connections" in json.loads(body)["error"]
        await assert_closed(r)
    finally:
        await server.close(1.0)


@pytest.mark.asyncio
async def test_close_drains_in_flight_requests():
    handler = Echo()
    server = HttpServer(handler)
    await server.start("127.0.0.1", 0)
    r, w = await connect(server)
    w.write(b"GET /block HTTP/1.1\r\n\r\n")
    idle_r, _ = await connect(server)
    await asyncio.wait_for(handler.entered.wait(), WAIT_S)
    closing = asyncio.create_task(server.close(WAIT_S))
    await assert_closed(idle_r)  # idle connections close at once
    handler.release.set()
    status, headers, _ = await read_response(r)  # the in-flight one still gets its answer
    assert status == 200 and headers["connection"] == "close"
    await assert_closed(r)
    await asyncio.wait_for(closing, WAIT_S)
    with pytest.raises(OSError):
        await connect(server)


@pytest.mark.asyncio
async def test_close_deadline_aborts_stuck_requests():
    handler = Echo()
    server = HttpServer(handler)
    await server.start("127.0.0.1", 0)
    r, w = await connect(server)
    w.write(b"GET /block HTTP/1.1\r\n\r\n")
    await asyncio.wait_for(handler.entered.wait(), WAIT_S)
    await asyncio.wait_for(server.close(0.1), WAIT_S)
    assert await asyncio.wait_for(r.read(), WAIT_S) == b""
    assert server.connection_count == 0


@pytest.mark.asyncio
async def test_write_backpressure_slow_reader(served):
    """A client that pipelines many big responses without reading: the server pauses, nothing is lost."""
    server, _ = served
    r, w = await connect(server)
    n = 40
    w.write(b"GET /big HTTP/1.1\r\n\r\n" * n)
    await w.drain()
    for _ in range(n):
        status, _, body = await read_response(r)
        assert status == 200 and len(body) == 200_000
    w.close()


@pytest.mark.asyncio
async def test_half_close_after_request_still_answered(served):
    server, handler = served
    r, w = await connect(server)
    w.write(b"GET /block HTTP/1.1\r\n\r\nGET /after HTTP/1.1\r\n\r\n")
    w.write_eof()
    await asyncio.wait_for(handler.entered.wait(), WAIT_S)
    handler.release.set()
    assert (await read_response(r))[0] == 200
    status, _, body = await read_response(r)
    assert status == 200 and json.loads(body)["path"] == "/after"
    await assert_closed(r)
