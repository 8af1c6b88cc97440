"""HTTP/2 frames (RFC 9113 section 4 and 6): constants, building, padding, and the two typed errors of the
protocol (connection and stream). Reading frames out of what a connection receives is reader.py's."""
from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20

NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
SETTINGS_TIMEOUT, STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL = 0x4, 0x5, 0x6, 0x7, 0x8
COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x9, 0xB

SETTINGS_HEADER_TABLE_SIZE, SETTINGS_ENABLE_PUSH, SETTINGS_MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE, SETTINGS_MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6

MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65535
MIN_MAX_FRAME = 16384
MAX_MAX_FRAME = (1 << 24) - 1
HEADER_BYTES = 9

u32 = struct.Struct(">I").pack
unpack_u32 = struct.Struct(">I").unpack_from
_setting = struct.Struct(">HI")
_frame_head = struct.Struct(">IBI").pack


def varint(n: int) -> bytes:
    """`n` (>= 0) in 7-bit groups, least significant first, the high bit set on every group but the last: a
    protobuf varint, and the continuation bytes of an HPACK integer past its prefix (RFC 7541 5.1)."""
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class H2ConnectionError(Exception):
    """A connection error: GOAWAY with `code`, then close."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class H2StreamError(Exception):
    """A stream error: RST_STREAM with `code` on that stream; the connection carries on."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def frame_head(length: int, kind: int, flags: int, stream_id: int) -> bytes:
    """The 9 bytes before a frame's payload: a 24-bit length and the type (one 32-bit word), flags, stream id."""
    return _frame_head(length << 8 | kind, flags, stream_id)


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return frame_head(len(payload), kind, flags, stream_id) + payload


def settings_payload(pairs) -> bytes:
    return b"".join(_setting.pack(key, value) for key, value in pairs)


def parse_settings(payload: bytes, max_entries: int) -> list[tuple[int, int]]:
    if len(payload) % 6:
        raise H2ConnectionError(FRAME_SIZE_ERROR, "SETTINGS length is not a multiple of 6")
    if len(payload) // 6 > max_entries:
        raise H2ConnectionError(ENHANCE_YOUR_CALM, f"more than {max_entries} entries in one SETTINGS frame")
    return [_setting.unpack_from(payload, i) for i in range(0, len(payload), 6)]


def goaway(last_stream_id: int, code: int, message: str = "") -> bytes:
    return frame(GOAWAY, 0, 0, u32(last_stream_id) + u32(code) + message.encode()[:256])


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, u32(code))


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, u32(increment))


def strip_padding(payload: bytes | memoryview, kind_name: str) -> bytes | memoryview:
    """The payload of a PADDED frame without its pad-length byte and padding (RFC 9113 6.1, 6.2)."""
    if not payload:
        raise H2ConnectionError(PROTOCOL_ERROR, f"PADDED {kind_name} frame without a pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise H2ConnectionError(PROTOCOL_ERROR, f"{kind_name} padding of {pad} bytes exceeds the frame")
    return payload[1:len(payload) - pad]
