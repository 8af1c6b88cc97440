"""Header-block decoding: `hpack` behind checks that run before it and a cache bounded in bytes.

A client's header blocks repeat byte for byte once its HPACK dynamic table is warm, so a cache of
whole blocks skips most decoding. The checks refuse what would make decoding expensive: a block
that starts with more dynamic-table size updates than RFC 7541 4.2 allows (two), and, through
hpack's own limit, a decoded header list larger than `max_header_list_bytes`. Any HPACK failure
is a connection error (COMPRESSION_ERROR): the peer's table and ours no longer agree.
"""
from __future__ import annotations

import logging

from hpack import Decoder

from .frames import COMPRESSION_ERROR, H2ConnectionError
from .limits import H2Limits

_ENTRY_OVERHEAD_BYTES = 32  # RFC 7541 4.1, also charged per cached header


def quiet_hpack_logging() -> None:
    """hpack logs every decoded header at DEBUG, `authorization` included: never let it."""
    logging.getLogger("hpack").setLevel(logging.WARNING)


def leading_size_updates(block: bytes, most: int) -> int:
    """How many dynamic-table size updates (0b001xxxxx) begin `block`, counting up to `most` + 1."""
    count = pos = 0
    end = len(block)
    while pos < end and count <= most and block[pos] & 0xE0 == 0x20:
        count += 1
        if block[pos] & 0x1F == 0x1F:  # multi-byte integer: skip its continuation bytes
            pos += 1
            while pos < end and block[pos] & 0x80:
                pos += 1
        pos += 1
    return count


class HeaderDecoder:
    """Decodes one connection's header blocks, in order."""

    __slots__ = ("_decoder", "_cache", "_cache_bytes", "_limits")

    def __init__(self, limits: H2Limits) -> None:
        self._limits = limits
        self._decoder = Decoder(max_header_list_size=limits.max_header_list_bytes)
        self._cache: dict[bytes, list] = {}
        self._cache_bytes = 0

    @property
    def cache_bytes(self) -> int:
        return self._cache_bytes

    def decode(self, block: bytes) -> list:
        cached = self._cache.get(block)
        if cached is not None:
            return cached
        most = self._limits.max_size_updates_per_block
        if block and block[0] & 0xE0 == 0x20 and leading_size_updates(block, most) > most:
            raise H2ConnectionError(COMPRESSION_ERROR, f"more than {most} table size updates in a header block")
        table = self._decoder.header_table
        before = _table_state(table)
        try:
            headers = self._decoder.decode(block)
        except Exception as exc:  # noqa: BLE001 - any HPACK failure breaks the connection's table
            raise H2ConnectionError(COMPRESSION_ERROR, f"bad header block: {exc}") from None
        if _table_state(table) != before:  # indices moved: cached decodings may now mean something else
            self._cache.clear()
            self._cache_bytes = 0
        else:
            self._remember(block, headers)
        return headers

    def _remember(self, block: bytes, headers: list) -> None:
        cost = len(block) + sum(len(n) + len(v) + _ENTRY_OVERHEAD_BYTES for n, v in headers)
        limits = self._limits
        if self._cache_bytes + cost > limits.header_cache_bytes or len(self._cache) >= limits.header_cache_entries:
            return
        self._cache[block] = headers
        self._cache_bytes += cost


def _table_state(table) -> tuple:
    entries = table.dynamic_entries
    return len(entries), id(entries[0]) if entries else 0, table.maxsize
