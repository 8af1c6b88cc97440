"""Receive-side flow control (RFC 9113 6.9) with a per-connection buffer budget.

The peer may send no more than the windows we opened; DATA beyond them is a FLOW_CONTROL_ERROR.
We reopen the connection window as DATA is read (the stream windows bound what each stream can
have outstanding), and a stream's window as its bytes are taken in, but only while the bytes held
for the layer above (partial messages, messages not yet handed to their handler) stay within
`connection_buffer_bytes`. Beyond that, one stream (the `lead`) keeps its window so that a message
larger than the budget can still complete; every other stream's credit waits until held bytes are
consumed. What one connection holds is thus bounded by the budget + one message + one stream
window per open stream.
"""
from __future__ import annotations

from .frames import FLOW_CONTROL_ERROR, H2ConnectionError, window_update
from .limits import H2Limits


class FlowState:
    """The receive-side flow-control fields of one stream."""

    __slots__ = ("sid", "recv_window", "recv_unacked", "owed", "held")

    def __init__(self, sid: int, recv_window: int) -> None:
        self.sid = sid
        self.recv_window = recv_window  # what the peer may still send on this stream
        self.recv_unacked = 0  # taken in, credit not yet sent
        self.owed = 0  # taken in, credit held back by the budget
        self.held = 0  # bytes held for the layer above


class ReceiveFlow:
    """One connection's receive windows and buffer budget; `write` sends WINDOW_UPDATE frames."""

    __slots__ = ("_write", "_stream_window", "_conn_target", "_budget", "conn_window", "_conn_unacked",
                 "held", "_lead", "_owing")

    def __init__(self, limits: H2Limits, write) -> None:
        self._write = write
        self._stream_window = limits.stream_window_bytes
        self._conn_target = limits.connection_window_bytes
        self._budget = limits.connection_buffer_bytes
        self.conn_window = 65535  # until the peer sees our first WINDOW_UPDATE (see opening_update)
        self._conn_unacked = 0
        self.held = 0
        self._lead: FlowState | None = None
        self._owing: dict[int, FlowState] = {}

    def opening_update(self) -> bytes:
        """The WINDOW_UPDATE that raises the connection window to its target (sent with SETTINGS)."""
        increment = self._conn_target - self.conn_window
        self.conn_window = self._conn_target
        return window_update(0, increment)

    def received(self, stream: FlowState | None, size: int) -> None:
        """A DATA frame's flow-controlled `size` arrived (on `stream`, or on one no longer open)."""
        if size > self.conn_window:
            raise H2ConnectionError(FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        self.conn_window -= size
        if stream is not None:
            if size > stream.recv_window:
                raise H2ConnectionError(FLOW_CONTROL_ERROR, f"DATA beyond the window of stream {stream.sid}")
            stream.recv_window -= size
        unacked = self._conn_unacked + size
        if unacked >= self._conn_target >> 1:
            self._write(window_update(0, unacked))
            self.conn_window += unacked
            unacked = 0
        self._conn_unacked = unacked

    def taken(self, stream: FlowState, size: int, held: int) -> None:
        """`size` bytes of `stream` were taken in, `held` of them kept for the layer above: reopen
        the stream's window for them now, or once the budget allows."""
        if held:
            stream.held += held
            self.held += held
        if size <= 0:
            return
        if self.held <= self._budget or self._lead is stream or self._take_lead(stream):
            self._credit(stream, size)
        else:
            stream.owed += size
            self._owing[stream.sid] = stream

    def consumed(self, stream: FlowState, size: int) -> None:
        """`size` held bytes of `stream` went to its handler (or were dropped)."""
        size = min(size, stream.held)
        stream.held -= size
        self.held -= size
        if stream.held <= 0 and self._lead is stream:
            self._lead = None
        if self._owing and (self.held <= self._budget or self._lead is None):
            self._pay_owed()

    def forget(self, stream: FlowState) -> None:
        """The stream is gone: what it held is released."""
        self._owing.pop(stream.sid, None)
        if stream.held:
            self.consumed(stream, stream.held)
        if self._lead is stream:
            self._lead = None
            if self._owing:
                self._pay_owed()

    def _take_lead(self, stream: FlowState) -> bool:
        if self._lead is None:
            self._lead = stream
            return True
        return False

    def _pay_owed(self) -> None:
        for sid in list(self._owing):
            if self.held > self._budget and not self._take_lead(self._owing[sid]):
                return
            stream = self._owing.pop(sid)
            owed, stream.owed = stream.owed, 0
            self._credit(stream, owed)

    def _credit(self, stream: FlowState, size: int) -> None:
        unacked = stream.recv_unacked + size
        if unacked >= self._stream_window >> 1 or stream.recv_window < self._stream_window >> 1:
            self._write(window_update(stream.sid, unacked))
            stream.recv_window += unacked
            unacked = 0
        stream.recv_unacked = unacked
