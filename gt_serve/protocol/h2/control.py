"""Per-connection rate limits on control frames and resets, and SETTINGS validation.

A peer can make a server work without sending requests: PINGs and SETTINGS to acknowledge, empty
DATA / CONTINUATION, PRIORITY, WINDOW_UPDATE, and streams opened and reset at once (rapid reset).
Each kind draws from a token bucket; an empty bucket is a connection error ENHANCE_YOUR_CALM.
PINGs, WINDOW_UPDATEs and SETTINGS ACKs are free up to an allowance earned by real work (four per
stream opened, two per DATA frame sent: grpc-core acknowledges what it reads and probes bandwidth
with PINGs), and drawn from the control bucket beyond that.
"""
from __future__ import annotations

from .frames import (
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    MAX_MAX_FRAME,
    MAX_WINDOW,
    MIN_MAX_FRAME,
    PROTOCOL_ERROR,
    SETTINGS_ENABLE_PUSH,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_FRAME_SIZE,
    H2ConnectionError,
    parse_settings,
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

    def earned(self, now_s: float) -> None:
        if self._allowance > 0:
            self._allowance -= 1
        else:
            self.frame(now_s)

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
