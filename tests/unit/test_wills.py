"""HeldWills: a will counts only once the broker shows it still runs (edge/wills.py)."""
from __future__ import annotations

from gt_serve.edge.messages import Status
from gt_serve.edge.wills import HeldWills, is_will


def will(node: str) -> Status:
    return Status(node=node, epoch=1, state="lost", ts_s=0.0)


def held() -> tuple[HeldWills, list[str], list[int]]:
    applied: list[str] = []
    probes: list[int] = []
    return HeldWills("a", lambda msg: applied.append(msg.node), lambda: probes.append(1)), applied, probes


def test_a_will_waits_for_a_later_message_and_asks_for_one() -> None:
    wills, applied, probes = held()
    wills.offer(will("b"), retained=False, peer_is_live=True)
    assert applied == [] and len(wills) == 1 and probes == [1]
    wills.heard("a")  # our own echo came back through the broker
    assert applied == ["b"] and wills.confirmed == 1 and len(wills) == 0


def test_wills_before_the_loss_of_the_link_are_dropped() -> None:
    wills, applied, _ = held()
    wills.offer(will("b"), retained=False, peer_is_live=True)
    wills.offer(will("c"), retained=False, peer_is_live=True)
    wills.link_lost()
    wills.heard("a")  # after a reconnect: nothing left to confirm
    assert applied == [] and wills.dropped == 2


def test_a_peer_that_speaks_after_its_will_reconnected() -> None:
    wills, applied, _ = held()
    wills.offer(will("b"), retained=False, peer_is_live=True)
    wills.offer(will("c"), retained=False, peer_is_live=True)
    wills.heard("b")  # b's own message: its will is void; c's is confirmed by it
    assert applied == ["c"] and wills.dropped == 1


def test_a_stored_will_counts_only_for_a_peer_not_held_live() -> None:
    wills, applied, probes = held()
    wills.offer(will("b"), retained=True, peer_is_live=True)
    wills.offer(will("c"), retained=True, peer_is_live=False)
    assert applied == ["c"] and wills.ignored_retained == 1 and probes == [] and len(wills) == 0


def test_only_a_lost_status_is_a_will() -> None:
    assert is_will(will("b")) and is_will(will("a"))  # this node's own will is a will too: it confirms nothing
    assert not is_will(Status(node="b", epoch=1, state="offline", ts_s=0.0))
    assert not is_will(Status(node="b", epoch=1, state="ready", ts_s=0.0))
