"""Property tests for the HTTP/2 frame layer (gt_serve/protocol/h2), in process: random and structured
frame sequences, split at random points, go into one connection over a transport that records
what is written. Whatever comes in, the connection raises nothing, ends (if it ends) with a GOAWAY,
and never holds more than its limits allow. Plus the write back-pressure, deterministically."""
from __future__ import annotations

import asyncio
import os
import struct

import pytest
from hpack import Encoder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gt_serve.protocol.h2 import H2Connection, H2Limits, H2Stream
from gt_serve.protocol.h2 import frames as f

pytestmark = pytest.mark.security

LIMITS = H2Limits(max_message_bytes=1 << 20)
PATH = "/inference.GRPCInferenceService/ModelInfer"


class FakeTransport:
    """Records writes; calls pause_writing / resume_writing around `high_water_bytes` as asyncio does."""

    def __init__(self, high_water_bytes: int = 1 << 30) -> None:
        self.out = bytearray()
        self.writes = 0
        self.high_water_bytes = high_water_bytes
        self.protocol: H2Connection | None = None
        self.closed = self.aborted = self.reading_paused = self.writing_paused = False

    def write(self, data) -> None:
        self.writes += 1
        self.out += data
        if not self.writing_paused and len(self.out) > self.high_water_bytes:
            self.writing_paused = True
            self.protocol.pause_writing()

    def drain(self) -> None:
        self.out.clear()
        if self.writing_paused:
            self.writing_paused = False
            self.protocol.resume_writing()

    def get_write_buffer_size(self) -> int:
        return len(self.out)

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass

    def set_protocol(self, protocol) -> None:
        self.protocol = protocol

    def get_protocol(self):
        return self.protocol

    def pause_reading(self) -> None:
        self.reading_paused = True

    def resume_reading(self) -> None:
        self.reading_paused = False

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = self.aborted = True


class Server:
    def __init__(self, loop) -> None:
        self.loop = loop
        self.limits = LIMITS
        self.connections: set = set()
        self.closing = False


class EchoStream(H2Stream):
    __slots__ = ("received",)


class EchoConnection(H2Connection):
    """Holds each stream's data until END_STREAM, then answers with headers and trailers."""

    def new_stream(self, sid):
        return EchoStream(sid, self._limits.stream_window_bytes, self._peer_window)

    def stream_opened(self, stream, headers) -> None:
        stream.received = 0

    def stream_data(self, stream, data) -> None:
        self.hold(stream, len(data))
        stream.received += len(data)

    def stream_ended(self, stream) -> None:
        self.release(stream, stream.received)
        self.send(stream, b"\x88", (b"answer",), b"\x00\x01x\x01y")

    def stream_closed(self, stream, reset) -> None:
        pass


def frames_of(out: bytes) -> list[tuple[int, int, int, bytes]]:
    result, pos = [], 0
    while len(out) - pos >= 9:
        length = int.from_bytes(out[pos:pos + 3], "big")
        result.append((out[pos + 3], out[pos + 4], struct.unpack(">I", out[pos + 5:pos + 9])[0] & 0x7FFFFFFF,
                       bytes(out[pos + 9:pos + 9 + length])))
        pos += 9 + length
    return result


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def connect(loop, high_water_bytes: int = 1 << 30) -> tuple[EchoConnection, FakeTransport]:
    transport = FakeTransport(high_water_bytes)
    conn = EchoConnection(Server(loop))
    transport.protocol = conn
    conn.connection_made(transport)
    return conn, transport


# ---- strategies ----

def _request_block(extra: int) -> bytes:
    return Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", PATH), (":authority", "x"),
                             ("content-type", "application/grpc"), ("x-n", "v" * extra)])


sids = st.sampled_from([0, 1, 2, 3, 5, 7, 2**31 - 1])
random_frame = st.builds(lambda kind, flags, sid, payload: f.frame(kind, flags, sid, payload),
                         st.integers(0, 12), st.integers(0, 255), sids, st.binary(max_size=48))
