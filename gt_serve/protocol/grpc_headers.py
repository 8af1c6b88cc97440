"""The gRPC header and trailer blocks of the native transport (`grpc_native.py`), and `grpc-timeout`.

`parse_timeout` reads a request's `grpc-timeout`; `RESPONSE_HEADERS_BLOCK`, `OK_TRAILERS_BLOCK` and
`status_block` are the HPACK blocks of a response, made of literals without indexing (no Huffman), so
they need no encoder state. Their own module: pure wire encoding, with no connection or stream state.
"""
from __future__ import annotations

from urllib.parse import quote

from .h2.frames import varint

_GRPC_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
_MAX_STATUS_MESSAGE_CHARS = 4096


def _hpack_str(raw: bytes) -> bytes:
    n = len(raw)
    if n < 127:
        return bytes((n,)) + raw
    return b"\x7f" + varint(n - 127) + raw  # the 7-bit prefix full, the rest in continuation bytes


def _literal(name: bytes, value: bytes) -> bytes:
    """HPACK literal header field without indexing, new name (no Huffman)."""
    return b"\x00" + _hpack_str(name) + _hpack_str(value)


# response headers: ":status: 200" (static index 8) and content-type (static name 31, literal value)
RESPONSE_HEADERS_BLOCK = b"\x88" + b"\x0f\x10" + _hpack_str(b"application/grpc")
OK_TRAILERS_BLOCK = _literal(b"grpc-status", b"0")


def status_block(code: int, message: str, trailers: tuple = ()) -> bytes:
    block = _literal(b"grpc-status", str(code).encode())
    if message:
        message = message[:_MAX_STATUS_MESSAGE_CHARS]
        block += _literal(b"grpc-message", quote(message, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~").encode())
    for name, value in trailers:  # the servicer's own (status.grpc_trailers): plain lowercase ASCII
        block += _literal(name.encode("ascii"), value.encode("ascii"))
    return block


def parse_timeout(value: str) -> float | None:
    """A `grpc-timeout` header value in seconds (None when malformed)."""
    if not 2 <= len(value) <= 9:  # at most 8 digits (gRPC over HTTP/2)
        return None
    try:
        return int(value[:-1]) * _GRPC_TIMEOUT_UNITS[value[-1]]
    except (KeyError, ValueError):
        return None
