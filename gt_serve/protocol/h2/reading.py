"""The reading half of `connection.H2Connection` (mixed into it, as `control.py` and `output.py` are): bytes from
the transport to frames (`reader.FrameReader`) to the connection's frame handlers.

The connection is a plain asyncio Protocol: the transport's bytes come to `data_received`, and frames are read from
them where they lie. Except the rest of a large frame (issue #17: an image-sized gRPC message comes as one DATA frame
of up to 1 MiB, and copying it chunk by chunk cost a fifth of the event loop): once its reader has allocated the
frame's buffer whole, the connection hands the transport a `FrameFiller`, an asyncio BufferedProtocol, for as long
as that frame lasts. The transport then reads straight into the frame's buffer (`FrameReader.into`), with no chunk
and no copy in between, and when the frame is whole the connection is the transport's protocol again. Small
messages never meet it: a buffered protocol's two Python calls a read cost them 2-4 % of the event loop at 64 gRPC
clients (measured, twenty-third pass).
"""
from __future__ import annotations

import logging

from ..reusable_buffers import Filler, for_loop
from .frames import ACK, CONTINUATION, INTERNAL_ERROR, PROTOCOL_ERROR, SETTINGS, H2ConnectionError, H2StreamError
from .reader import FrameReader, after_preface

log = logging.getLogger(__name__)

AWAIT_PREFACE, AWAIT_SETTINGS, OPEN = range(3)  # the connection's `_state`


class FrameFiller(Filler):
    """The transport's protocol while the rest of a large frame is read into its buffer."""

    __slots__ = ("_spare",)

    def __init__(self, conn) -> None:  # noqa: ANN001
        super().__init__(conn)
        self._spare: bytearray | None = None  # (read into when there is no frame to fill: handed on as bytes)

    def get_buffer(self, sizehint: int):  # noqa: ANN201
        into = self._conn._reader.into()
        if into is None:  # not expected: the connection takes the transport back when its frame is whole
            if self._spare is None:
                self._spare = bytearray(65536)
            return self._spare
        return into

    def buffer_updated(self, nbytes: int) -> None:
        conn = self._conn
        if conn._transport is None:
            return
        if not conn._reader.filling:  # read into the spare (`get_buffer`)
            return conn.data_received(bytes(self._spare[:nbytes]))
        conn._reader.filled(nbytes)
        conn._last_read_s = conn._loop.time()
        conn._read_frames()
        conn._choose_protocol()

    def data_received(self, data: bytes) -> None:
        self._conn.data_received(data)


class FrameReading:
    """Mixed into H2Connection, whose state it uses (loop, limits, transport, streams, the frame handlers `_on`)."""

    def _start_reading(self) -> None:
        self._reader = FrameReader(self._limits.max_frame_bytes, buffers=for_loop(self._loop))
        self._filler: FrameFiller | None = None  # made for the connection's first large frame
        self._filling = False  # the filler is the transport's protocol
        self._preface_buf = bytearray()
        self._state = AWAIT_PREFACE

    def _choose_protocol(self) -> None:
        """The filler as the transport's protocol while the reader fills a large frame's buffer, else this."""
        filling = self._reader.filling
        if filling is not self._filling and self._transport is not None:
            if self._filler is None:
                self._filler = FrameFiller(self)
            self._filling = filling
            self._transport.set_protocol(self._filler if filling else self)

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
        if self._reader.filling is not self._filling:
            self._choose_protocol()

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
