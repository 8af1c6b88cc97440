"""Peers' latest status, capabilities and telemetry, with staleness. Read by the router.

Pure: no sockets, no MQTT. Messages come in through ``update(msg, now_s)``; the clock is
injected (``now_s`` arguments, and ``clock`` for the async ``wait_for``). Messages are taken
structurally (``kind``, ``node``, ``epoch``, plus ``state`` for status and ``seq`` for
telemetry), so this module does not import the edge layer that decodes them.

Health of a peer, from its latest incarnation (highest epoch seen):
  dead      its last will said ``lost``, or nothing heard for ``dead_after_periods``;
  offline   it said ``offline`` (graceful stop);
  suspect   nothing heard for ``suspect_after_periods`` (still ``ready``);
  draining  it said ``draining`` and is still heard from;
  live      ``ready`` and heard from recently.
A message with an epoch lower than the latest seen is stale and ignored, so a late will of a
previous incarnation never overrides a newer ``ready``. Within one epoch messages apply in
arrival order (a node that reconnects after its will republishes ``ready``).

Broker loss (``link_down(now_s, since_s)`` .. ``link_up(now_s)``): silence then says nothing about
the peers, so their ages stop at ``since_s`` (when the broker was last heard from) and they keep
the health they had, for at most ``stale_view_s``; after that they are ``suspect`` (not trusted for
routing) until the link is back. On ``link_up`` the outage is added to every peer's last-seen time,
so each must be heard from again within the usual periods; a peer still trusted when the link comes
back has at least ``rejoin_grace_s`` more (its own reconnection back-off: the peers reconnect one by
one, each after its own random delay, and a peer not yet back is in the same state as during the
outage: unknown, not dead). Forwarding still routes around a peer that died meanwhile (failover and
outlier ejection, core/fleet_call.py).

A broker link known to be up can still be broken (a restarted broker's container dropped its sockets
without a FIN: the node learns it only by the MQTT keepalive, seconds later). The node hears its own
messages back through its subscription, so the agent says when it publishes one it expects back
(``echo_sent``) and when one comes back (``echo_heard``). While an echo is awaited, silence counts
only until it was sent: a peer is judged on silence the broker has since proven real. An echo still
missing ``echo_allow_s`` after it was sent puts the broker path in doubt since the send: the same as
a link known down from that time (silence stops counting, ``stale_view_s``), so the peers cannot turn
suspect for the broker's fault first, and no peer's health goes back when the doubt begins. When
echoes come back the view recovers as on ``link_up``; the rejoin grace is given only after a doubt
long enough for a peer to have been judged (``suspect_after_periods``), a shorter one gives each
trusted peer one period to be heard again.

A peer is ``verified`` when its messages were authenticated (cluster key; edge/auth.py).
"""
from __future__ import annotations

import asyncio
import enum
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

log = logging.getLogger(__name__)


class Health(str, enum.Enum):
    LIVE = "live"
    SUSPECT = "suspect"
    DRAINING = "draining"
    OFFLINE = "offline"
    DEAD = "dead"


class PeerMessage(Protocol):
    """What the view needs of a message; gt_serve.edge.messages types fit."""

    @property
    def kind(self) -> str: ...

    @property
    def node(self) -> str: ...

    @property
    def epoch(self) -> int: ...


@dataclass(frozen=True, slots=True)
class PeerInfo:
    """A snapshot of one peer at ``now_s``."""

    node: str
    epoch: int
    health: Health
    state: str
    age_s: float
    caps: Any
    telemetry: Any
    verified: bool = False


@dataclass(frozen=True, slots=True)
class PeerEvent:
    node: str
    epoch: int
    old: Health | None
    new: Health


class _Peer:
    __slots__ = ("node", "epoch", "state", "last_seen_s", "caps", "telemetry", "reported", "verified")

    def __init__(self, node: str, epoch: int, now_s: float) -> None:
        self.node = node
        self.epoch = epoch
        self.state = "ready"
        self.last_seen_s = now_s
        self.caps: Any = None
        self.telemetry: Any = None
        self.reported: Health | None = None
        self.verified = False


