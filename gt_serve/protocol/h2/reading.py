"""The reading half of `connection.H2Connection` (mixed into it, as `control.py` and `output.py` are): bytes from
the transport to frames (`reader.FrameReader`) to the connection's frame handlers.

The connection is an asyncio BufferedProtocol: the transport reads into the buffer `get_buffer` gives. That is the
event loop's read buffer, whose bytes `buffer_updated` hands on as `data_received` would get them (a copy, as the
transport's own bytes would be), except where the bytes to come are the rest of a large frame: then it is that
frame's own buffer (`FrameReader.into`), which the kernel fills with no copy in between (issue #17: an image-sized
gRPC message comes in one DATA frame; a plain protocol's copies of it, chunk by chunk, then joined, cost a fifth of
the event loop).
"""
from __future__ import annotations

import logging
import weakref

from .frames import ACK, CONTINUATION, INTERNAL_ERROR, PROTOCOL_ERROR, SETTINGS, H2ConnectionError, H2StreamError
from .reader import FrameBuffers, FrameReader, after_preface

log = logging.getLogger(__name__)

AWAIT_PREFACE, AWAIT_SETTINGS, OPEN = range(3)  # the connection's `_state`
_READ_BYTES = 256 * 1024  # what one read takes at most (uvloop's own read buffer)
# per event loop, shared by its connections: the read buffer (the transport reads into it and `buffer_updated`
# copies what came before it returns, so no connection's bytes outlive the next read) and the whole-frame buffers
_loop_buffers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class FrameReading:
    """Mixed into H2Connection, whose state it uses (loop, limits, transport, streams, the frame handlers `_on`)."""

    def _start_reading(self) -> None:
        shared = _loop_buffers.get(self._loop)
        if shared is None:
            shared = _loop_buffers[self._loop] = (memoryview(bytearray(_READ_BYTES)), FrameBuffers())
        self._read_buffer: memoryview = shared[0]
        self._read_into: memoryview | None = None  # what `get_buffer` gave: the loop's read buffer, or a frame's
        self._reader = FrameReader(self._limits.max_frame_bytes, buffers=shared[1])
        self._preface_buf = bytearray()
        self._state = AWAIT_PREFACE

    def get_buffer(self, sizehint: int) -> memoryview:
        into = self._reader.into()
        self._read_into = into
        return self._read_buffer if into is None else into

    def buffer_updated(self, nbytes: int) -> None:
        into, self._read_into = self._read_into, None
        if into is None:
            self.data_received(bytes(self._read_buffer[:nbytes]))
        elif self._transport is not None:
            self._reader.filled(nbytes)
            self._last_read_s = self._loop.time()
            self._read_frames()

    def data_received(self, data: bytes) -> None:
        if self._transport is None:
            return
        self._last_read_s = self._loop.time()
        if self._state == AWAIT_PREFACE:
            try:
                data = after_preface(self._preface_buf, data)
            except H2ConnectionError as exc:
                return self._connection_error(exc.code, exc.message)
            if data is None:
                return
            self._state = AWAIT_SETTINGS
        self._reader.feed(data)
        self._read_frames()

    def _read_frames(self) -> None:
        self._reading = True
        try:
            self._process()
        finally:
            self._reading = False
        if self._outbox:  # answers made while reading (a lone row run at once): written now, one system call
            self.flush_output()

    def _process(self) -> None:
        next_frame = self._reader.next_frame
        on = self._on
        try:
            while not self._write_paused:
                parsed = next_frame()
                if parsed is None:
                    break
                kind = parsed[0]
                # the usual frame (a known type, on an open connection, no header block pending) needs no checks
                if (self._continuation is None and self._state == OPEN and kind <= CONTINUATION) \
                        or self._admit(kind, parsed[1]):
                    try:
                        on[kind](parsed[1], parsed[2], parsed[3])
                    except H2StreamError as exc:
                        self.reset_stream(parsed[2], exc.code)
                if self._transport is None:
                    return
        except H2ConnectionError as exc:
            return self._connection_error(exc.code, exc.message)
        except Exception as exc:  # noqa: BLE001 - a bug must cost this connection only, with a GOAWAY
            log.exception("error in HTTP/2 connection")
            return self._connection_error(INTERNAL_ERROR, f"internal error: {type(exc).__name__}")
        if self._reader.pending:
            if self._partial_since_s is None:
                self._partial_since_s = self._last_read_s
        else:
            self._partial_since_s = None

    def _admit(self, kind: int, flags: int) -> bool:
        """Whether a frame that is not the usual kind goes to its handler: a connection error (raised) where the
        connection's state forbids it; False for an unknown type, ignored (RFC 9113 5.5) but not without limit."""
        if self._continuation is not None and kind != CONTINUATION:
            raise H2ConnectionError(PROTOCOL_ERROR, "expected CONTINUATION")
        if self._state != OPEN:
            if kind != SETTINGS or flags & ACK:
                raise H2ConnectionError(PROTOCOL_ERROR, "the first frame must be SETTINGS")
            self._state = OPEN
        if kind <= CONTINUATION:
            return True
        self._control.frame(self._loop.time())
        return False
