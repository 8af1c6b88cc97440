"""EnsembleGroups (core/ensemble_groups.py): an ensemble's requests that come together run its steps together.

The ensemble's run is a coroutine of our own here (it doubles each input, or fails on a negative value), so that what
each run was given can be read back; the data plane's integration is tested with a real server in
tests/integration/test_ensemble.py."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gt_serve.core.ensemble_groups import EnsembleGroups, groupable
from gt_serve.errors import InvalidArgument, QueueFull
from gt_serve.types import InferRequest


class Runs:
    """The ensemble's run: records each call's rows, holds it until `release` is set, doubles X; a negative value
    fails the run with InvalidArgument (as a step model's error would), and every run with QueueFull once `full`."""

    def __init__(self) -> None:
        self.calls: list[np.ndarray] = []
        self.release = asyncio.Event()
        self.called = asyncio.Condition()
        self.full = False

    async def __call__(self, request: InferRequest, feeds: dict) -> dict:
        self.calls.append(feeds["X"].copy())
        async with self.called:
            self.called.notify_all()
        await self.release.wait()
        if self.full:
            raise QueueFull("model 'step': queue is full")
        if (feeds["X"] < 0).any():
            raise InvalidArgument("model 'step': a negative value")
        return {"Y": feeds["X"] * 2}


def _request(**kw) -> InferRequest:
    return InferRequest("ens", **kw)


def _rows(*values: float) -> dict:
    return {"X": np.array([[v] for v in values], np.float32)}


async def _started(runs: Runs, calls: int) -> None:
    """Wait (at most 5 s) until the ensemble's run has been called `calls` times."""
    async with runs.called:
        await asyncio.wait_for(runs.called.wait_for(lambda: len(runs.calls) >= calls), 5)


async def _one_running(max_rows: int = 8) -> tuple[Runs, EnsembleGroups, asyncio.Future]:
    """An ensemble that groups from its second request in flight, with one request running (held by `release`)."""
    runs = Runs()
    groups = EnsembleGroups(runs, max_rows=max_rows, group_from=1)
    busy = asyncio.ensure_future(groups.run(_request(), _rows(0), 1))
    await _started(runs, 1)
    return runs, groups, busy


def test_requests_run_alone_until_enough_are_in_flight_then_together():
    async def main():
        runs = Runs()
        groups = EnsembleGroups(runs, max_rows=3)  # a group holds 3 rows: the fourth request in flight is grouped
        alone = [asyncio.ensure_future(groups.run(_request(), _rows(v), 1)) for v in (1, 2, 3)]
        await _started(runs, 3)  # three in flight: each runs alone, at once
        later = [asyncio.ensure_future(groups.run(_request(), _rows(v), 1)) for v in (4, 5)]
        await _started(runs, 4)
        runs.release.set()
        results = await asyncio.gather(*alone, *later)
        return runs.calls, results, groups.in_flight

    calls, results, running = asyncio.run(main())
    assert [c.ravel().tolist() for c in calls] == [[1], [2], [3], [4, 5]]
    assert [r["Y"].ravel().tolist() for r in results] == [[2], [4], [6], [8], [10]] and running == 0


def test_a_request_alone_runs_at_once_and_the_next_ones_run_together():
    async def main():
        runs = Runs()
        groups = EnsembleGroups(runs, max_rows=8, group_from=1)
        first = asyncio.ensure_future(groups.run(_request(), _rows(1), 1))
        await _started(runs, 1)  # alone, the moment it came
        later = [asyncio.ensure_future(groups.run(_request(), _rows(v), 1)) for v in (2, 3, 4)]
        await _started(runs, 2)
        runs.release.set()
        results = await asyncio.gather(first, *later)
        return runs.calls, results

    calls, results = asyncio.run(main())
    assert [c.ravel().tolist() for c in calls] == [[1], [2, 3, 4]]  # the three that came while one ran: one run
    assert [r["Y"].ravel().tolist() for r in results] == [[2], [4], [6], [8]]  # each its own rows


def test_groups_keep_to_one_shape_and_their_rows_limit():
    async def main():
        runs, groups, busy = await _one_running(4)
        wide = {"X": np.array([[5.0, 6.0]], np.float32)}
        tasks = [asyncio.ensure_future(groups.run(_request(), _rows(1, 2, 3), 3)),
                 asyncio.ensure_future(groups.run(_request(), _rows(4, 5), 2)),  # 5 rows: a new group
                 asyncio.ensure_future(groups.run(_request(), wide, 1)),  # another shape
                 asyncio.ensure_future(groups.run(_request(), _rows(6, 7), 2))]
        await _started(runs, 4)
        runs.release.set()
        results = await asyncio.gather(busy, *tasks)
        return runs.calls, results

    calls, results = asyncio.run(main())
    assert sorted(c.ravel().tolist() for c in calls) == [[0], [1, 2, 3], [4, 5, 6, 7], [5, 6]]
    assert [r["Y"].ravel().tolist() for r in results] == [[0], [2, 4, 6], [8, 10], [10, 12], [12, 14]]


def test_a_failed_group_runs_again_request_by_request_and_only_the_bad_one_fails():
    async def main():
        runs, groups, busy = await _one_running()
        tasks = [asyncio.ensure_future(groups.run(_request(), _rows(v), 1)) for v in (1, -1, 3)]
        await _started(runs, 2)
        runs.release.set()
        results = await asyncio.gather(busy, *tasks, return_exceptions=True)
        return runs.calls, results

    calls, results = asyncio.run(main())
    assert [c.ravel().tolist() for c in calls] == [[0], [1, -1, 3], [1], [-1], [3]]
    assert results[1]["Y"].ravel().tolist() == [2] and results[3]["Y"].ravel().tolist() == [6]
    assert isinstance(results[2], InvalidArgument) and "negative" in str(results[2])


def test_a_request_whose_client_left_does_not_stop_its_group():
    async def main():
        runs, groups, busy = await _one_running()
        gone = asyncio.ensure_future(groups.run(_request(), _rows(1), 1))
        stays = asyncio.ensure_future(groups.run(_request(), _rows(2), 1))
        await _started(runs, 2)
        gone.cancel()
        runs.release.set()
        return await asyncio.gather(busy, stays), gone.cancelled(), groups.in_flight

    (first, kept), cancelled, running = asyncio.run(main())
    assert cancelled and kept["Y"].ravel().tolist() == [4] and first["Y"].ravel().tolist() == [0]
    assert running == 0


def test_only_requests_without_parameters_of_their_own_are_grouped():
    assert groupable(_request()) and groupable(_request(parameters={"binary_data_output": True}))
    assert not groupable(_request(parameters={"timeout": 1000}))
    assert not groupable(_request(parameters={"my_flag": "x"}))


@pytest.mark.parametrize("priority", [1, 2])
def test_requests_of_another_priority_run_apart(priority):
    async def main():
        runs, groups, busy = await _one_running()
        a = asyncio.ensure_future(groups.run(_request(priority=priority), _rows(1), 1))
        b = asyncio.ensure_future(groups.run(_request(priority=3), _rows(2), 1))
        c = asyncio.ensure_future(groups.run(_request(priority=priority), _rows(3), 1))
        await _started(runs, 3)
        runs.release.set()
        await asyncio.gather(busy, a, b, c)
        return runs.calls

    assert sorted(c.ravel().tolist() for c in asyncio.run(main())) == [[0], [1, 3], [2]]


def test_a_group_that_meets_the_servers_state_is_not_run_again():
    async def main():
        runs, groups, busy = await _one_running()
        tasks = [asyncio.ensure_future(groups.run(_request(), _rows(v), 1)) for v in (1, 2)]
        await _started(runs, 2)
        runs.full = True
        runs.release.set()
        return runs.calls, await asyncio.gather(busy, *tasks, return_exceptions=True)

    calls, results = asyncio.run(main())
    assert [c.ravel().tolist() for c in calls] == [[0], [1, 2]]  # no run request by request after the group's
    assert all(isinstance(r, QueueFull) for r in results)


def test_a_group_whose_run_is_cancelled_cancels_its_requests():
    async def main():
        runs, groups, busy = await _one_running()
        tasks = [asyncio.ensure_future(groups.run(_request(), _rows(v), 1)) for v in (1, 2)]
        await _started(runs, 2)
        for task in list(groups._tasks):  # the server stops: the group's own task is cancelled
            task.cancel()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)  # none left waiting
        runs.release.set()
        return results, await busy, groups.in_flight

    results, first, in_flight = asyncio.run(main())
    assert all(isinstance(r, asyncio.CancelledError) for r in results)
    assert first["Y"].ravel().tolist() == [0] and in_flight == 0


