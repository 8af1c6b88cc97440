"""Peers' last wills, applied only once the broker has shown it still runs.

A broker that shuts down (restart, upgrade, container stop) publishes the will of every client it
disconnects, then closes the remaining connections: to the subscribers still connected, every peer
seems to die at once. Such wills must not count. A broker that runs normally routes other messages
after a will; one that shuts down sends nothing after its wills but more wills (this node's own among
them), written during shutdown behind whatever was already queued. So a will is held until a later
message that is not a will arrives from the broker (this node's own telemetry echo included; the
agent publishes one at once to hurry it), and
dropped when the link is lost first. A later message from the will's own node means it reconnected:
the will is dropped. No timer decides, so a slow event loop cannot turn a broker restart into dead
peers.

A retained will (delivered from the broker's store when this node subscribes, e.g. after the broker
restarted with persistence on) tells of an earlier connection of the peer: it is applied to a peer
this view does not hold live, and ignored for one it does (that peer's silence decides, as after any
broker outage; core/node_view.py).
"""
from __future__ import annotations

import logging
from typing import Callable

from gt_serve.edge.messages import Message, Status

log = logging.getLogger(__name__)


def is_will(msg: Message) -> bool:
    """A last will: status ``lost`` (a peer's, or this node's own, which a shutting-down broker sends too)."""
    return isinstance(msg, Status) and msg.state == "lost"


class HeldWills:
    """The wills waiting for proof that the broker is alive, by peer."""

    def __init__(self, self_node: str, apply: Callable[[Message], None], probe: Callable[[], None]) -> None:
        self._self_node = self_node
        self._apply = apply  # feeds a will into the view
        self._probe = probe  # asks for a message through the broker now (own telemetry echo)
        self._held: dict[str, Status] = {}
        self.confirmed = 0  # wills applied
        self.dropped = 0  # wills that came with the loss of the broker, or whose peer spoke again
        self.ignored_retained = 0  # retained wills of peers this view holds live

    def __len__(self) -> int:
        return len(self._held)

    def offer(self, will: Status, retained: bool, peer_is_live: bool) -> None:
        """A will arrived: hold it (or, retained, apply or ignore it)."""
        if retained:
            if peer_is_live:
                self.ignored_retained += 1
                log.info("telemetry %s: ignoring the stored last will of %s (the broker kept it from an "
                         "earlier connection; the peer's silence decides)", self._self_node, will.node)
            else:
                self._apply(will)
            return
        self._held[will.node] = will
        self._probe()

    def heard(self, node: str) -> None:
        """A message other than a will came from the broker, sent by ``node``: every held will is
        confirmed and applied, except that node's own (it spoke after its will: it reconnected)."""
        if not self._held:
            return
        if self._held.pop(node, None) is not None:
            self.dropped += 1
        held, self._held = self._held, {}
        for will in held.values():
            self.confirmed += 1
            self._apply(will)

    def link_lost(self) -> None:
        """The broker went: the wills held came with its going and are dropped."""
        if self._held:
            log.warning("telemetry %s: ignoring the last wills of %s: they came with the loss of the broker",
                        self._self_node, ", ".join(sorted(self._held)))
            self.dropped += len(self._held)
            self._held.clear()
