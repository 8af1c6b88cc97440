"""Large receive buffers used again (issue #17): an HTTP/2 frame's (h2/reader.py) or an HTTP body's
(http_parsing.py), read into by the kernel straight from the socket while a `Filler` is the transport's protocol.

A buffer of an image-sized request is allocated whole (zeroed: as costly as a copy of it) and then lives as long as
the request's tensors, views and arrays over it do. `ReusableBuffers` keeps the last ones made, per event loop
(`for_loop`), and gives one again only when nothing else refers to it: no view, array or message over it is left,
which its reference count says. A client that sends requests of one size then gets the same few buffers, warm.
"""
from __future__ import annotations

import asyncio
import sys
import weakref
from collections import deque

_per_loop: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def for_loop(loop) -> ReusableBuffers:  # noqa: ANN001
    """The buffers of `loop`'s connections (made on first use): one loop's, never shared with another thread's."""
    buffers = _per_loop.get(loop)
    if buffers is None:
        buffers = _per_loop[loop] = ReusableBuffers()
    return buffers


class ReusableBuffers:
    """Buffers made for one event loop's connections, kept (the last ones, up to `keep_bytes`) to be given again:
    `take(size)` gives the oldest kept one of `size` bytes that only this holds, or a new one. A loop with many
    requests in flight has as many buffers in use: the budget is sized for that. What a buffer given again holds
    is stale until overwritten."""

    __slots__ = ("_kept", "_keep_bytes", "_bytes", "_alone")

    def __init__(self, keep_bytes: int = 32 << 20) -> None:
        self._kept: deque[bytearray] = deque()
        self._keep_bytes = keep_bytes
        self._bytes = 0
        self._alone = _references(deque([bytearray(1)]))  # what `take` reads for a buffer only the deque holds

    def take(self, size: int) -> bytearray:
        kept = self._kept
        alone = self._alone
        i = 0
        for buf in kept:
            # referred to by the deque alone (and this loop): no view, array or message over it is left
            if len(buf) == size and sys.getrefcount(buf) == alone:
                del kept[i]  # (by place: `remove` would compare contents)
                kept.append(buf)  # the last to be looked at again
                return buf
            i += 1
        buf = bytearray(size)
        if size <= self._keep_bytes:
            while self._bytes + size > self._keep_bytes:
                self._bytes -= len(kept.popleft())
            kept.append(buf)
            self._bytes += size
        return buf


def _references(kept: deque) -> int:
    """The reference count `ReusableBuffers.take` reads for the first buffer of `kept`, read the same way (the count
    of a buffer held by nothing else depends on the interpreter: measured, not assumed)."""
    for buf in kept:
        return sys.getrefcount(buf)
    raise ValueError("no buffer")


class Filler(asyncio.BufferedProtocol):
    """The transport's protocol while the rest of one large message is read straight into its buffer (a subclass
    says where: `get_buffer`, `buffer_updated`, and `data_received` for a transport that hands bytes on all the
    same); the connection `conn` gets everything else, and takes the transport back (`set_protocol`) when the
    message is whole."""

    __slots__ = ("_conn",)

    def __init__(self, conn) -> None:  # noqa: ANN001
        self._conn = conn

    def eof_received(self):  # noqa: ANN201
        return self._conn.eof_received()

    def pause_writing(self) -> None:
        self._conn.pause_writing()

    def resume_writing(self) -> None:
        self._conn.resume_writing()

    def connection_lost(self, exc) -> None:  # noqa: ANN001
        self._conn.connection_lost(exc)
