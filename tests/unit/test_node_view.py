"""NodeView: staleness state machine, epoch rule, events and waiting, all on an injected clock."""
from __future__ import annotations

import asyncio
import time

import pytest

from gt_serve.core.node_view import Health, NodeView, PeerEvent
from gt_serve.edge.messages import Caps, Status, Telemetry


class FakeClock:
    def __init__(self, now_s: float = 1000.0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def st(node: str, state: str = "ready", epoch: int = 1) -> Status:
    return Status(node=node, epoch=epoch, state=state, ts_s=0.0)


def tel(node: str, seq: int, epoch: int = 1, queue_depth: int = 0) -> Telemetry:
    return Telemetry(node=node, epoch=epoch, seq=seq, ts_s=0.0, queue_depth=queue_depth)


def caps(node: str, epoch: int = 1) -> Caps:
    return Caps(node=node, epoch=epoch, endpoints={"grpc": "127.0.0.1:8001"})


def view(**kw: object) -> NodeView:
    return NodeView(period_s=1.0, **kw)  # type: ignore[arg-type]


def test_ready_peer_is_live_then_suspect_then_dead_by_silence() -> None:
    v = view()
    assert v.update(st("b"), 0.0)
    assert v.health("b", 2.9) is Health.LIVE
    assert v.health("b", 3.0) is Health.SUSPECT
    assert v.health("b", 4.9) is Health.SUSPECT
    assert v.health("b", 5.0) is Health.DEAD
    assert [p.node for p in v.live_peers(2.0)] == ["b"]
    assert v.live_peers(3.5) == ()


def test_telemetry_keeps_a_peer_live_and_revives_a_silent_one() -> None:
    v = view()
    v.update(st("b"), 0.0)
    for i in range(1, 10):
        v.update(tel("b", seq=i, queue_depth=i), float(i))
        assert v.health("b", i + 0.5) is Health.LIVE
    assert v.peer("b", 9.5).telemetry.queue_depth == 9
    assert v.health("b", 20.0) is Health.DEAD
    v.update(tel("b", seq=10), 20.0)  # same incarnation speaks again
    assert v.health("b", 20.1) is Health.LIVE


def test_will_makes_a_peer_dead_at_once() -> None:
    v = view()
    v.update(st("b"), 0.0)
    v.update(st("b", "lost"), 0.5)
    assert v.health("b", 0.5) is Health.DEAD


def test_graceful_offline_and_draining() -> None:
    v = view()
    v.update(st("b"), 0.0)
    v.update(st("b", "draining"), 0.1)
    assert v.health("b", 0.2) is Health.DRAINING
    assert v.live_peers(0.2) == ()
    assert v.health("b", 4.0) is Health.DRAINING  # not suspect while draining...
    assert v.health("b", 5.1) is Health.DEAD  # ...but silence still kills
    v.update(st("b", "offline"), 5.2)
    assert v.health("b", 5.2) is Health.OFFLINE


def test_stale_will_never_overrides_newer_ready() -> None:
    v = view()
    v.update(st("b", epoch=1), 0.0)
    v.update(st("b", epoch=2), 1.0)  # restarted
    assert not v.update(st("b", "lost", epoch=1), 1.1)  # old incarnation's will, late
    assert v.health("b", 1.2) is Health.LIVE
    assert v.peer("b", 1.2).epoch == 2
    assert not v.update(tel("b", seq=99, epoch=1), 1.3)
    assert v.ignored_stale == 2


def test_newer_epoch_will_kills_and_newer_ready_revives() -> None:
    v = view()
    v.update(st("b", epoch=1), 0.0)
    v.update(st("b", "lost", epoch=1), 1.0)
    v.update(st("b", epoch=2), 2.0)
    assert v.health("b", 2.0) is Health.LIVE
    v.update(st("b", "lost", epoch=3), 3.0)
    assert v.health("b", 3.0) is Health.DEAD


def test_same_epoch_ready_after_will_revives_but_data_alone_does_not() -> None:
    v = view()
    v.update(st("b"), 0.0)
    v.update(st("b", "lost"), 1.0)
    assert not v.update(tel("b", seq=1), 1.1)
    assert v.health("b", 1.1) is Health.DEAD
    v.update(st("b"), 1.2)  # reconnected after a network blip
    assert v.health("b", 1.2) is Health.LIVE


def test_new_incarnation_clears_old_data_and_old_seq() -> None:
    v = view()
    v.update(caps("b", 1), 0.0)
    v.update(tel("b", seq=50, epoch=1), 0.0)
    v.update(tel("b", seq=1, epoch=2), 1.0)
    info = v.peer("b", 1.0)
    assert info.epoch == 2 and info.caps is None and info.telemetry.seq == 1
    assert not v.update(tel("b", seq=1, epoch=2), 1.1)  # duplicate / reordered


def test_own_node_and_table_bound() -> None:
    v = view(self_node="a", max_peers=2)
    assert not v.update(st("a"), 0.0)
    assert v.update(st("b"), 0.0) and v.update(st("c"), 0.0)
    assert not v.update(st("d"), 0.0)
    assert v.ignored_overflow == 1


def test_events_on_message_and_time_transitions() -> None:
    v = view()
    events: list[PeerEvent] = []
    remove = v.add_listener(events.append)
    v.update(st("b"), 0.0)
    v.update(tel("b", 1), 0.5)  # no health change, no event
    assert v.sweep(3.0) == []
    assert v.sweep(3.5)[0].new is Health.SUSPECT
    assert v.sweep(4.0) == []
    v.sweep(5.6)
    assert [(e.old, e.new) for e in events] == [
        (None, Health.LIVE), (Health.LIVE, Health.SUSPECT), (Health.SUSPECT, Health.DEAD)]
    remove()
    v.update(st("b"), 6.0)
    assert len(events) == 3


def test_restart_reports_the_old_incarnation_dead_first() -> None:
    v = view()
    events: list[PeerEvent] = []
    v.add_listener(events.append)
    v.update(st("b", epoch=1), 0.0)
    v.update(st("b", epoch=2), 0.5)
    assert [(e.epoch, e.old, e.new) for e in events] == [
        (1, None, Health.LIVE), (1, Health.LIVE, Health.DEAD), (2, Health.DEAD, Health.LIVE)]


def test_a_failing_listener_does_not_break_the_view() -> None:
    v = view()

    def boom(event: PeerEvent) -> None:
        raise RuntimeError("listener bug")

    v.add_listener(boom)
    assert v.update(st("b"), 0.0)
    assert v.health("b", 0.0) is Health.LIVE


def test_dead_peers_are_forgotten_eventually() -> None:
    v = view(forget_after_s=10.0)
    v.update(st("b"), 0.0)
    v.sweep(6.0)
    assert v.health("b", 6.0) is Health.DEAD
    v.sweep(10.5)
    assert v.peer("b", 10.5) is None


def test_next_transition() -> None:
    v = view()
    assert v.next_transition_s(0.0) is None
    v.update(st("b"), 0.0)
    assert v.next_transition_s(0.0) == 3.0
    assert v.next_transition_s(3.0) == 5.0
    assert v.next_transition_s(5.0) is None


def test_rejects_inconsistent_thresholds() -> None:
    with pytest.raises(ValueError):
        NodeView(period_s=1.0, suspect_after_periods=5, dead_after_periods=3)


@pytest.mark.asyncio
async def test_wait_for_wakes_on_update() -> None:
    clock = FakeClock()
    v = NodeView(period_s=1.0, clock=clock)
    waiter = asyncio.create_task(
        v.wait_for(lambda now_s: [p.node for p in v.live_peers(now_s)] == ["b"], timeout_s=5))
    await asyncio.sleep(0)  # let the waiter block (a yield, not a timed sleep)
    assert not waiter.done()
    v.update(st("b"), clock())
    await asyncio.wait_for(waiter, 5)


@pytest.mark.asyncio
async def test_wait_for_wakes_on_sweep_after_clock_moves() -> None:
    clock = FakeClock()
    v = NodeView(period_s=1.0, clock=clock)
    v.update(st("b"), clock())
    waiter = asyncio.create_task(
        v.wait_for(lambda now_s: v.health("b", now_s) is Health.DEAD, timeout_s=60))
    await asyncio.sleep(0)
    assert not waiter.done()
    clock.now_s += 5.0
    v.sweep(clock())
    await asyncio.wait_for(waiter, 5)


@pytest.mark.asyncio
async def test_wait_for_real_clock_deadline_and_staleness() -> None:
    v = NodeView(period_s=0.02)  # real monotonic clock, short period
    v_now = time.monotonic()
    v.update(st("b"), v_now)
    await v.wait_for(lambda now_s: v.health("b", now_s) is Health.DEAD, timeout_s=5)
    assert v.health("b", v_now + 0.2) is Health.DEAD
    with pytest.raises(TimeoutError):
        await v.wait_for(lambda now_s: False, timeout_s=0.01)


# ------------------------------------------------------------------------------- broker loss

def test_broker_loss_keeps_the_last_view_for_a_bounded_time() -> None:
    v = view(stale_view_s=10.0)
    v.update(st("b"), 0.0)
    v.update(tel("b", 1), 0.5)
    v.link_down(2.0, since_s=1.0)  # the broker was last heard from at 1.0
    assert v.link_is_down
    assert v.health("b", 9.0) is Health.LIVE  # silence no longer counts
    assert v.next_transition_s(9.0) == pytest.approx(11.0)
    assert v.health("b", 11.0) is Health.SUSPECT  # too old to route by
    assert v.live_peers(11.0) == ()
    v.link_up(20.0)  # 19 s outage added: b's silence resumes at 0.5 s
    assert v.health("b", 20.0) is Health.LIVE
    assert v.health("b", 23.0) is Health.SUSPECT  # 3 periods after the resumed silence
    v.update(tel("b", 2), 23.5)
    assert v.health("b", 23.5) is Health.LIVE


def test_after_the_broker_is_back_trusted_peers_have_the_rejoin_grace() -> None:
    v = view(stale_view_s=10.0, rejoin_grace_s=5.0)
    v.update(st("b"), 0.0)
    v.update(st("c"), 0.0)
    v.update(tel("b", 1), 0.5)
    v.link_down(2.0, since_s=1.0)
    v.link_up(4.0)  # b was live: it has until 9.0 to be heard from again (grace 5 s)
    assert v.health("b", 8.9) is Health.LIVE
    assert v.next_transition_s(4.0) == pytest.approx(9.0)
    assert v.health("b", 9.0) is Health.SUSPECT
    v.update(tel("b", 2), 8.0)
    assert v.health("b", 10.9) is Health.LIVE  # heard from: the usual periods again
    assert v.health("b", 11.0) is Health.SUSPECT


def test_the_rejoin_grace_is_not_given_to_peers_already_untrusted() -> None:
    v = view(stale_view_s=3.0, rejoin_grace_s=5.0)
    v.update(st("b"), 0.0)
    v.link_down(1.0)
    assert v.health("b", 4.0) is Health.SUSPECT  # the view grew too old while the broker was away
    v.link_up(20.0)  # silence resumes where it stopped (1 s of it): suspect 2 s later, no grace
    assert v.health("b", 21.9) is Health.LIVE
    assert v.health("b", 22.0) is Health.SUSPECT


def test_peer_silent_before_the_broker_went_stays_suspect() -> None:
    v = view(stale_view_s=10.0)
    v.update(st("b"), 0.0)
    v.link_down(5.0, since_s=4.0)
    assert v.health("b", 6.0) is Health.SUSPECT


# ------------------------------------------------------------------------------- own echo

def test_an_overdue_echo_keeps_the_last_view_before_the_link_is_known_down() -> None:
    clock = FakeClock()
    v = view(stale_view_s=10.0, rejoin_grace_s=5.0, clock=clock)  # echo_allow_s: half a period
    v.update(st("b"), 0.0)
    v.update(tel("b", 1), 1.0)
    v.echo_sent(1.2)
    assert v.next_transition_s(1.2) == pytest.approx(1.7)  # the path is in doubt from then
    clock.now_s = 1.6
    assert not v.link_is_down
    assert v.health("b", 3.9) is Health.LIVE  # b's silence counts until the send (1.2) only
    clock.now_s = 5.0
    assert v.link_is_down  # no echo, yet no link-down told: in doubt since the send
    assert v.sweep(5.0) == []  # no event: b never turned suspect on the way
    assert v.health("b", 11.1) is Health.LIVE
    assert v.health("b", 11.2) is Health.SUSPECT  # stale_view_s after the doubt began
    v.echo_heard(8.0)  # back after 6.8 s (>= 3 periods): recovered as after a reconnect, with the grace
    assert not v.link_is_down
    assert v.health("b", 12.9) is Health.LIVE
    assert v.health("b", 13.0) is Health.SUSPECT


def test_a_short_doubt_gives_one_period_not_the_grace() -> None:
    v = view(rejoin_grace_s=5.0)
    v.update(st("b"), 0.0)
    v.echo_sent(2.0)
    assert v.health("b", 3.0) is Health.LIVE  # counted until the send (2.0) only
    v.echo_heard(3.0)  # 1 s of doubt: b's silence resumes at 2 s, with one period to be heard in
    assert v.health("b", 3.9) is Health.LIVE
    assert v.health("b", 4.0) is Health.SUSPECT


def test_an_echo_in_time_changes_nothing() -> None:
    v = view()
    v.update(st("b"), 0.0)
    v.echo_sent(1.0)
    v.echo_heard(1.01)
    assert v.health("b", 3.0) is Health.SUSPECT
    assert v.next_transition_s(1.01) == pytest.approx(3.0)


def test_a_link_down_after_an_overdue_echo_keeps_the_earlier_start() -> None:
    v = view(stale_view_s=10.0)
    v.update(st("b"), 0.0)
    v.echo_sent(1.0)
    v.link_down(4.0, since_s=3.0)  # the keepalive noticed later; the path was in doubt since the send (1.0)
    assert v.health("b", 10.9) is Health.LIVE
    assert v.health("b", 11.0) is Health.SUSPECT
    v.echo_heard(12.0)  # an echo cannot end a known link-down: only link_up does
    assert v.health("b", 12.0) is Health.SUSPECT
    v.link_up(12.0)
    assert v.health("b", 12.0) is Health.LIVE  # 1 s of silence counted, as before the doubt


def test_silence_while_an_echo_is_awaited_is_judged_when_it_comes_and_never_undone() -> None:
    v = view()  # suspect after 3 s of silence
    v.update(st("b"), 0.0)
    v.echo_sent(2.9)
    assert v.next_transition_s(2.95) == pytest.approx(3.4)  # not b's 3.0: silence counts until the send only
    assert v.health("b", 3.05) is Health.LIVE
    v.echo_heard(3.05)  # the broker works: b's silence was real
    assert v.health("b", 3.05) is Health.SUSPECT
    assert [e.new for e in v.sweep(3.05)] == [Health.SUSPECT]


def test_an_echo_that_never_comes_leaves_a_peer_near_its_threshold_live() -> None:
    v = view(stale_view_s=10.0)
    v.update(st("b"), 0.0)
    v.echo_sent(2.9)  # the broker went quiet just before: b's last message will not come
    for now_s in (2.95, 3.4, 5.0, 12.8):
        assert v.health("b", now_s) is Health.LIVE, now_s  # 2.9 s counted: never suspect, never back
        assert v.sweep(now_s) == []
    assert v.health("b", 12.9) is Health.SUSPECT  # stale_view_s after the doubt began


def test_no_echo_is_expected_while_the_link_is_known_down() -> None:
    v = view(stale_view_s=10.0)
    v.update(st("b"), 0.0)
    v.link_down(1.0)
    v.echo_sent(1.5)
    v.link_up(2.0)
    assert v.health("b", 3.9) is Health.LIVE  # 1 s counted before the outage, 1.9 after
    assert v.health("b", 4.0) is Health.SUSPECT


def test_verified_flag_follows_the_messages() -> None:
    v = view()
    v.update(st("b"), 0.0, verified=True)
    assert v.peer("b", 0.0).verified
    v.update(st("c"), 0.0)
    assert not v.peer("c", 0.0).verified
