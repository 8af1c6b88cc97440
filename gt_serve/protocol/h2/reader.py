"""Frames out of the byte chunks a connection receives, copying as little as it can.

The chunks are the immutable `bytes` the transport hands `data_received`. A frame that lies inside one chunk is
read where it lies: its payload is a slice of the chunk (one copy, as `bytes`), or, for a DATA payload of at
least `view_min` bytes and a quarter of its chunk, a memoryview of it (no copy; the consumer copies it once when it
joins a message, see grpc_native.stream_data). Only a frame that spans chunks is copied whole first, into the
partial-frame buffer, which grows by amortised appends however small the pieces come. The old way (append every
chunk to one bytearray, slice each payload out, trim the front) copied each received byte three or four times: the
most of a large message's cost (issue #17).

A memoryview payload keeps its chunk alive for as long as the consumer holds it: the quarter rule bounds what is
kept to four times the payload's own bytes, which the connection's flow control counts.

A large frame that spans chunks (an image-sized gRPC message in one DATA frame) is not grown by appends, each of
which may move it: once a quarter of it has come (so a header alone never makes the reader allocate a frame's
worth), its buffer is allocated whole and the rest is copied into place. The connection can then have the
transport read the rest straight into that buffer (`into`, `filled`: reading.FrameFiller), with no chunk
and no copy of its own. Whole-frame buffers come from `ReusableBuffers` (protocol/reusable_buffers.py), which hands
out again one that nothing refers to any more: a client that sends frames of one size gets the same few buffers,
warm and not zeroed again.
"""
from __future__ import annotations

import struct
from collections import deque

from ..reusable_buffers import ReusableBuffers
from .frames import DATA, FRAME_SIZE_ERROR, HEADER_BYTES, PREFACE, PROTOCOL_ERROR, H2ConnectionError

VIEW_MIN_BYTES = 16384
_HEAD = struct.Struct(">BHBBI").unpack_from  # length (high byte, low 16 bits), type, flags, R + stream id