structured = st.one_of(
    st.builds(lambda sid, flags, n: f.frame(f.HEADERS, flags | f.END_HEADERS, sid, _request_block(n)),
              sids, st.sampled_from([0, f.END_STREAM]), st.integers(0, 64)),
    st.builds(lambda sid, flags, data: f.frame(f.DATA, flags, sid, data), sids,
              st.sampled_from([0, f.END_STREAM, f.PADDED]), st.binary(max_size=64)),
    st.builds(lambda sid, inc: f.window_update(sid, inc), sids, st.sampled_from([0, 1, 65535, 2**31 - 1])),
    st.builds(lambda pairs: f.frame(f.SETTINGS, 0, 0, f.settings_payload(pairs)),
              st.lists(st.tuples(st.integers(1, 8), st.integers(0, 2**32 - 1)), max_size=40)),
    st.builds(lambda sid: f.rst_stream(sid, f.CANCEL), sids),
    st.builds(lambda sid, n: f.frame(f.CONTINUATION, 0, sid, b"\x00" * n), sids, st.integers(0, 3)),
    st.just(f.frame(f.PING, 0, 0, b"12345678")),
    st.just(f.frame_head(LIMITS.max_frame_bytes + 1, f.DATA, 0, 1)),  # a frame over the limit
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frames=st.lists(st.one_of(random_frame, structured), max_size=30), cuts=st.lists(st.integers(0, 400), max_size=6),
       settings_first=st.booleans())
def test_any_frame_sequence_ends_cleanly_within_limits(loop, frames, cuts, settings_first):
    conn, transport = connect(loop)
    wire = f.PREFACE + (f.frame(f.SETTINGS, 0, 0) if settings_first else b"") + b"".join(frames)
    pos = 0
    for cut in sorted(cuts) + [len(wire)]:
        if cut > pos:
            conn.data_received(wire[pos:cut])  # must not raise
            pos = cut
        assert conn._reader.pending <= 9 + LIMITS.max_frame_bytes or transport.closed
        assert len(conn.streams) <= LIMITS.max_concurrent_streams
        assert conn._headers.cache_bytes <= LIMITS.header_cache_bytes
        assert conn._flow.held <= LIMITS.connection_buffer_bytes + LIMITS.max_message_bytes
        if transport.closed:
            break
    if transport.closed and not transport.aborted:
        last = frames_of(bytes(transport.out))[-1]
        assert last[0] == f.GOAWAY
        assert struct.unpack(">I", last[3][4:8])[0] != f.INTERNAL_ERROR, last[3][8:]  # a bug, not the input
    conn.connection_lost(None)
    assert not conn.streams


def test_a_peer_that_does_not_read_stops_being_read(loop):
    """PINGs answered until the write buffer passes its high-water mark; then neither reading nor
    answering until it drains, and the rest is answered afterwards."""
    conn, transport = connect(loop, high_water_bytes=17 * 10)
    conn.data_received(f.PREFACE + f.frame(f.SETTINGS, 0, 0))
    transport.drain()
    pings = b"".join(f.frame(f.PING, 0, 0, struct.pack(">Q", i)) for i in range(100))
    conn.data_received(pings)
    assert transport.reading_paused
    answered = [fr for fr in frames_of(bytes(transport.out)) if fr[0] == f.PING]
    assert 0 < len(answered) < 100
    assert 0 < conn._reader.pending < len(pings)  # the unanswered ones wait, unread
    total = 0
    for _ in range(100):  # drain until it stops pausing
        total += len([fr for fr in frames_of(bytes(transport.out)) if fr[0] == f.PING])
        if not transport.writing_paused:
            break
        transport.drain()
    assert total == 100 and not transport.reading_paused


def _requests(sids_: list[int]) -> bytes:
    block = _request_block(0)
    return b"".join(f.frame(f.HEADERS, f.END_HEADERS, sid, block) + f.frame(f.DATA, f.END_STREAM, sid, b"q" * sid)
                    for sid in sids_)


