"""http_parsing's large bodies: a Content-Length body of 64 KiB or more, once a quarter of it has come, is read
straight into its own buffer (the connection hands the transport a `BodyFiller`), and the parser, left inside the
body, is replaced when it is whole. Whatever the cuts: each request gets its body byte for byte, the requests
pipelined behind it are parsed, and the connection's limits and timeouts hold. Over real sockets on asyncio's and
uvloop's loops, and with a transport of the test's own that counts the reads that went into a buffer."""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random

import pytest
import uvloop

from gt_serve.protocol.http_messages import Response
from gt_serve.protocol.http_parsing import BodyFiller
from gt_serve.protocol.http_server import HttpServer, _Connection

WAIT_S = 20.0
LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


class Digest:
    """Handler: the path, the body's length and SHA-256; `kinds`: the body's type per path."""

    def __init__(self) -> None:
        self.kinds: dict[str, str] = {}

    async def __call__(self, req) -> Response:
        self.kinds[req.path] = type(req.body).__name__
        doc = {"path": req.path, "len": len(req.body), "sha": hashlib.sha256(req.body).hexdigest()}
        return Response(200, json.dumps(doc).encode(), {"Content-Type": "application/json"})


def _expected(path: str, body: bytes) -> dict:
    return {"path": path, "len": len(body), "sha": hashlib.sha256(body).hexdigest()}


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    body = await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", 0))), WAIT_S)
    return int(lines[0].split()[1]), headers, body


def _requests(payloads: list[bytes]) -> bytes:
    return b"".join(f"POST /d/{i} HTTP/1.1\r\nContent-Length: {len(p)}\r\n\r\n".encode() + p
                    for i, p in enumerate(payloads))


@pytest.mark.parametrize("flavor", sorted(LOOPS))
@pytest.mark.parametrize("seed", range(5))
def test_large_bodies_cut_anywhere_arrive_whole_and_what_follows_is_parsed(flavor, seed):
    rng = random.Random(seed)
    payloads = [os.urandom(rng.choice([10, 70_000, 300_000, 1_500_000])) for _ in range(4)]
    wire = _requests(payloads) + b"GET /last HTTP/1.1\r\nConnection: close\r\n\r\n"

    async def main():
        server = HttpServer(Digest(), max_body_bytes=8 << 20, body_timeout_s=WAIT_S)
        await server.start("127.0.0.1", 0)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            pos = 0
            while pos < len(wire):
                step = rng.choice([1, 100, 5000, 65536, 200_000, 1 << 20])
                writer.write(wire[pos:pos + step])
                await writer.drain()
                pos += step
            for i, payload in enumerate(payloads):
                status, _, body = await _read_response(reader)
                assert status == 200 and json.loads(body) == _expected(f"/d/{i}", payload)
            status, headers, body = await _read_response(reader)
            assert json.loads(body)["path"] == "/last" and headers["connection"] == "close"
            assert await asyncio.wait_for(reader.read(), WAIT_S) == b""
        finally:
            await server.close(2.0)

    with asyncio.Runner(loop_factory=LOOPS[flavor]) as runner:
        runner.run(main())


class ReadingTransport(asyncio.Transport):
    """What an asyncio transport does with what it reads: a buffered protocol's `get_buffer` / `buffer_updated`,
    else `data_received`; it follows `set_protocol`. Records what is written."""

    def __init__(self) -> None:
        super().__init__()
        self.protocol = None
        self.out = bytearray()
        self.wrote = asyncio.Event()
        self.closed = False
        self.buffered_reads = 0

    def read(self, data: bytes, step: int) -> None:
        pos = 0
        while pos < len(data):
            n = min(step, len(data) - pos)
            if isinstance(self.protocol, asyncio.BufferedProtocol):
                into = self.protocol.get_buffer(-1)
                n = min(n, len(into))
                into[:n] = data[pos:pos + n]
                self.protocol.buffer_updated(n)
                self.buffered_reads += 1
            else:
                self.protocol.data_received(data[pos:pos + n])
            pos += n

    def set_protocol(self, protocol) -> None:
        self.protocol = protocol

    def get_protocol(self):
        return self.protocol

    def write(self, data) -> None:
        self.out += data
        self.wrote.set()

    def writelines(self, parts) -> None:
        self.write(b"".join(parts))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name, default=None):
        return default


