"""LaunchChoice: which batches fit a launch, and when a model's batches are launched (issue #17)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from gt_serve.core.launch_choice import _PROBE_EVERY, _SETTLE, MAX_BATCH_BYTES, ROW_NS, LaunchChoice


def batch(rows_per_request: int, requests: int, row_bytes: int = 1024):
    feeds = {"x": np.zeros((rows_per_request, row_bytes // 4), np.float32)}
    entries = [SimpleNamespace(feeds=feeds, batch_size=rows_per_request) for _ in range(requests)]
    return SimpleNamespace(entries=entries, size=rows_per_request * requests)


def lane_runs(choice: LaunchChoice, n: int, per_row_ns: int, rows: int = 16) -> None:
    for _ in range(n):
        choice.ran(batch(1, rows), False, per_row_ns * rows)


def test_a_batch_fits_with_several_requests_and_few_bytes():
    choice = LaunchChoice()
    assert not choice.fits(batch(4, 1))  # one request: inline or on the lane, its error its own at once
    assert choice.fits(batch(1, 2))
    rows = MAX_BATCH_BYTES // 1024
    assert choice.fits(batch(1, rows))
    assert not choice.fits(batch(1, rows + 1))  # one row more than 512 KiB to pack on the loop
    assert not choice.fits(batch(2, rows // 2 + 1))  # rows counted, not requests


def test_a_batch_with_bytes_inputs_never_fits():
    texts = np.array([[b"x" * 100_000]], dtype=object)  # nbytes: 8 (a pointer), its string 100 kB
    entries = [SimpleNamespace(feeds={"t": texts, "x": np.zeros((1, 4), np.float32)}, batch_size=1) for _ in range(4)]
    assert not LaunchChoice(always=True).fits(SimpleNamespace(entries=entries, size=4))


def test_a_model_launches_once_its_fastest_lane_run_is_short_enough():
    choice = LaunchChoice()
    assert not choice.launching  # a model starts on its lane
    lane_runs(choice, _SETTLE - 1, ROW_NS // 2)
    assert not choice.launching  # not timed often enough yet
    lane_runs(choice, 1, ROW_NS * 3)  # a slow run (it waited for the GIL) does not hide the fast ones
    assert choice.launching


def test_a_compute_bound_model_stays_on_its_lane():
    choice = LaunchChoice()
    lane_runs(choice, 5 * _SETTLE, ROW_NS * 7)  # convnet: ~690 µs a row
    assert not choice.launching


def test_small_batches_are_not_timed():
    choice = LaunchChoice()
    lane_runs(choice, 5 * _SETTLE, ROW_NS // 10, rows=4)  # a run's fixed cost would dominate their time a row
    assert not choice.launching
    lane_runs(choice, _SETTLE, ROW_NS // 2, rows=8)
    assert choice.launching


def test_a_model_whose_batches_cannot_reach_8_rows_is_timed_at_its_max_batch_size():
    """A model without config.pbtxt gets Triton's max_batch_size of 4: its batches never reach 8 rows, and were never
    launched (at 8-64 clients through the lane thread 0.79-0.87x the inf/s, issue #17)."""
    choice = LaunchChoice(max_batch_size=4)
    lane_runs(choice, 5 * _SETTLE, ROW_NS // 10, rows=3)  # under its max: fixed costs still dominate
    assert not choice.launching
    lane_runs(choice, _SETTLE, ROW_NS // 2, rows=4)
    assert choice.launching
    for max_batch_size in (0, 1, 8, 32):  # no batches of several rows, or batches that reach 8: 8 as before
        assert LaunchChoice(max_batch_size=max_batch_size).min_rows == 8


def test_the_lane_is_timed_again_after_a_run_of_launched_batches():
    choice = LaunchChoice()
    lane_runs(choice, _SETTLE, ROW_NS // 2)
    for _ in range(_PROBE_EVERY - 1):
        choice.ran(batch(1, 16), True, 10**9)  # a launched run's time says nothing: not timed
    assert choice.launching
    choice.ran(batch(1, 16), True, 1)
    assert not choice.launching  # the probe: lane runs again
    choice.ran(batch(1, 16), True, 1)  # one launched before the switch, back now: ignored
    assert not choice.launching
    lane_runs(choice, _SETTLE, ROW_NS * 2)  # the model has become slower (another model's load, say)
    assert not choice.launching
    lane_runs(choice, _SETTLE, ROW_NS // 2)  # and faster again: the fastest run since the switch decides
    assert choice.launching


def test_always_launches_whatever_the_times():
    choice = LaunchChoice(always=True)
    assert choice.launching
    lane_runs(choice, 3 * _SETTLE, ROW_NS * 10)
    for _ in range(2 * _PROBE_EVERY):
        choice.ran(batch(1, 16), True, 10**9)
    assert choice.launching
    assert not choice.fits(batch(1, 1)) and not choice.fits(batch(1, MAX_BATCH_BYTES // 1024 + 1))
