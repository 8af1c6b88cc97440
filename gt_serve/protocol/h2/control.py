"""The control frames of an HTTP/2 connection: per-connection rate limits on them and on resets,
SETTINGS validation (`ControlFrames`), and `ControlHandlers`, mixed into `H2Connection`: the
handlers of the control frames the peer sends and the RST_STREAM / GOAWAY the server sends. They
live apart from `connection.py`, which keeps the preface, the DATA / HEADERS path and the timeouts;
as a mixin they are the connection's own methods, so frame dispatch costs what it did.

A peer can make a server work without sending requests: PINGs and SETTINGS to acknowledge, empty
DATA / CONTINUATION, PRIORITY, WINDOW_UPDATE, and streams opened and reset at once (rapid reset).
Each kind draws from a token bucket; an empty bucket is a connection error ENHANCE_YOUR_CALM.
PINGs, WINDOW_UPDATEs and SETTINGS ACKs are free up to an allowance earned by real work (four per
stream opened, two per DATA frame sent: grpc-core acknowledges what it reads and probes bandwidth
with PINGs), and drawn from the control bucket beyond that.
"""
from __future__ import annotations

from .frames import (
    ACK,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    MAX_MAX_FRAME,
    MAX_WINDOW,
    MIN_MAX_FRAME,
    NO_ERROR,
    PING,
    PROTOCOL_ERROR,
    SETTINGS,
    SETTINGS_ENABLE_PUSH,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_FRAME_SIZE,
    H2ConnectionError,
    H2StreamError,
    frame,
    goaway,
    parse_settings,
    rst_stream,
)
from .limits import H2Limits, TokenBucket


class ControlFrames:
    __slots__ = ("_control", "_settings", "_resets", "_allowance", "_allowance_cap", "_max_entries")

    def __init__(self, limits: H2Limits, now_s: float) -> None:
        self._control = TokenBucket(limits.control_frames_per_s, limits.control_frames_burst, now_s)
        self._settings = TokenBucket(limits.settings_per_s, limits.settings_burst, now_s)
        self._resets = TokenBucket(limits.resets_per_s, limits.resets_burst, now_s)
        self._allowance = 0
        self._allowance_cap = limits.control_frames_burst
        self._max_entries = limits.max_settings_entries

    def frame(self, now_s: float) -> None:
        if not self._control.take(now_s):
            raise H2ConnectionError(ENHANCE_YOUR_CALM, "too many control frames")

    def reset(self, now_s: float) -> None:
        if not self._resets.take(now_s):
            raise H2ConnectionError(ENHANCE_YOUR_CALM, "too many stream resets")

    def earned(self, clock) -> None:
        """A PING, WINDOW_UPDATE or SETTINGS ACK: free within the allowance, else drawn at `clock()`."""
        if self._allowance > 0:
            self._allowance -= 1
        else:
            self.frame(clock())

    def allow(self, count: int) -> None:
        self._allowance = min(self._allowance + count, self._allowance_cap)

    def settings(self, now_s: float, payload: bytes, conn) -> int | None:
        """Validate a SETTINGS frame; apply the peer's max frame size through `conn`; return the
        new initial window size, if the frame sets one (the last one wins)."""
        if not self._settings.take(now_s):
            raise H2ConnectionError(ENHANCE_YOUR_CALM, "too many SETTINGS frames")
        self.frame(now_s)
        window = None
        for key, value in parse_settings(payload, self._max_entries):
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise H2ConnectionError(FLOW_CONTROL_ERROR, "initial window size over 2^31-1")
                window = value
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not MIN_MAX_FRAME <= value <= MAX_MAX_FRAME:
                    raise H2ConnectionError(PROTOCOL_ERROR, f"max frame size {value} out of range")
                conn.set_peer_max_frame(value)
            elif key == SETTINGS_ENABLE_PUSH and value > 1:
                raise H2ConnectionError(PROTOCOL_ERROR, "ENABLE_PUSH must be 0 or 1")
        return window


