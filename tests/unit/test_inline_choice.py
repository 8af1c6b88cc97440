"""InlineChoice on its own, with a clock the test sets: which way a model's small batches go, from the CPU per row
each way's windows cost."""
from __future__ import annotations

from gt_serve.core.inline_choice import _MEASURE, _SETTLE, _STAY, _STAY_MAX, WINDOW, InlineChoice


class Clock:
    def __init__(self):
        self.ns = 0

    def __call__(self):
        return self.ns


def window(choice, clock, cost_per_row, rows=2):
    """One window of small batches of `rows` rows, each row costing `cost_per_row` ns of the process's CPU; the way
    the window's batches went."""
    way = choice.inline
    for _ in range(WINDOW):
        assert choice.inline == way  # the way changes only when a window closes
        clock.ns += rows * cost_per_row
        choice.counted(rows, True)
    return way


def ways(choice, clock, inline_cost, lane_cost, n):
    return "".join("I" if window(choice, clock, inline_cost if choice.inline else lane_cost) else "L"
                   for _ in range(n))


PROBE = _SETTLE + _MEASURE


def stretches(sequence):
    """"IIIILLLII" -> [("I", 4), ("L", 3), ("I", 2)]."""
    out = []
    for way in sequence:
        if out and out[-1][0] == way:
            out[-1] = (way, out[-1][1] + 1)
        else:
            out.append((way, 1))
    return out


def test_the_loop_first_then_the_lane_measured_and_the_cheaper_way_runs():
    clock = Clock()
    choice = InlineChoice(clock)
    assert ways(choice, clock, 100, 150, _STAY + PROBE + 1) == "I" * _STAY + "L" * PROBE + "I"
    ways(choice, clock, 100, 50, 2 * _STAY - 1)  # the loop's next stretch is twice as long
    assert ways(choice, clock, 100, 50, PROBE + 5) == "L" * (PROBE + 5)  # the lane cheaper now: it stays
    assert choice.inline is False


def test_the_other_way_is_measured_less_often_each_time_it_loses_and_as_often_again_once_it_wins():
    clock = Clock()
    choice = InlineChoice(clock)
    runs = stretches(ways(choice, clock, 100, 150, 1200))
    assert runs[:8] == [("I", 16), ("L", PROBE), ("I", 32), ("L", PROBE), ("I", 64), ("L", PROBE), ("I", 128),
                        ("L", PROBE)]
    assert runs[8][1] == _STAY_MAX == 256 and runs[10][1] == 256
    while choice.inline:
        window(choice, clock, 100)
    ways(choice, clock, 100, 50, PROBE)  # the lane wins a measure: chosen, stretches of 16 again
    assert choice.inline is False and choice._stay == _STAY


def test_a_window_just_after_a_switch_is_not_measured():
    clock = Clock()
    choice = InlineChoice(clock)
    ways(choice, clock, 100, 0, _STAY)
    window(choice, clock, 10)  # the lane's first window, cheap as the clients still follow the loop's timing
    ways(choice, clock, 100, 120, _MEASURE)  # its measured ones are dearer: the loop again
    assert choice.inline is True


def test_the_way_just_measured_must_be_cheaper_by_the_margin():
    clock = Clock()
    choice = InlineChoice(clock)
    ways(choice, clock, 100, 98, _STAY + PROBE)  # the lane 2 % cheaper: within the margin, the loop stays
    assert choice.inline is True
    ways(choice, clock, 100, 90, 2 * _STAY + PROBE)  # 10 % cheaper: the lane runs
    assert choice.inline is False


def test_batches_it_does_not_decide_count_their_rows_but_close_no_window():
    clock = Clock()
    choice = InlineChoice(clock)
    for _ in range(10 * WINDOW):
        clock.ns += 1_000
        choice.counted(32, False)
    assert choice.inline is True and choice._windows == 0
    fresh = InlineChoice(clock)
    ways(fresh, clock, 100, 100, _STAY + _SETTLE)
    for _ in range(_MEASURE):
        fresh.counted(2 * WINDOW, False)  # the lane's windows also ran big batches, at no more CPU
        window(fresh, clock, 100)
    assert fresh.inline is False  # 50 a row against 100
