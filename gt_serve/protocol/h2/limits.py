"""Every limit of the HTTP/2 transport in one frozen dataclass, and the token bucket behind the
per-connection rate limits. Defaults are sized for a public port: generous for gRPC clients
(grpcio, grpc-go, tritonclient, h2), small enough that one connection cannot hold the server."""
from __future__ import annotations

from dataclasses import dataclass

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True)
class H2Limits:
    # frames and header blocks
    # SETTINGS_MAX_FRAME_SIZE we advertise and enforce: as large as a stream's window (no DATA frame can be larger),
    # so that grpc-core (which allows 4 MiB itself) sends an image-sized tensor as one DATA frame, not one per 64 KiB:
    # each frame costs Python, and a message of several is joined, a copy of it (issue #17). A frame that spans
    # reads is read into its own buffer (reader.py), allocated once a quarter of it has come; a connection's partial
    # frame stays far below its connection_buffer_bytes
    max_frame_bytes: int = 1 * MIB
    max_header_block_bytes: int = 32 * KIB  # one header block, single frame or CONTINUATION-joined
    max_header_list_bytes: int = 32 * KIB  # decoded (RFC 7541 sizes), SETTINGS_MAX_HEADER_LIST_SIZE
    max_continuation_frames: int = 16  # CONTINUATION frames per header block
    max_size_updates_per_block: int = 2  # HPACK dynamic table size updates at the start of a block
    header_cache_bytes: int = 256 * KIB  # decoded header blocks cached per connection
    header_cache_entries: int = 128
    # streams and flow control
    max_concurrent_streams: int = 256  # SETTINGS_MAX_CONCURRENT_STREAMS; more are refused
    stream_window_bytes: int = 1 * MIB  # SETTINGS_INITIAL_WINDOW_SIZE we advertise
    connection_window_bytes: int = 16 * MIB
    connection_buffer_bytes: int = 32 * MIB  # received, not yet handed to a handler (beyond one message)
    # rate limits per connection (token buckets: sustained rate and burst)
    max_settings_entries: int = 32
    settings_per_s: float = 10.0
    settings_burst: int = 50
    control_frames_per_s: float = 1000.0  # PING, SETTINGS, WINDOW_UPDATE, PRIORITY, empty DATA/CONTINUATION
    control_frames_burst: int = 2000
    resets_per_s: float = 200.0  # RST_STREAM from the client and streams refused
    resets_burst: int = 1000
    # output
    write_high_water_bytes: int = 1 * MIB  # above this: stop reading and sending until drained
    max_queued_output_bytes: int = 16 * MIB  # beyond this the connection is dropped
    # connections and time
    max_connections: int = 1024
    handshake_timeout_s: float = 10.0  # preface and first SETTINGS
    frame_timeout_s: float = 30.0  # a frame begun must be complete within this
    idle_timeout_s: float = 60.0  # no stream open and no frame received
    # messages (gRPC)
    max_message_bytes: int = 2**31 - 1  # a request message, after decompression
    inline_inflate_bytes: int = 64 * KIB  # compressed messages larger than this inflate off the loop


class TokenBucket:
    """`take(now_s)` is True while the sustained rate (with `burst` in hand) is not exceeded."""

    __slots__ = ("_rate_per_s", "_burst", "_tokens", "_last_s")

    def __init__(self, rate_per_s: float, burst: int, now_s: float) -> None:
        self._rate_per_s = rate_per_s
        self._burst = float(burst)
        self._tokens = float(burst)
        self._last_s = now_s

    def take(self, now_s: float, count: float = 1.0) -> bool:
        tokens = self._tokens
        if tokens < count:
            tokens = min(self._burst, tokens + (now_s - self._last_s) * self._rate_per_s)
            self._last_s = now_s
            if tokens < count:
                self._tokens = tokens
                return False
        self._tokens = tokens - count
        return True
