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
"""
from __future__ import annotations

import struct
from collections import deque

from .frames import DATA, FRAME_SIZE_ERROR, HEADER_BYTES, PREFACE, PROTOCOL_ERROR, H2ConnectionError

VIEW_MIN_BYTES = 16384
_HEAD = struct.Struct(">BHBBI").unpack_from  # length (high byte, low 16 bits), type, flags, R + stream id


class FrameReader:
    """feed(chunk) as bytes arrive; next_frame() -> (kind, flags, stream_id, payload) or None until one is complete.
    A frame longer than `max_frame_bytes` is refused (H2ConnectionError) from its header alone."""

    __slots__ = ("max_frame_bytes", "view_min", "_chunk", "_pos", "_partial", "_more")

    def __init__(self, max_frame_bytes: int, view_min: int = VIEW_MIN_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.view_min = view_min
        self._chunk = b""  # the chunk being read, from _pos
        self._pos = 0
        self._partial = bytearray()  # the start of a frame whose rest has not arrived (the chunk is then read out)
        self._more: deque[bytes] = deque()  # chunks that arrived while _chunk still held whole frames (a pause)

    @property
    def pending(self) -> int:
        """Received bytes not yet returned in a frame."""
        return len(self._partial) + len(self._chunk) - self._pos + sum(map(len, self._more))

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
            self._chunk, self._pos = b"", 0
            if not self._more:
                return None
            self._chunk = self._more.popleft()

    def _complete_partial(self) -> bytearray | None:
        """Move into _partial just the bytes that complete its frame, from the chunks that came since (the rest
        of them stays where it is); the whole frame, or None while it is still incomplete."""
        partial = self._partial
        while True:
            need = HEADER_BYTES - len(partial)
            if need <= 0:
                need = HEADER_BYTES + self._length(partial, 0) - len(partial)
                if need <= 0:
                    break
            if self._pos >= len(self._chunk):
                if not self._more:
                    return None
                self._chunk, self._pos = self._more.popleft(), 0
            chunk, pos = self._chunk, self._pos
            take = min(need, len(chunk) - pos)
            partial += memoryview(chunk)[pos:pos + take]
            self._pos = pos + take
        self._partial = bytearray()  # the whole frame's buffer is never written again: views of it are safe
        return partial

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
