import math

import pytest

from gt_serve.core.batch_policy import BatchConfig, form_batch


def cfg(mbs=8, preferred=(), delay_s=0.001):
    return BatchConfig(mbs, tuple(preferred), delay_s)


def test_idle_lane_dispatches_at_once():
    d = form_batch([1, 1], oldest_arrival_s=10.0, now_s=10.0, idle_lanes=1, cfg=cfg())
    assert d.take == 2 and d.wait_s == 0.0


def test_no_idle_lane_waits_for_event():
    d = form_batch([1, 1], 10.0, 10.0, idle_lanes=0, cfg=cfg())
    assert d.take == 0 and math.isinf(d.wait_s)


def test_full_batch_and_prefix_that_fits():
    d = form_batch([4, 3, 2, 1], 0.0, 0.0, 1, cfg(mbs=8))
    assert d.take == 2  # 4 + 3 fits, + 2 would not


def test_waits_for_near_preferred_size_within_delay():
    d = form_batch([1] * 5, 10.0, 10.0002, 1, cfg(mbs=16, preferred=(8,), delay_s=0.001))
    assert d.take == 0 and 0 < d.wait_s <= 0.001
    d = form_batch([1] * 5, 10.0, 10.002, 1, cfg(mbs=16, preferred=(8,), delay_s=0.001))
    assert d.take == 5  # delay spent


def test_far_from_preferred_is_work_conserving():
    d = form_batch([1], 10.0, 10.0, 1, cfg(mbs=16, preferred=(8,), delay_s=0.01))
    assert d.take == 1


def test_preferred_size_reached_dispatches():
    d = form_batch([2, 2], 10.0, 10.0, 1, cfg(mbs=16, preferred=(4, 8), delay_s=0.01))
    assert d.take == 2


def test_non_batching_model_takes_one():
    d = form_batch([1, 1, 1], 0.0, 0.0, 2, cfg(mbs=0))
    assert d.take == 1


def test_an_idle_lane_waits_within_the_delay_for_answered_clients_expected_back():
    d = form_batch([1], 10.0, 10.0001, 1, cfg(mbs=8, delay_s=0.0005), returning=3)
    assert d.take == 0 and d.wait_s == pytest.approx(0.0004)
    d = form_batch([1, 1], 10.0, 10.0006, 1, cfg(mbs=8, delay_s=0.0005), returning=2)
    assert d.take == 2  # the delay is spent: what came is taken
    d = form_batch([1] * 8, 10.0, 10.0, 1, cfg(mbs=8, delay_s=0.0005), returning=3)
    assert d.take == 8  # full
    d = form_batch([1, 1], 10.0, 10.0, 1, cfg(mbs=8, preferred=(2,), delay_s=0.0005), returning=3)
    assert d.take == 2  # a preferred size
    assert form_batch([1], 10.0, 10.0, 1, cfg(mbs=8, delay_s=0.0), returning=3).take == 1  # no delay: no wait
    assert form_batch([1], 10.0, 10.0, 1, cfg(mbs=8, delay_s=0.0005), returning=0).take == 1


def test_requests_that_waited_behind_a_busy_lane_wait_for_its_answered_clients_within_the_delay_after_the_answer():
    """Two queued while the lane ran two others: once it answers, they are held for those clients up to the delay
    counted from the answer, not from their own arrival (else a few clients settle into alternating halves)."""
    d = form_batch([1, 1], 10.0, 10.0051, 1, cfg(mbs=8, delay_s=0.0005), returning=2, answered_s=10.005)
    assert d.take == 0 and d.wait_s == pytest.approx(0.0004)
    d = form_batch([1, 1], 10.0, 10.0056, 1, cfg(mbs=8, delay_s=0.0005), returning=2, answered_s=10.005)
    assert d.take == 2  # the delay after the answer is spent
    d = form_batch([1, 1], 10.0, 10.0051, 1, cfg(mbs=8, delay_s=0.0005), returning=0, answered_s=10.005)
    assert d.take == 2  # nobody expected: work-conserving, as before
    d = form_batch([1] * 8, 10.0, 10.0051, 1, cfg(mbs=8, delay_s=0.0005), returning=2, answered_s=10.005)
    assert d.take == 8  # full
