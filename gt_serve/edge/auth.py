"""Authenticated cluster messages: an HMAC-SHA256 over topic + payload with the cluster key, and a
replay guard.

Wire form of a signed message (JSON, readable as before; peers without a key ignore the extras)::

    {...the message's fields..., "auth": {"sess": S, "seq": N, "ts": T}, "kid": "<8 hex>", "mac": "<64 hex>"}

The MAC covers ``topic + "\\n" + payload-without-the-kid-and-mac-suffix`` (that is, the bytes up to
``,"kid":`` with the closing brace put back), so it is checked on the raw bytes before any JSON is
parsed. ``kid`` names the key (a hash of it, not the key), so a receiver holding the current and
the previous keys (rotation) checks one MAC. ``auth`` carries the sender's connection number
(``sess``), a sequence number that grows across all the sender's messages of one epoch (``seq``)
and its wall-clock time (``ts``).

Replays (``ReplayGuard``): per node, the newest (epoch, seq) accepted; a message of an older epoch,
or of the same epoch with a seq not above it, is a replay; a message whose ``ts`` is more than
``window_s`` away from this node's clock is stale. The last will (status ``lost``, published by
the broker long after it was signed at connect time) is exempt from the time window but must be of
the newest epoch and of a connection (``sess``) not older than the newest seen, so an old will
replayed after the node reconnected is ignored.
"""
from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any, Mapping

MAC_HEX_CHARS = 64
KID_HEX_CHARS = 8
_KID_OPEN = b',"kid":"'
_MAC_OPEN = b'","mac":"'
_CLOSE = b'"}'
SUFFIX_BYTES = len(_KID_OPEN) + KID_HEX_CHARS + len(_MAC_OPEN) + MAC_HEX_CHARS + len(_CLOSE)
MIN_KEY_CHARS = 16
REASONS = ("malformed", "foreign", "unsigned", "unknown_key", "bad_mac", "replay", "stale")