Listener = Callable[[PeerEvent], None]


class NodeView:
    def __init__(
        self,
        *,
        self_node: str | None = None,
        period_s: float = 1.0,
        suspect_after_periods: float = 3,
        dead_after_periods: float = 5,
        max_peers: int = 4096,
        forget_after_s: float | None = None,
        stale_view_s: float = 30.0,
        rejoin_grace_s: float = 0.0,
        echo_allow_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not period_s > 0 or not 0 < suspect_after_periods < dead_after_periods:
            raise ValueError("need period_s > 0 and 0 < suspect_after < dead_after periods")
        self._self_node = self_node
        self._period_s = period_s
        self._suspect_after_s = suspect_after_periods * period_s
        self._dead_after_s = dead_after_periods * period_s
        self._max_peers = max_peers
        self._forget_after_s = 60 * period_s if forget_after_s is None else forget_after_s
        self._clock = clock
        self._stale_view_s = stale_view_s
        self._rejoin_grace_s = rejoin_grace_s
        self._link_down_s: float | None = None  # when the broker was last heard from, while it is away
        self._echo_allow_s = period_s / 2 if echo_allow_s is None else echo_allow_s
        self._echo_sent_s: float | None = None  # the first own message not yet heard back was sent then
        self._peers: dict[str, _Peer] = {}
        self._listeners: list[Listener] = []
        self._changed = asyncio.Event()
        self.ignored_stale = 0
        self.ignored_overflow = 0

    @property
    def period_s(self) -> float:
        return self._period_s

    # ------------------------------------------------------------ input

    def update(self, msg: PeerMessage, now_s: float, verified: bool = False) -> bool:
        """Apply one peer message; False if it was ignored (own node, stale, table full)."""
        if msg.node == self._self_node:
            return False
        peer = self._peers.get(msg.node)
        if peer is None:
            if len(self._peers) >= self._max_peers:
                self.ignored_overflow += 1
                return False
            peer = self._peers[msg.node] = _Peer(msg.node, msg.epoch, now_s)
        elif msg.epoch < peer.epoch:
            self.ignored_stale += 1
            return False
        elif msg.epoch > peer.epoch:
            peer = self._restart(peer, msg.epoch, now_s)
        if not self._apply(peer, msg, now_s):
            return False
        peer.verified = verified
        self._report(peer, now_s)
        self._notify()
        return True

    def _apply(self, peer: _Peer, msg: Any, now_s: float) -> bool:
        if msg.kind == "status":
            peer.state = msg.state
        elif peer.state in ("lost", "offline"):
            return False  # same-epoch data after a will or a goodbye: wait for a new "ready"
        elif msg.kind == "caps":
            peer.caps = msg
        elif msg.kind == "telemetry":
            if peer.telemetry is not None and msg.seq <= peer.telemetry.seq:
                self.ignored_stale += 1
                return False
            peer.telemetry = msg
        else:
            return False
        peer.last_seen_s = now_s
        return True

    def _restart(self, old: _Peer, epoch: int, now_s: float) -> _Peer:
        """A new incarnation: the old one is reported dead first (its work is lost)."""
        if old.reported not in (None, Health.DEAD, Health.OFFLINE):
            self._emit(PeerEvent(old.node, old.epoch, old.reported, Health.DEAD))
        peer = self._peers[old.node] = _Peer(old.node, epoch, now_s)
        if old.reported is not None:
            gone = (Health.DEAD, Health.OFFLINE)
            peer.reported = old.reported if old.reported in gone else Health.DEAD
        return peer

    def link_down(self, now_s: float, since_s: float | None = None) -> None:
        """The broker is away; it was last heard from at ``since_s`` (default: now)."""
        if self._link_down_s is None:
            down_s = min(now_s, since_s) if since_s is not None else now_s
            self._link_down_s = min(down_s, self._counted_until(now_s))  # an echo awaited: broken since its send
            self._echo_sent_s = None
            self._notify()

    def link_up(self, now_s: float) -> None:
        """The broker is back: every peer's silence counts again, from where it stopped."""
        down_s = self._down_since(now_s)
        if down_s is None:
            self._echo_sent_s = None
        else:
            self._recover(now_s, down_s, self._rejoin_grace_s)

    def echo_sent(self, now_s: float) -> None:
        """This node published a message it will hear back (its own topics are in its subscription)."""
        if self._echo_sent_s is None and self._link_down_s is None:
            self._echo_sent_s = now_s
            self._notify()  # a new transition time for waiters

    def echo_heard(self, now_s: float) -> None:
        """One of this node's messages came back: the broker path works (a known link-down stays)."""
        if self._link_down_s is not None:
            return
        down_s = self._down_since(now_s)
        if down_s is None:  # in time: silence counts again, up to now
            self._echo_sent_s = None
            self._notify()
        else:  # the path was in doubt: recover as after a reconnect
            long_doubt = now_s - down_s >= self._suspect_after_s
            self._recover(now_s, down_s, self._rejoin_grace_s if long_doubt else self._period_s)

    def _recover(self, now_s: float, down_s: float, grace_s: float) -> None:
        trusted = {p.node for p in self._peers.values() if self._health(p, now_s) in (Health.LIVE, Health.DRAINING)}
        self._link_down_s = None
        self._echo_sent_s = None
        outage_s = max(0.0, now_s - down_s)
        rejoin_by_s = now_s + grace_s - self._suspect_after_s  # silent that long: not yet suspect
        for peer in self._peers.values():
            peer.last_seen_s = min(peer.last_seen_s + outage_s, now_s)
            if peer.node in trusted:
                peer.last_seen_s = max(peer.last_seen_s, rejoin_by_s)
        self._notify()

    def _down_since(self, now_s: float) -> float | None:
        """Since when the broker path is in doubt: the link known down, or an own echo overdue (since its send)."""
        if self._link_down_s is not None:
            return self._link_down_s
        sent_s = self._echo_sent_s
        return sent_s if sent_s is not None and sent_s + self._echo_allow_s <= now_s else None

    def _counted_until(self, now_s: float) -> float:
        """Silence counts until then: the doubt's start, or the send of an echo still awaited."""
        until_s = self._link_down_s if self._link_down_s is not None else self._echo_sent_s
        return now_s if until_s is None else min(now_s, until_s)

    @property
    def link_is_down(self) -> bool:
        """The broker link is known down, or the broker path is in doubt (an own echo overdue)."""
        return self._down_since(self._clock()) is not None

    def sweep(self, now_s: float) -> list[PeerEvent]:
        """Report time-driven transitions (suspect, dead by silence); forget long-gone peers."""
        events = [e for e in (self._report(p, now_s) for p in list(self._peers.values())) if e]
        gone = [p.node for p in self._peers.values()
                if p.reported in (Health.DEAD, Health.OFFLINE)
                and self._age_s(p, now_s) > self._forget_after_s]
        for node in gone:
            del self._peers[node]
        if events or gone:
            self._notify()
        return events

    # ------------------------------------------------------------ queries

    def health(self, node: str, now_s: float) -> Health | None:
        peer = self._peers.get(node)
        return None if peer is None else self._health(peer, now_s)

    def peer(self, node: str, now_s: float) -> PeerInfo | None:
        peer = self._peers.get(node)
        return None if peer is None else self._info(peer, now_s)

    def peers(self, now_s: float) -> tuple[PeerInfo, ...]:
        return tuple(self._info(p, now_s) for p in self._peers.values())

    def live_peers(self, now_s: float) -> tuple[PeerInfo, ...]:
        """Peers that can take work now: ``ready`` and heard from recently."""
        return tuple(self._info(p, now_s) for p in self._peers.values()
                     if self._health(p, now_s) is Health.LIVE)

    def next_transition_s(self, now_s: float) -> float | None:
        """The earliest time after ``now_s`` at which some peer's health changes by silence."""
        best = math.inf
        down_s = self._down_since(now_s)
        doubt_s = down_s if down_s is not None else self._echo_sent_s  # an echo awaited: in doubt from its send
        if down_s is None and doubt_s is not None:
            best = doubt_s + self._echo_allow_s  # the doubt begins then
        if doubt_s is not None:
            untrusted_s = doubt_s + self._stale_view_s
            if untrusted_s > now_s:
                best = min(best, untrusted_s)
        for peer in self._peers.values():
            if peer.state not in ("ready", "draining") or doubt_s is not None:
                continue  # silence not counting now: its next change comes with an echo or the link
            thresholds = (self._suspect_after_s, self._dead_after_s)
            for after_s in thresholds if peer.state == "ready" else thresholds[1:]:
                at_s = peer.last_seen_s + after_s
                if at_s > now_s:
                    best = min(best, at_s)
        return None if best == math.inf else best

    # ------------------------------------------------------------ notification

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(PeerEvent)`` on each health change; returns a remover."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    async def wait_for(self, predicate: Callable[[float], bool], timeout_s: float) -> None:
        """Return once ``predicate(now_s)`` holds; TimeoutError after ``timeout_s``.

        Re-evaluated on every accepted update and at each peer's next staleness threshold,
        so waiting for "peer X is dead" needs no polling loop in the caller.
        """
        deadline_s = self._clock() + timeout_s
        while True:
            now_s = self._clock()
            self.sweep(now_s)
            if predicate(now_s):
                return
            remaining_s = deadline_s - now_s
            if remaining_s <= 0:
                seen = {p.node: p.health.value for p in self.peers(now_s)[:20]}
                raise TimeoutError(f"view condition not met within {timeout_s} s; peers {seen}")
            wake_s = remaining_s
            next_s = self.next_transition_s(now_s)
            if next_s is not None:
                wake_s = min(wake_s, max(next_s - now_s, 1e-3))
            changed = self._changed
            try:  # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancel
                async with asyncio.timeout(wake_s):
                    await changed.wait()
            except TimeoutError:
                pass

    # ------------------------------------------------------------ internals

    def _health(self, peer: _Peer, now_s: float) -> Health:
        if peer.state == "lost":
            return Health.DEAD
        if peer.state == "offline":
            return Health.OFFLINE
        age_s = self._age_s(peer, now_s)
        if age_s >= self._dead_after_s:
            return Health.DEAD
        if peer.state == "draining":
            return Health.DRAINING
        if age_s >= self._suspect_after_s:
            return Health.SUSPECT
        down_s = self._down_since(now_s)
        if down_s is not None and now_s - down_s >= self._stale_view_s:
            return Health.SUSPECT  # the view is too old to route by
        return Health.LIVE

    def _age_s(self, peer: _Peer, now_s: float) -> float:
        """Silence that counts: it stops growing while the broker is away or an own echo is awaited."""
        return max(0.0, self._counted_until(now_s) - peer.last_seen_s)

    def _info(self, peer: _Peer, now_s: float) -> PeerInfo:
        return PeerInfo(node=peer.node, epoch=peer.epoch, health=self._health(peer, now_s),
                        state=peer.state, age_s=max(0.0, now_s - peer.last_seen_s),
                        caps=peer.caps, telemetry=peer.telemetry, verified=peer.verified)

    def _report(self, peer: _Peer, now_s: float) -> PeerEvent | None:
        health = self._health(peer, now_s)
        if health is peer.reported:
            return None
        event = PeerEvent(peer.node, peer.epoch, peer.reported, health)
        peer.reported = health
        self._emit(event)
        return event

    def _emit(self, event: PeerEvent) -> None:
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:  # a listener's bug must not stop the view
                log.exception("node view listener failed on %s", event)

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