def test_answers_of_one_read_or_loop_turn_leave_in_one_write_in_order(loop):
    """Streams answered while one chunk is read (requests run at once) go out in one transport write when
    `data_received` returns, each stream's headers, data and trailers in order; streams answered in a later turn of
    the event loop (a batch's responses) in one write at the end of that turn; a control frame answered meanwhile
    (a PING) is written at once, after the answers queued before it."""
    conn, transport = connect(loop)
    conn.data_received(f.PREFACE + f.frame(f.SETTINGS, 0, 0))
    transport.drain()
    writes = transport.writes
    conn.data_received(_requests([1, 3, 5, 7]))
    assert transport.writes == writes + 1  # written as the read ends, not a loop turn later
    got = [(kind, sid) for kind, _, sid, _ in frames_of(bytes(transport.out))]
    assert got == [(kind, sid) for sid in (1, 3, 5, 7) for kind in (f.HEADERS, f.DATA, f.HEADERS)]
    assert not conn.streams
    transport.drain()
    block = _request_block(0)
    conn.data_received(b"".join(f.frame(f.HEADERS, f.END_HEADERS, sid, block) for sid in (9, 11)))
    writes = transport.writes
    for sid in (9, 11):  # answered outside a read, as a batch's completion answers
        conn.send(conn.streams[sid], b"\x88", (b"answer",), None)
    assert transport.writes == writes and not transport.out  # queued, not written yet
    loop.run_until_complete(asyncio.sleep(0))  # the end of the turn
    assert transport.writes == writes + 1
    assert [(kind, sid) for kind, _, sid, _ in frames_of(bytes(transport.out))] == \
        [(f.HEADERS, 9), (f.DATA, 9), (f.HEADERS, 11), (f.DATA, 11)]
    transport.drain()
    conn.data_received(_requests([13]) + f.frame(f.PING, 0, 0, b"12345678"))
    kinds = [(kind, sid) for kind, _, sid, _ in frames_of(bytes(transport.out))]
    assert kinds == [(f.HEADERS, 13), (f.DATA, 13), (f.HEADERS, 13), (f.PING, 0)]  # flushed before the PING ACK
    loop.run_until_complete(asyncio.sleep(0))
    assert frames_of(bytes(transport.out))[-1][0] == f.PING  # nothing left behind to send twice
    conn.connection_lost(None)


def test_queued_answers_go_out_before_the_connection_closes(loop):
    conn, transport = connect(loop)
    conn.data_received(f.PREFACE + f.frame(f.SETTINGS, 0, 0))
    transport.drain()
    conn.data_received(_requests([1]) + f.frame(f.GOAWAY, 0, 0, struct.pack(">II", 0, 0)))
    assert transport.closed and not transport.aborted
    out = frames_of(bytes(transport.out))
    assert [kind for kind, _, _, _ in out] == [f.HEADERS, f.DATA, f.HEADERS, f.GOAWAY]  # ours last (RFC 9113 6.8)
    assert struct.unpack(">II", out[-1][3][:8]) == (1, f.NO_ERROR)


def test_a_goaway_too_short_is_a_frame_size_error(loop):
    """Found by the property test above: a GOAWAY of fewer than 8 bytes closed the connection without one of ours."""
    conn, transport = connect(loop)
    conn.data_received(f.PREFACE + f.frame(f.SETTINGS, 0, 0) + f.frame(f.GOAWAY, 0, 0, b""))
    assert transport.closed and not transport.aborted
    last = frames_of(bytes(transport.out))[-1]
    assert last[0] == f.GOAWAY and struct.unpack(">I", last[3][4:8])[0] == f.FRAME_SIZE_ERROR


def test_control_frame_flood_is_calmed(loop):
    conn, transport = connect(loop)
    conn.data_received(f.PREFACE + f.frame(f.SETTINGS, 0, 0) + f.frame(f.PING, 0, 0, b"12345678") * 5000)
    assert transport.closed
    last = frames_of(bytes(transport.out))[-1]
    assert last[0] == f.GOAWAY and struct.unpack(">I", last[3][4:8])[0] == f.ENHANCE_YOUR_CALM


def test_data_beyond_a_withheld_window_is_a_flow_control_error(loop):
    """Past the buffer budget, one stream (the lead) keeps its window; another stream's window is
    not reopened, and DATA beyond it ends the connection with FLOW_CONTROL_ERROR."""
    small = H2Limits(stream_window_bytes=64 * 1024, connection_buffer_bytes=128 * 1024)
    server = Server(loop)
    server.limits = small
    conn = EchoConnection(server)
    transport = FakeTransport()
    transport.protocol = conn
    conn.connection_made(transport)
    conn.data_received(f.PREFACE + f.frame(f.SETTINGS, 0, 0))
    chunk = b"\x00" * 16384
    for sid in (1, 3, 5):  # 3 x 64 KiB held: stream 5 crosses the budget and leads
        conn.data_received(f.frame(f.HEADERS, f.END_HEADERS, sid, _request_block(0))
                           + f.frame(f.DATA, 0, sid, chunk) * 4)
    assert not transport.closed and conn._flow.held == 3 * 65536
    conn.data_received(f.frame(f.HEADERS, f.END_HEADERS, 7, _request_block(0)) + f.frame(f.DATA, 0, 7, chunk) * 5)
    assert transport.closed
    last = frames_of(bytes(transport.out))[-1]
    assert last[0] == f.GOAWAY and struct.unpack(">I", last[3][4:8])[0] == f.FLOW_CONTROL_ERROR