def test_requests_group_by_their_inputs_names_and_shapes_in_any_order():
    """An optional input left out, or the inputs given in another order: grouped only with requests whose inputs can
    be concatenated name by name."""
    async def main():
        runs, groups, busy = await _one_running()
        w = np.zeros((1, 2), np.float32)
        tasks = [asyncio.ensure_future(groups.run(_request(), {"X": _rows(1)["X"]}, 1)),
                 asyncio.ensure_future(groups.run(_request(), {"X": _rows(2)["X"], "W": w}, 1)),
                 asyncio.ensure_future(groups.run(_request(), {"W": w, "X": _rows(3)["X"]}, 1)),
                 asyncio.ensure_future(groups.run(_request(), {"X": _rows(4)["X"], "Z": w}, 1))]
        await _started(runs, 4)
        runs.release.set()
        return runs.calls, await asyncio.gather(busy, *tasks)

    calls, results = asyncio.run(main())
    assert sorted(c.ravel().tolist() for c in calls) == [[0], [1], [2, 3], [4]]
    assert [r["Y"].ravel().tolist() for r in results] == [[0], [2], [4], [6], [8]]


def test_a_caller_may_run_a_lone_request_itself_counted_in_flight():
    async def main():
        runs = Runs()
        groups = EnsembleGroups(runs, max_rows=2)
        seen = []
        with groups:  # the data plane's way for a request that runs alone
            seen.append(groups.alone())
            with groups:
                seen.append((groups.alone(), groups.in_flight))
                grouped = asyncio.ensure_future(groups.run(_request(), _rows(5), 1))  # the third: grouped
                await _started(runs, 1)
                seen.append(groups.in_flight)
        runs.release.set()
        return seen, await grouped, groups.in_flight

    seen, grouped, in_flight = asyncio.run(main())
    assert seen == [True, (False, 2), 3] and grouped["Y"].ravel().tolist() == [10] and in_flight == 0
