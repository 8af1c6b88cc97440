"""The sending half of an HTTP/2 connection: response headers, DATA within the peer's windows and
frame size, trailers, and write back-pressure (nothing is sent while the transport is above its
high-water mark; a peer that lets `max_queued_output_bytes` pile up is dropped)."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .frames import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    frame,
    frame_head,
)

if TYPE_CHECKING:
    from .connection import H2Stream

log = logging.getLogger(__name__)

_SEND_FRAME_CAP_BYTES = 128 * 1024  # our DATA frames, whatever larger frames the peer allows
_JOIN_MAX_BYTES = 64 * 1024  # a loop turn's output up to this is joined into one buffer before it is written


class StreamOutput:
    """Mixed into H2Connection, whose state it uses (windows, streams, transport, limits)."""

    def send(self, stream: H2Stream, head: bytes | None, data: tuple, trailers: bytes | None) -> None:
        """Send on `stream`: a header block (`head`), then DATA made of `data`'s parts (flow
        controlled), then a trailer block that ends the stream. Any of them may be empty."""
        if self._transport is None or stream.done:
            return
        sid = stream.sid
        size = sum(map(len, data))
        stream.done = trailers is not None
        limit = self._peer_max_frame
        if (not stream.pending and not self._write_paused and size <= limit and size <= stream.send_window
                and size <= self._conn_send_window and len(head or b"") <= limit and len(trailers or b"") <= limit):
            # the usual response: each part in one frame, written with the rest of this loop turn's output
            parts = [frame_head(len(head), HEADERS, END_HEADERS, sid), head] if head else []
            if data:
                stream.send_window -= size
                self._conn_send_window -= size
                parts.append(frame_head(size, DATA, 0, sid))
                parts += data
                self._control.allow(2)
            if trailers is not None:
                parts += (frame_head(len(trailers), HEADERS, END_HEADERS | END_STREAM, sid), trailers)
            self._write_soon(parts, size + 27 + len(head or b"") + len(trailers or b""))
            if stream.done:
                self._closed(stream)
            return
        if head:
            stream.pending.append(self._header_frames(sid, head, False))
        for part in data:  # framed as the windows allow, written without joining them first
            if len(part):
                stream.pending.append(part if type(part) is memoryview else memoryview(part))
        if trailers is not None:
            stream.pending.append(self._header_frames(sid, trailers, True))
        self._flush_stream(stream)

    def _header_frames(self, sid: int, block: bytes, end_stream: bool) -> bytes:
        flags = END_STREAM if end_stream else 0
        limit = self._peer_max_frame
        if len(block) <= limit:
            return frame(HEADERS, flags | END_HEADERS, sid, block)
        chunks = [block[i:i + limit] for i in range(0, len(block), limit)]
        out = [frame(HEADERS, flags, sid, chunks[0])]
        out += [frame(CONTINUATION, 0, sid, chunk) for chunk in chunks[1:-1]]
        out.append(frame(CONTINUATION, END_HEADERS, sid, chunks[-1]))
        return b"".join(out)

    def _write_soon(self, pieces: list, size: int) -> None:
        """Queue a stream's response frames (the pieces of their bytes): everything queued in one turn of the event
        loop goes out in one transport write at the end of it (`flush_output`). The responses of a batch that
        finished together, on one connection carrying many streams (gRPC clients multiplex their calls), cost one
        system call instead of one each. Answers made while the connection reads (`data_received`: a lone row run at
        once) go out when the read is done, in the same turn."""
        if self._transport is None:
            return
        outbox = self._outbox
        if not outbox and not self._reading:  # while reading, data_received writes it when it returns
            self._loop.call_soon(self.flush_output)
        outbox += pieces
        self._outbox_bytes += size  # the pieces' bytes, or a few more: it only decides when to join them

    def flush_output(self) -> None:
        """Write what `_write_soon` queued; before the transport is closed, call this first. Small pieces are
        joined (one buffer for the system call); past `_JOIN_MAX_BYTES` they go as they are (a tensor's data is
        not copied once more on its way to the kernel)."""
        outbox = self._outbox
        if outbox:
            pieces = outbox[0:1] if len(outbox) == 1 else \
                [b"".join(outbox)] if self._outbox_bytes <= _JOIN_MAX_BYTES else list(outbox)
            outbox.clear()
            self._outbox_bytes = 0
            self._write_pieces(pieces)

    def _write(self, data) -> None:
        """Write at once, after what is queued (frames keep their order): control frames and flow-controlled
        DATA, which must see the transport's back-pressure (pause_writing) before the next one."""
        self._write_pieces((data,))

    def _write_pieces(self, pieces) -> None:
        """`_write` of several pieces in one call (a stream's frames: each DATA payload a view of the message)."""
        if self._outbox:
            self.flush_output()
        transport = self._transport
        if transport is None:
            return
        if len(pieces) == 1:
            transport.write(pieces[0])
        else:
            transport.writelines(pieces)
        if self._write_paused and transport.get_write_buffer_size() > self._limits.max_queued_output_bytes:
            log.debug("HTTP/2 peer does not read: dropping the connection")
            self._transport = None
            transport.abort()

    def _flush_stream(self, stream: H2Stream) -> None:
        """What the windows allow of the stream's pending frames, written together (one system call, no copy of the
        DATA); a stream that must wait is left in `_blocked`."""
        if self._transport is None:
            return
        pending = stream.pending
        out: list = []
        queued = 0
        while pending:
            if self._write_paused:
                break
            if type(pending[0]) is bytes:  # header frames: not flow controlled
                out.append(pending.popleft())
                continue
            allowed = min(stream.send_window, self._conn_send_window, self._peer_max_frame, _SEND_FRAME_CAP_BYTES)
            if allowed <= 0:
                break
            pieces, size = _take_data(pending, allowed)
            out.append(frame_head(size, DATA, 0, stream.sid))
            out += pieces
            stream.send_window -= size
            self._conn_send_window -= size
            self._control.allow(2)
            queued += size
            if queued >= _SEND_FRAME_CAP_BYTES:  # written a frame's worth at a time: back-pressure is seen as before
                self._write_pieces(out)
                out, queued = [], 0
        if out:
            self._write_pieces(out)
        if pending:
            self._blocked[stream.sid] = stream
            return
        self._blocked.pop(stream.sid, None)
        if stream.done:
            self._closed(stream)

    def _flush_blocked(self) -> None:
        for stream in list(self._blocked.values()):
            if self._conn_send_window <= 0 or self._write_paused or self._transport is None:
                return
            self._flush_stream(stream)


def _take_data(pending, allowed: int) -> tuple[list, int]:
    """Up to `allowed` bytes of the DATA views at the front of `pending`, taken off it: (the pieces, their size)."""
    pieces = []
    size = 0
    while pending and size < allowed:
        item = pending[0]
        if type(item) is bytes:  # a header block: framed on its own
            break
        take = allowed - size
        if take >= len(item):
            pieces.append(pending.popleft())
            size += len(item)
        else:
            pieces.append(item[:take])
            pending[0] = item[take:]
            size += take
    return pieces, size