class FrameReader:
    """feed(chunk) as bytes arrive; next_frame() -> (kind, flags, stream_id, payload) or None until one is complete.
    A frame longer than `max_frame_bytes` is refused (H2ConnectionError) from its header alone."""

    __slots__ = ("max_frame_bytes", "view_min", "_buffers", "_chunk", "_pos", "_partial", "_filled", "_more")

    def __init__(self, max_frame_bytes: int, view_min: int = VIEW_MIN_BYTES,
                 buffers: ReusableBuffers | None = None) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.view_min = view_min
        self._buffers = buffers or ReusableBuffers()
        self._chunk = b""  # the chunk being read, from _pos
        self._pos = 0
        self._partial = bytearray()  # the start of a frame whose rest has not arrived (the chunk is then read out)
        self._filled = -1  # -1: _partial grows as bytes come; else it is the whole frame's buffer, filled this far
        self._more: deque[bytes] = deque()  # chunks that arrived while _chunk still held whole frames (a pause)

    @property
    def pending(self) -> int:
        """Received bytes not yet returned in a frame."""
        partial = len(self._partial) if self._filled < 0 else self._filled
        return partial + len(self._chunk) - self._pos + sum(map(len, self._more))

    @property
    def filling(self) -> bool:
        """Whether the next bytes received are the rest of a large frame whose buffer is allocated whole (nothing
        else received waits to be read): `into` gives where they belong."""
        return self._filled >= 0 and self._pos >= len(self._chunk) and not self._more

    def into(self) -> memoryview | None:
        """Where the next bytes received belong when they are the rest of a large frame whose buffer is allocated
        whole (and nothing else received waits to be read): its unfilled part, to be read into directly and then
        counted with `filled`; None when received bytes must come through `feed`."""
        return memoryview(self._partial)[self._filled:] if self.filling else None

    def filled(self, n: int) -> None:
        """`n` bytes were read into the view `into` gave."""
        self._filled += n

    def feed(self, data: bytes) -> None:
        if self._pos < len(self._chunk) or self._more:
            self._more.append(data)
        else:
            self._chunk, self._pos = data, 0

    def next_frame(self):
        while True:
            if self._partial:
                whole = self._complete_partial()
                return None if whole is None else self._whole_frame(whole)
            chunk, pos = self._chunk, self._pos
            avail = len(chunk) - pos
            if avail >= HEADER_BYTES:
                high, low, kind, flags, sid = _HEAD(chunk, pos)
                length = high << 16 | low
                if length > self.max_frame_bytes:
                    raise _oversized(length, self.max_frame_bytes)
                start = pos + HEADER_BYTES
                end = start + length
                if end <= len(chunk):
                    self._pos = end
                    if kind == DATA and length >= self.view_min and 4 * length >= len(chunk):
                        return kind, flags, sid & 0x7FFFFFFF, memoryview(chunk)[start:end]
                    return kind, flags, sid & 0x7FFFFFFF, chunk[start:end]
            if avail:  # the chunk ends inside a frame: its start waits in _partial for the rest
                self._partial += memoryview(chunk)[pos:]
                self._whole_buffer()
            self._chunk, self._pos = b"", 0
            if not self._more:
                return None
            self._chunk = self._more.popleft()

    def _complete_partial(self) -> bytearray | None:
        """Move into _partial just the bytes that complete its frame, from the chunks that came since (the rest
        of them stays where it is); the whole frame, or None while it is still incomplete."""
        while True:
            partial, filled = self._partial, self._filled
            if filled < 0:
                have = len(partial)
                need = HEADER_BYTES - have
                if need <= 0:
                    need = HEADER_BYTES + self._length(partial, 0) - have
            else:
                have = filled
                need = len(partial) - filled
            if need <= 0:
                break
            if self._pos >= len(self._chunk):
                if not self._more:
                    return None
                self._chunk, self._pos = self._more.popleft(), 0
            chunk, pos = self._chunk, self._pos
            take = min(need, len(chunk) - pos)
            if filled < 0:
                partial += memoryview(chunk)[pos:pos + take]
                self._whole_buffer()
            else:
                partial[have:have + take] = memoryview(chunk)[pos:pos + take]
                self._filled = have + take
            self._pos = pos + take
        # the whole frame's buffer is not written again while anything refers to it (ReusableBuffers gives one
        # again only when nothing does): views of it are safe
        self._partial, self._filled = bytearray(), -1
        return partial

    def _whole_buffer(self) -> None:
        """A growing _partial that holds a quarter of a frame with a payload of `view_min` bytes or more (its header
        read) becomes the whole frame's buffer, allocated once, with what came so far at its start."""
        partial = self._partial
        have = len(partial)
        if have < HEADER_BYTES:
            return
        size = HEADER_BYTES + self._length(partial, 0)
        if size - HEADER_BYTES < self.view_min or 4 * have < size or have >= size:
            return
        whole = self._buffers.take(size)
        whole[:have] = partial
        self._partial, self._filled = whole, have

    def _whole_frame(self, buf: bytearray):
        _, _, kind, flags, sid = _HEAD(buf, 0)
        payload = memoryview(buf)[HEADER_BYTES:]
        if kind != DATA or len(payload) < self.view_min:
            payload = bytes(payload)
        return kind, flags, sid & 0x7FFFFFFF, payload

    def _length(self, buf, pos: int) -> int:
        length = buf[pos] << 16 | buf[pos + 1] << 8 | buf[pos + 2]
        if length > self.max_frame_bytes:
            raise _oversized(length, self.max_frame_bytes)
        return length


def _oversized(length: int, limit: int) -> H2ConnectionError:
    return H2ConnectionError(FRAME_SIZE_ERROR, f"frame of {length} bytes (max {limit})")


def after_preface(buf: bytearray, data: bytes) -> bytes | None:
    """What follows the client's connection preface once `data` is added to what came of it before (`buf`, cleared
    when it is complete), or None while it is incomplete; H2ConnectionError when it is not the preface."""
    buf += data
    if len(buf) < len(PREFACE):
        if not PREFACE.startswith(bytes(buf)):
            raise H2ConnectionError(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
        return None
    if bytes(buf[:len(PREFACE)]) != PREFACE:
        raise H2ConnectionError(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
    rest = bytes(buf[len(PREFACE):])
    buf.clear()
    return rest