class ControlHandlers:
    """Mixed into H2Connection, whose state it uses (streams, windows, transport, `_control`): the
    handlers of the control frames the peer sends, and the RST_STREAM and GOAWAY it sends itself."""

    def _on_priority(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise H2ConnectionError(PROTOCOL_ERROR, "PRIORITY on stream 0")
        if len(payload) != 5:
            raise H2ConnectionError(FRAME_SIZE_ERROR, "PRIORITY length")
        self._control.frame(self._loop.time())

    def _on_rst_stream(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0 or sid > self._last_sid:
            raise H2ConnectionError(PROTOCOL_ERROR, f"RST_STREAM on idle stream {sid}")
        if len(payload) != 4:
            raise H2ConnectionError(FRAME_SIZE_ERROR, "RST_STREAM length")
        self._control.reset(self._loop.time())
        stream = self.streams.get(sid)
        if stream is not None:
            self._drop(stream)

    def _on_settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid:
            raise H2ConnectionError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise H2ConnectionError(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return self._control.earned(self._loop.time)
        window = self._control.settings(self._loop.time(), payload, self)
        if window is not None and window != self._peer_window:
            delta = window - self._peer_window
            self._peer_window = window
            for stream in self.streams.values():  # once per frame, however many entries it had
                stream.send_window += delta
                if stream.send_window > MAX_WINDOW:
                    raise H2ConnectionError(FLOW_CONTROL_ERROR, "stream window overflow")
        self._write(frame(SETTINGS, ACK, 0))
        self._flush_blocked()

    def set_peer_max_frame(self, value: int) -> None:
        self._peer_max_frame = value

    def _on_push_promise(self, flags: int, sid: int, payload: bytes) -> None:
        raise H2ConnectionError(PROTOCOL_ERROR, "clients cannot push")

    def _on_ping(self, flags: int, sid: int, payload: bytes) -> None:
        if sid:
            raise H2ConnectionError(PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise H2ConnectionError(FRAME_SIZE_ERROR, "PING length")
        self._control.earned(self._loop.time)
        if not flags & ACK:
            self._write(frame(PING, ACK, 0, payload))

    def _on_goaway(self, flags: int, sid: int, payload: bytes) -> None:
        if sid:
            raise H2ConnectionError(PROTOCOL_ERROR, "GOAWAY on a stream")
        if len(payload) < 8:
            raise H2ConnectionError(FRAME_SIZE_ERROR, "GOAWAY length")
        self._control.frame(self._loop.time())
        if not self.streams:
            self.goaway()  # ours before closing (RFC 9113 6.8), after any queued answers

    def _on_window_update(self, flags: int, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise H2ConnectionError(FRAME_SIZE_ERROR, "WINDOW_UPDATE length")
        self._control.earned(self._loop.time)
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if sid == 0:
            if increment == 0:
                raise H2ConnectionError(PROTOCOL_ERROR, "connection WINDOW_UPDATE of 0")
            self._conn_send_window += increment
            if self._conn_send_window > MAX_WINDOW:
                raise H2ConnectionError(FLOW_CONTROL_ERROR, "connection window overflow")
            if self._blocked:
                self._flush_blocked()
            return
        stream = self.streams.get(sid)
        if stream is None:
            if sid > self._last_sid:
                raise H2ConnectionError(PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {sid}")
            return
        if increment == 0:
            raise H2StreamError(PROTOCOL_ERROR, "stream WINDOW_UPDATE of 0")
        stream.send_window += increment
        if stream.send_window > MAX_WINDOW:
            raise H2StreamError(FLOW_CONTROL_ERROR, "stream window overflow")
        if stream.pending:  # (a stream with nothing to send is not blocked: grpc-core credits every new stream)
            self._flush_stream(stream)

    def reset_stream(self, sid: int, code: int) -> None:
        """RST_STREAM `code` on `sid`; the stream (if open) is dropped."""
        self._control.reset(self._loop.time())
        self._write(rst_stream(sid, code))
        self._remember_reset(sid)
        stream = self.streams.get(sid)
        if stream is not None:
            self._drop(stream)

    def goaway(self) -> None:
        """Graceful stop: no new streams; close when the open ones are done."""
        if self._transport is None or self._goaway_sent:
            return
        self._goaway_sent = True
        self._write(goaway(self._last_sid, NO_ERROR))
        if not self.streams:
            self.flush_output()
            self._transport.close()
