"""One server-side HTTP/2 connection (prior knowledge, no TLS): the frame state machine of RFC 9113.

It parses frames straight from the receive buffer, keeps the streams, both directions of flow
control, the limits of `H2Limits` (frame and header-block sizes, rate limits, buffer budget,
timeouts, back-pressure) and answers every violation as the RFC asks: a connection error sends
GOAWAY with its code and closes, a stream error sends RST_STREAM. The layer above subclasses it
and implements the hooks (`new_stream`, `stream_opened`, `stream_data`, `stream_ended`,
`stream_closed`; `stream_last` if it can take a stream's last DATA whole); it sends with `send`
and accounts what it buffers with `hold` / `release`.
The reading half is mixed in from `reading.py`, the control-frame handlers from `control.py`, the sending half from
`output.py`.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque

from .control import ControlFrames, ControlHandlers
from .flow import FlowState, ReceiveFlow
from .frames import (
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FRAME_SIZE_ERROR,
    NO_ERROR,
    PADDED,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    SETTINGS,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_CONCURRENT_STREAMS,
    SETTINGS_MAX_FRAME_SIZE,
    SETTINGS_MAX_HEADER_LIST_SIZE,
    STREAM_CLOSED,
    H2ConnectionError,
    H2StreamError,
    frame,
    goaway,
    rst_stream,
    settings_payload,
    strip_padding,
)
from .hpack_cache import HeaderDecoder
from .limits import H2Limits
from .output import StreamOutput
from .reading import OPEN, FrameReading

log = logging.getLogger(__name__)

_RESET_MEMORY = 1024  # stream ids we reset, whose late frames are ignored rather than errors


class H2Stream(FlowState):
    __slots__ = ("send_window", "pending", "headers_sent", "remote_closed", "done")

    def __init__(self, sid: int, recv_window: int, send_window: int) -> None:
        super().__init__(sid, recv_window)
        self.send_window = send_window
        self.pending: deque = deque()  # framed HEADERS (bytes) and DATA still to frame (memoryview)
        self.headers_sent = False
        self.remote_closed = False
        self.done = False  # the response is complete (or the stream was dropped): nothing more to send


class H2Connection(FrameReading, ControlHandlers, StreamOutput, asyncio.Protocol):
    """`server` provides `loop`, `limits` (H2Limits) and `connections` (a set this joins)."""

    def __init__(self, server) -> None:
        self._server = server
        self._loop: asyncio.AbstractEventLoop = server.loop
        self._limits: H2Limits = server.limits
        self._transport: asyncio.Transport | None = None
        self._outbox: list = []  # response frames of this loop turn, sent together (StreamOutput._write_soon)
        self._outbox_bytes = 0
        self._reading = False  # in data_received: what is queued goes out when it returns, not a loop turn later
        self._start_reading()
        self.streams: dict[int, H2Stream] = {}
        self._last_sid = 0
        self._peer_window = DEFAULT_WINDOW
        self._peer_max_frame = 16384
        self._conn_send_window = DEFAULT_WINDOW
        self._flow = ReceiveFlow(self._limits, self._write)
        self._headers = HeaderDecoder(self._limits)
        self._continuation: list | None = None  # [sid, flags, block, frames]
        self._goaway_sent = False
        self._blocked: dict[int, H2Stream] = {}  # streams with output waiting for window or the transport
        self._reset_sids: dict[int, None] = {}
        self._write_paused = False
        now = self._loop.time()
        self._control = ControlFrames(self._limits, now)
        self._opened_s = self._last_read_s = self._paused_since_s = now
        self._partial_since_s: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._on = (self._on_data, self._on_headers, self._on_priority, self._on_rst_stream, self._on_settings,
                    self._on_push_promise, self._on_ping, self._on_goaway, self._on_window_update,
                    self._on_continuation)  # by frame type

    # ---- hooks for the layer above ----
    def new_stream(self, sid: int) -> H2Stream:
        return H2Stream(sid, self._limits.stream_window_bytes, self._peer_window)

    def stream_opened(self, stream: H2Stream, headers: list) -> None:
        raise NotImplementedError

    def stream_data(self, stream: H2Stream, data) -> None:
        raise NotImplementedError

    def stream_ended(self, stream: H2Stream) -> None:
        raise NotImplementedError

    def stream_last(self, stream: H2Stream, data) -> bool:
        """The stream's last DATA (END_STREAM), before `stream_data`: True when the layer above took it whole and
        ended the stream itself (`remote_closed` set, as `stream_ended` would see it), False for the usual way."""
        return False

    def stream_closed(self, stream: H2Stream, reset: bool) -> None:
        raise NotImplementedError

    # ---- asyncio.Protocol ----
    def connection_made(self, transport) -> None:  # noqa: ANN001
        limits = self._limits
        if len(self._server.connections) >= limits.max_connections or self._server.closing:
            transport.write(goaway(0, ENHANCE_YOUR_CALM, "too many connections"))
            transport.close()
            return
        self._transport = transport
        self._server.connections.add(self)
        transport.set_write_buffer_limits(high=limits.write_high_water_bytes)
        settings = settings_payload(((SETTINGS_MAX_CONCURRENT_STREAMS, limits.max_concurrent_streams),
                                     (SETTINGS_INITIAL_WINDOW_SIZE, limits.stream_window_bytes),
                                     (SETTINGS_MAX_FRAME_SIZE, limits.max_frame_bytes),
                                     (SETTINGS_MAX_HEADER_LIST_SIZE, limits.max_header_list_bytes)))
        transport.write(frame(SETTINGS, 0, 0, settings) + self._flow.opening_update())
        self._tick_s = max(0.05, min(1.0, limits.handshake_timeout_s / 4, limits.frame_timeout_s / 4,
                                     limits.idle_timeout_s / 4))
        self._timer = self._loop.call_later(self._tick_s, self._tick)

    def connection_lost(self, exc) -> None:  # noqa: ANN001
        self._transport = None
        self._outbox.clear()
        self._outbox_bytes = 0
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._server.connections.discard(self)
        for stream in list(self.streams.values()):
            self._drop(stream)

    def pause_writing(self) -> None:
        self._write_paused = True
        self._paused_since_s = self._loop.time()
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._transport is None:
            return
        self._process()  # frames read before the pause
        if self._transport is not None and not self._write_paused:
            self._transport.resume_reading()
            self._flush_blocked()

    def _on_data(self, flags: int, sid: int, payload: bytes) -> None:
        size = len(payload)
        stream = self.streams.get(sid)
        if stream is None or stream.remote_closed:
            if sid == 0 or sid > self._last_sid:
                raise H2ConnectionError(PROTOCOL_ERROR, f"DATA on idle stream {sid}")
            self._flow.received(None, size)  # counts against the connection window all the same
            if stream is not None:
                raise H2StreamError(STREAM_CLOSED, "DATA after END_STREAM")
            return
        self._flow.received(stream, size)
        if flags & PADDED:
            payload = strip_padding(payload, "DATA")
        end = flags & END_STREAM
        if payload:
            if not stream.done:
                if end and self.stream_last(stream, payload):  # a unary call's message whole: nothing held
                    return
                self.stream_data(stream, payload)
        elif not end:
            self._control.frame(self._loop.time())
        if self.streams.get(sid) is not stream:  # answered (and forgotten) meanwhile
            return
        self._flow.taken(stream, size, 0)
        if end:
            stream.remote_closed = True
            self.stream_ended(stream)

    def _on_headers(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0 or sid % 2 == 0:
            raise H2ConnectionError(PROTOCOL_ERROR, f"HEADERS on invalid stream id {sid}")
        if flags & PADDED:
            payload = strip_padding(payload, "HEADERS")
        if flags & PRIORITY_FLAG:
            if len(payload) < 5:
                raise H2ConnectionError(FRAME_SIZE_ERROR, "HEADERS too short for its priority fields")
            payload = payload[5:]
        if flags & END_HEADERS:
            return self._headers_complete(sid, flags, payload)
        self._check_block(len(payload))
        self._continuation = [sid, flags, bytearray(payload), 0]

    def _on_continuation(self, flags: int, sid: int, payload: bytes) -> None:
        cont = self._continuation
        if cont is None or cont[0] != sid:
            raise H2ConnectionError(PROTOCOL_ERROR, "unexpected CONTINUATION")
        cont[3] += 1
        if cont[3] > self._limits.max_continuation_frames:
            raise H2ConnectionError(ENHANCE_YOUR_CALM, "too many CONTINUATION frames")
        if not payload and not flags & END_HEADERS:
            self._control.frame(self._loop.time())
        block = cont[2]
        block += payload
        self._check_block(len(block))
        if flags & END_HEADERS:
            self._continuation = None
            self._headers_complete(sid, cont[1], bytes(block))

    def _check_block(self, size: int) -> None:
        if size > self._limits.max_header_block_bytes:
            raise H2ConnectionError(ENHANCE_YOUR_CALM, f"header block over {self._limits.max_header_block_bytes} bytes")

    def _headers_complete(self, sid: int, flags: int, block: bytes) -> None:
        if len(block) > self._limits.max_header_block_bytes:
            self._check_block(len(block))
        headers = self._headers.decode(block)  # always: the HPACK table must follow the peer's
        stream = self.streams.get(sid)
        if stream is not None:  # trailers
            if stream.remote_closed:
                raise H2ConnectionError(STREAM_CLOSED, f"HEADERS after END_STREAM on stream {sid}")
            if not flags & END_STREAM:
                raise H2StreamError(PROTOCOL_ERROR, "trailers without END_STREAM")
            stream.remote_closed = True
            return self.stream_ended(stream)
        if sid <= self._last_sid:
            if sid in self._reset_sids:
                return  # a stream we reset: its late frames are ignored
            raise H2ConnectionError(PROTOCOL_ERROR, f"HEADERS on stream {sid}, not above {self._last_sid}")
        self._last_sid = sid
        if self._goaway_sent or len(self.streams) >= self._limits.max_concurrent_streams:
            return self.reset_stream(sid, REFUSED_STREAM)
        stream = self.new_stream(sid)
        self.streams[sid] = stream
        self._control.allow(4)
        stream.remote_closed = bool(flags & END_STREAM)
        self.stream_opened(stream, headers)
        if stream.remote_closed and self.streams.get(sid) is stream:
            self.stream_ended(stream)

    # ---- for the layer above ----
    def hold(self, stream: H2Stream, size: int) -> None:
        """`size` bytes of `stream`'s DATA are kept until handed to a handler (see `release`)."""
        self._flow.taken(stream, 0, size)

    def release(self, stream: H2Stream, size: int) -> None:
        self._flow.consumed(stream, size)

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    @property
    def active(self) -> int:
        return len(self.streams)

    # ---- ending streams and the connection ----
    def _closed(self, stream: H2Stream) -> None:
        """The response is sent: forget the stream (and stop a client still sending)."""
        if stream.pending or self.streams.get(stream.sid) is not stream:
            return
        del self.streams[stream.sid]
        self._flow.forget(stream)
        if not stream.remote_closed:  # we answered before the client finished sending (RFC 9113 8.1)
            self._write(rst_stream(stream.sid, NO_ERROR))
            self._remember_reset(stream.sid)
        self.stream_closed(stream, False)
        if self._goaway_sent and not self.streams and self._transport is not None:
            self.flush_output()
            self._transport.close()

    def _drop(self, stream: H2Stream) -> None:
        """The stream ends without (the rest of) its response: reset by either side or the connection."""
        stream.done = True
        stream.pending.clear()
        self._blocked.pop(stream.sid, None)
        if self.streams.get(stream.sid) is stream:
            del self.streams[stream.sid]
        self._flow.forget(stream)
        self.stream_closed(stream, True)

    def _remember_reset(self, sid: int) -> None:
        reset = self._reset_sids
        reset[sid] = None
        if len(reset) > _RESET_MEMORY:
            del reset[next(iter(reset))]

    def _connection_error(self, code: int, message: str) -> None:
        transport = self._transport
        if transport is None:
            return
        log.debug("HTTP/2 connection error %d: %s", code, message)
        self._write(goaway(self._last_sid, code, message))  # after any queued frames
        transport.close()
        self.connection_lost(None)

    def _tick(self) -> None:
        """Timeouts: handshake, a frame begun but never finished, a peer that stopped reading, idle."""
        self._timer = None
        if self._transport is None:
            return
        limits = self._limits
        now = self._loop.time()
        if self._state != OPEN and now - self._opened_s > limits.handshake_timeout_s:
            return self._connection_error(PROTOCOL_ERROR, "no preface and SETTINGS in time")
        if self._write_paused:
            if now - self._paused_since_s > limits.frame_timeout_s:
                return self.abort()
        elif self._partial_since_s is not None and now - self._partial_since_s > limits.frame_timeout_s:
            return self._connection_error(PROTOCOL_ERROR, "incomplete frame not finished in time")
        if now - self._last_read_s > limits.idle_timeout_s and len(self._blocked) == len(self.streams):
            return self._connection_error(NO_ERROR, "idle")
        self._timer = self._loop.call_later(self._tick_s, self._tick)