class AuthError(Exception):
    """A message that fails authentication; ``reason`` is one of REASONS (a metric label)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def key_id(key: bytes) -> str:
    return hashlib.sha256(b"gt-serve cluster key id\n" + key).hexdigest()[:KID_HEX_CHARS]


@dataclass(frozen=True, slots=True)
class AuthHeader:
    kid: str
    sess: int
    seq: int
    ts_s: float


class ClusterKeys:
    """The key messages are signed with and the keys accepted (current first, then previous ones)."""

    def __init__(self, current: str | bytes | None, previous: tuple[str | bytes, ...] = ()) -> None:
        def raw(k: str | bytes) -> bytes:
            return k.encode() if isinstance(k, str) else bytes(k)

        self.current = raw(current) if current else None
        accepted = ([self.current] if self.current else []) + [raw(k) for k in previous if k]
        self._by_kid = {key_id(k): k for k in accepted}
        if self.current is None and self._by_kid:
            raise ValueError("previous cluster keys without a current one")

    @property
    def enabled(self) -> bool:
        return self.current is not None

    def sign(self, topic: str, payload: bytes, *, sess: int, seq: int, ts_s: float) -> bytes:
        """`payload` (a JSON object's bytes) with the auth block, key id and MAC appended."""
        assert self.current is not None, "signing needs a cluster key"
        if not payload.endswith(b"}") or payload == b"{}":
            raise ValueError("a signed payload must be a non-empty JSON object")
        header = json.dumps({"sess": sess, "seq": seq, "ts": ts_s}, separators=(",", ":")).encode()
        signed = payload[:-1] + b',"auth":' + header + b"}"
        mac = _mac(self.current, topic, signed)
        return signed[:-1] + _KID_OPEN + key_id(self.current).encode() + _MAC_OPEN + mac + _CLOSE

    def verify(self, topic: str, payload: bytes) -> str:
        """Check the MAC of a received payload's raw bytes; its key id, or AuthError."""
        if len(payload) <= SUFFIX_BYTES or not payload.endswith(_CLOSE):
            raise AuthError("unsigned", "message carries no MAC")
        tail = payload[-SUFFIX_BYTES:]
        kid = tail[len(_KID_OPEN):len(_KID_OPEN) + KID_HEX_CHARS]
        mac = tail[-MAC_HEX_CHARS - len(_CLOSE):-len(_CLOSE)]
        if not tail.startswith(_KID_OPEN) or tail[len(_KID_OPEN) + KID_HEX_CHARS:][:len(_MAC_OPEN)] != _MAC_OPEN:
            raise AuthError("unsigned", "message carries no MAC in the expected place")
        key = self._by_kid.get(kid.decode("ascii", "replace"))
        if key is None:
            raise AuthError("unknown_key", f"message signed with unknown key id {kid[:8]!r}")
        signed = payload[:-SUFFIX_BYTES] + b"}"
        if not hmac.compare_digest(_mac(key, topic, signed), mac):
            raise AuthError("bad_mac", "message MAC does not verify")
        return kid.decode("ascii")


def _mac(key: bytes, topic: str, signed: bytes) -> bytes:
    return hmac.new(key, topic.encode() + b"\n" + signed, hashlib.sha256).hexdigest().encode()


def read_header(wire: Mapping[str, Any], kid: str) -> AuthHeader:
    """The auth block of a verified message's parsed JSON."""
    auth = wire.get("auth") if isinstance(wire, Mapping) else None
    if not isinstance(auth, dict):
        raise AuthError("malformed", "signed message without an 'auth' object")
    sess, seq, ts = auth.get("sess"), auth.get("seq"), auth.get("ts")
    if type(sess) is not int or type(seq) is not int or not (0 <= sess < 2**63 and 0 <= seq < 2**63):
        raise AuthError("malformed", "auth.sess and auth.seq must be integers within [0, 2**63)")
    if type(ts) not in (int, float) or not 0 <= ts < 1e12:
        raise AuthError("malformed", "auth.ts must be a wall-clock time in seconds")
    return AuthHeader(kid, sess, seq, float(ts))


class _Latest:
    __slots__ = ("epoch", "sess", "seq")

    def __init__(self, epoch: int, sess: int, seq: int) -> None:
        self.epoch, self.sess, self.seq = epoch, sess, seq


class ReplayGuard:
    """Rejects replayed and stale authenticated messages (see the module doc)."""

    def __init__(self, window_s: float = 30.0, max_nodes: int = 4096) -> None:
        if not window_s > 0:
            raise ValueError("the replay window must be positive")
        self.window_s = window_s
        self._max_nodes = max_nodes
        self._latest: dict[str, _Latest] = {}

    def check(self, node: str, epoch: int, header: AuthHeader, *, is_will: bool, now_wall_s: float) -> None:
        """Accept (and remember) one message, or raise AuthError("replay" | "stale")."""
        if not is_will and abs(header.ts_s - now_wall_s) > self.window_s:
            raise AuthError("stale", f"message time {header.ts_s:.0f} is more than {self.window_s:g} s "
                                     f"from this node's clock {now_wall_s:.0f}")
        latest = self._latest.get(node)
        if latest is not None:
            if epoch < latest.epoch:
                raise AuthError("replay", f"epoch {epoch} of node {node!r} is older than {latest.epoch}")
            if epoch == latest.epoch:
                if is_will and header.sess < latest.sess:
                    raise AuthError("replay", f"last will of an old connection of node {node!r}")
                if not is_will and header.seq <= latest.seq:
                    raise AuthError("replay", f"seq {header.seq} of node {node!r} is not above {latest.seq}")
                latest.sess = max(latest.sess, header.sess)
                latest.seq = max(latest.seq, header.seq)
                return
        elif len(self._latest) >= self._max_nodes:
            self._latest.pop(next(iter(self._latest)))
        self._latest[node] = _Latest(epoch, header.sess, header.seq)

    def seen(self, node: str, epoch: int, seq: int) -> bool:
        """Whether (epoch, seq) of `node` is at or below what was accepted (a re-sent retained message)."""
        latest = self._latest.get(node)
        return latest is not None and (epoch, seq) <= (latest.epoch, latest.seq)