async def _connected(handler, **limits):
    """A connection of a server (not listening) on this loop, over a ReadingTransport."""
    server = HttpServer(handler, **limits)
    server._loop = asyncio.get_running_loop()
    transport = ReadingTransport()
    protocol = _Connection(server)
    transport.protocol = protocol
    protocol.connection_made(transport)
    return server, protocol, transport


async def _responses(transport: ReadingTransport, count: int) -> list[dict]:
    while transport.out.count(b"HTTP/1.1 ") < count:
        transport.wrote.clear()
        await asyncio.wait_for(transport.wrote.wait(), WAIT_S)
    return [json.loads(part.split(b"\r\n\r\n", 1)[1]) for part in bytes(transport.out).split(b"HTTP/1.1 ")[1:]]


def test_the_rest_of_a_large_body_is_read_into_its_buffer_and_the_connection_takes_the_transport_back():
    payload = os.urandom(300_000)
    wire = _requests([payload, b"abc"])
    head = wire.index(b"\r\n\r\n") + 4

    async def main():
        handler = Digest()
        _, conn, transport = await _connected(handler, max_body_bytes=1 << 20)
        transport.read(wire[:head + 1000], 65536)  # less than a quarter: parsed as it comes
        assert transport.protocol is conn
        transport.read(wire[head + 1000:head + 80_000], 65536)  # a quarter: the rest goes into the body's buffer
        assert isinstance(transport.protocol, BodyFiller)
        transport.read(wire[head + 80_000:], 65536)  # the rest, and the small request behind it
        assert transport.protocol is conn and transport.buffered_reads == 4  # 220 kB in reads of 64 KiB
        assert await _responses(transport, 2) == [_expected("/d/0", payload), _expected("/d/1", b"abc")]
        assert handler.kinds == {"/d/0": "bytearray", "/d/1": "bytes"}
        conn.connection_lost(None)

    asyncio.run(main())


def test_a_large_body_not_finished_in_time_is_408_and_one_over_the_limit_413():
    async def main():
        _, conn, transport = await _connected(Digest(), max_body_bytes=1 << 20, body_timeout_s=0.2)
        transport.read(b"POST /slow HTTP/1.1\r\nContent-Length: 200000\r\n\r\n" + b"x" * 60_000, 65536)
        assert isinstance(transport.protocol, BodyFiller)
        transport.wrote.clear()
        await asyncio.wait_for(transport.wrote.wait(), WAIT_S)  # the body timeout's answer
        assert bytes(transport.out).startswith(b"HTTP/1.1 408") and b"body not received within 0.2 s" in transport.out
        transport.read(b"y" * 10_000, 65536)  # what still comes is not read as a request
        conn.connection_lost(None)
        _, conn, transport = await _connected(Digest(), max_body_bytes=100_000)
        transport.read(b"POST /big HTTP/1.1\r\nContent-Length: 200000\r\n\r\n" + b"x" * 60_000, 65536)
        await _responses(transport, 1)
        assert bytes(transport.out).startswith(b"HTTP/1.1 413") and transport.protocol is conn
        conn.connection_lost(None)

    asyncio.run(main())


def test_a_client_gone_mid_body_leaves_nothing_behind():
    async def main():
        server, conn, transport = await _connected(Digest(), max_body_bytes=1 << 20)
        transport.read(b"POST /x HTTP/1.1\r\nContent-Length: 200000\r\n\r\n" + b"x" * 60_000, 65536)
        filler = transport.protocol
        assert isinstance(filler, BodyFiller)
        filler.connection_lost(None)  # the transport tells the protocol it has
        assert conn._transport is None and server.connection_count == 0

    asyncio.run(main())