class KeepingConnection(EchoConnection):
    """An echo connection that keeps what each stream received, and what each DATA payload came as."""

    def stream_opened(self, stream, headers) -> None:
        super().stream_opened(stream, headers)
        self.got.setdefault(stream.sid, bytearray())

    def stream_data(self, stream, data) -> None:
        super().stream_data(stream, data)
        self.got[stream.sid] += data
        self.payloads.append(data)


def _keeping(loop) -> tuple[KeepingConnection, FakeTransport]:
    transport = FakeTransport()
    conn = KeepingConnection(Server(loop))
    conn.got, conn.payloads = {}, []
    transport.protocol = conn
    conn.connection_made(transport)
    return conn, transport


def _read_as_asyncio_does(transport: FakeTransport, wire: bytes, sizes: list[int]) -> int:
    """`wire` as an asyncio transport reads it, at most `sizes[i]` bytes a read: to the protocol it has now, into
    what `get_buffer` gives when that is a buffered one, else as bytes to `data_received`. The reads that went into
    a buffer."""
    pos = i = buffered = 0
    while pos < len(wire):
        n = min(sizes[i % len(sizes)], len(wire) - pos)
        protocol = transport.protocol
        if isinstance(protocol, asyncio.BufferedProtocol):
            into = protocol.get_buffer(-1)
            n = min(n, len(into))
            into[:n] = wire[pos:pos + n]
            protocol.buffer_updated(n)
            buffered += 1
        else:
            protocol.data_received(wire[pos:pos + n])
        pos, i = pos + n, i + 1
    return buffered


def _large_requests(lengths: list[int]) -> tuple[bytes, dict[int, bytes]]:
    sent = {2 * i + 1: os.urandom(n) for i, n in enumerate(lengths)}
    wire = f.PREFACE + f.frame(f.SETTINGS, 0, 0) + b"".join(
        f.frame(f.HEADERS, f.END_HEADERS, sid, _request_block(0)) + f.frame(f.DATA, f.END_STREAM, sid, payload)
        + f.frame(f.PING, 0, 0, b"12345678") for sid, payload in sent.items())
    return wire, sent


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(1, 300_000), min_size=1, max_size=4),
       sizes=st.lists(st.sampled_from([1, 9, 100, 5000, 16384, 65536, 262144]), min_size=1, max_size=6))
def test_a_buffered_read_gives_what_data_received_gives(loop, lengths, sizes):
    """However the reads are cut, a transport that reads a large frame's rest into the frame's own buffer (the
    connection's filler) gives each stream the bytes, and the peer the answers, that `data_received` alone gives;
    and the connection is the transport's protocol again at the end."""
    wire, sent = _large_requests(lengths)
    plain, plain_out = _keeping(loop)
    plain_out.set_protocol = lambda protocol: None  # a transport that stays with data_received
    _read_as_asyncio_does(plain_out, wire, sizes)
    buffered, buffered_out = _keeping(loop)
    _read_as_asyncio_does(buffered_out, wire, sizes)
    assert buffered.got == plain.got == {sid: bytearray(payload) for sid, payload in sent.items()}
    assert frames_of(bytes(buffered_out.out)) == frames_of(bytes(plain_out.out))
    assert not buffered_out.closed and not buffered.streams and buffered._reader.pending == 0
    assert buffered_out.protocol is buffered
    buffered.connection_lost(None)
    plain.connection_lost(None)


def test_a_large_frame_is_read_into_its_own_buffer(loop):
    """A 300 kB DATA frame read 64 KiB at a time: once a quarter of it came, the kernel's reads go straight into the
    frame's buffer (the connection's filler is the transport's protocol), which the stream gets as it is (no copy of
    the frame made); then the connection is the protocol again."""
    wire, sent = _large_requests([300_000])
    conn, transport = _keeping(loop)
    assert _read_as_asyncio_does(transport, wire, [65536]) == 3  # of 5 reads of the frame: after the first 2
    assert conn.got == {1: bytearray(sent[1])} and transport.protocol is conn
    (payload,) = conn.payloads
    assert isinstance(payload, memoryview) and len(payload.obj) == 9 + 300_000
    assert not transport.closed
    conn.connection_lost(None)
