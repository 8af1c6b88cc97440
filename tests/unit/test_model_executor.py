"""ModelExecutor on its own: a fake lane that records what it is handed (the test runs the job and
sends the reply, as the lane thread and the loop would), a recording scheduler, a fake runner, and
the real Batcher, BatchCompletion and ModelStats. Every step is driven by the test: no threads."""
from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import numpy as np
import pytest

from gt_serve.core.answer_order import AnswerOrder
from gt_serve.core.batch_completion import BatchCompletion
from gt_serve.core.batch_policy import BatchConfig
from gt_serve.core.batcher import Batcher, QueuePolicy
from gt_serve.core.launch_choice import _SETTLE
from gt_serve.core.model_executor import ModelExecutor
from gt_serve.core.statistics import ModelStats
from gt_serve.errors import Internal, Unavailable

SPEC = SimpleNamespace(input_order=["x"], output_order=["y"])
WAIT_S = 10.0


class FakeLane:
    """Records submitted jobs; `finish_next` runs the oldest one and replies like Lane does."""

    def __init__(self, lane_id="cpu.0", device="cpu"):
        self.lane_id, self.device = lane_id, device
        self.busy = False
        self.submitted = []
        self.ran_here = []
        self.launched = []
        self.finished_ns = []
        self.ran_now = 0

    on_gpu = False

    def submit(self, job, reply, tag):
        self.busy = True
        self.submitted.append((job, reply, tag))

    def run_here(self, job, reply, tag):
        """As Lane.run_here: the job runs now, on the caller's thread; recorded, replied to by `finish_next`."""
        self.busy = True
        self.ran_here.append(tag)
        self.submitted.append((lambda result=job(): result, reply, tag))

    def launch(self, job, reply, tag):
        """As Lane.launch: recorded; the job runs and is replied to by `finish_next`, as from onnxruntime's pool."""
        self.busy = True
        self.launched.append(tag)
        self.submitted.append((job, reply, tag))

    def run_now(self, job):
        """As Lane.run_now: the job runs now, on the caller's thread, and the lane is free again when it returns."""
        self.ran_now += 1
        try:
            return job(), None, 1_500
        except Exception as e:  # noqa: BLE001 - returned as Lane._timed returns it
            return None, e, 1_500

    def finish_next(self, elapsed_ns=1_000, cpu_ns=None):
        """As the lane's reply: a job of the lane thread with its CPU time (`cpu_ns`, else the whole `elapsed_ns`),
        one run here or launched with none."""
        job, reply, tag = self.submitted.pop(0)
        try:
            result, exc = job(), None
        except Exception as e:  # noqa: BLE001 - handed to the reply as the lane does
            result, exc = None, e
        self.busy = False
        self.finished_ns.append(elapsed_ns)
        on_thread = not any(tag is other for other in (*self.ran_here, *self.launched))
        reply(tag, self, result, exc, elapsed_ns, (elapsed_ns if cpu_ns is None else cpu_ns) if on_thread else None)


class RecordingScheduler:
    def __init__(self):
        self.notified = 0
        self.finished_calls = []
        self.unregistered = []

    def notify(self):
        self.notified += 1

    def finished(self, executor, elapsed_ns, lane=None):
        self.finished_calls.append((executor.name, elapsed_ns))

    def unregister(self, executor):
        self.unregistered.append(executor.name)

    due = False  # a pump is scheduled: lone_lane gives nothing, as StreamScheduler.lone_lane

    def lone_lane(self, executor):
        idle = [lane for lane in executor.lanes if not lane.busy]
        return None if self.due or not idle else idle[0]


class Runner:
    """Doubles its input; a negative value fails that request alone, "boom" the whole run; counts closes."""

    def __init__(self, launchable=True):
        self.closed = 0
        self.runs = []
        self.launchable = launchable

    def job(self, runner, batch, spec, lane):
        def run():
            rows = [e.feeds["x"] for e in batch.entries]
            self.runs.append(rows)
            if "boom" in rows:
                raise RuntimeError("session exploded")
            per_request = [ValueError("negative") if x < 0 else [2 * x] for x in rows]
            return per_request, (10, 20, 30)
        if self.launchable:  # as a BatchJob whose runner can start a run in onnxruntime's pool
            run.launchable = True
        return run

    def close(self):
        self.closed += 1


def build(energy=None, inline_max_ns=0, extra_lanes=(), max_batch_size=8, launch="never", launchable=True,
          delay_s=0.0, tiny=False, ordered=False):
    """`ordered`: the config's preserve_ordering (an AnswerOrder, as LocalModelHost.open gives one)."""
    lane, sched, runner = FakeLane(), RecordingScheduler(), Runner(launchable)
    stats = ModelStats("m", "1")
    batcher = Batcher("m", BatchConfig(max_batch_size, (), delay_s, ordered), QueuePolicy(), wake=sched.notify)
    runners = {lane: runner, **{extra: runner for extra in extra_lanes}}
    completion = BatchCompletion("m", stats, energy, AnswerOrder() if ordered else None)
    executor = ModelExecutor(batcher, runners, runner.job, completion, sched, SPEC,
                             version="1", inline_max_ns=inline_max_ns, launch=launch, tiny=tiny)
    return executor, lane, sched, runner, stats


def dispatch_all(executor, lane):
    decision, head = executor.batcher.decide(time.monotonic_ns(), 1)
    assert decision.take, decision
    executor.dispatch(head[:decision.take], lane)


def test_a_batch_runs_on_the_lane_and_resolves_every_future():
    async def main():
        charged = []

        def energy(model, device, batch_size, latency_s):
            charged.append((model, device, batch_size, latency_s))
            return 0.5

        executor, lane, sched, runner, stats = build(energy)
        futures = [executor.submit({"x": x}, 1, ()) for x in (1, 2, 3)]
        assert sched.notified == 3 and executor.pending == 3
        dispatch_all(executor, lane)
        assert lane.busy and executor.in_flight == 1 and executor.pending == 0
        lane.finish_next(elapsed_ns=5_000)
        assert [await asyncio.wait_for(f, WAIT_S) for f in futures] == [[2], [4], [6]]
        assert runner.runs == [[1, 2, 3]]  # one batch
        assert executor.in_flight == 0 and sched.finished_calls == [("m", 5_000)]
        assert charged == [("m", "cpu", 3, 20 / 1e9)]
        assert stats.energy_j == pytest.approx(1.5)
        assert stats.inference_count == 3 and stats.execution_count == 1
    asyncio.run(main())


def test_a_failed_job_fails_its_requests_with_a_typed_error_and_the_next_batch_runs():
    async def main():
        executor, lane, sched, _, _ = build()
        first = executor.submit({"x": "boom"}, 1, ())
        dispatch_all(executor, lane)
        lane.finish_next()
        with pytest.raises(Internal, match=r"model 'm': inference failed on lane cpu.0: RuntimeError: session exploded"):
            await asyncio.wait_for(first, WAIT_S)
        second = executor.submit({"x": 4}, 1, ())
        dispatch_all(executor, lane)
        lane.finish_next()
        assert await asyncio.wait_for(second, WAIT_S) == [8]
        assert len(sched.finished_calls) == 2 and executor.in_flight == 0
    asyncio.run(main())


def test_a_request_that_fails_alone_fails_alone():
    async def main():
        executor, lane, _, _, stats = build()
        good, bad = executor.submit({"x": 1}, 1, ()), executor.submit({"x": -1}, 1, ())
        dispatch_all(executor, lane)
        lane.finish_next()
        assert await asyncio.wait_for(good, WAIT_S) == [2]
        with pytest.raises(Internal, match="ValueError: negative"):
            await asyncio.wait_for(bad, WAIT_S)
        assert stats.inference_count == 1  # the failed request is not counted as served
    asyncio.run(main())


def test_close_drains_running_work_then_releases_the_sessions():
    async def main():
        executor, lane, sched, runner, _ = build()
        running = executor.submit({"x": 3}, 1, ())
        dispatch_all(executor, lane)
        closing = asyncio.ensure_future(executor.close(WAIT_S))
        await one_loop_turn()  # the close task has taken its first step: refusing, waiting for the drain
        assert executor.batcher.closed is not None
        with pytest.raises(Unavailable, match="unloading"):
            executor.submit({"x": 1}, 1, ())
        assert not closing.done() and runner.closed == 0
        lane.finish_next()
        await asyncio.wait_for(closing, WAIT_S)
        assert await running == [6]
        assert runner.closed == 1 and sched.unregistered == ["m"]
    asyncio.run(main())


def test_close_after_the_drain_timeout_fails_the_queue_and_releases_when_the_batch_returns():
    async def main():
        executor, lane, sched, runner, _ = build()
        running = executor.submit({"x": 3}, 1, ())
        dispatch_all(executor, lane)
        queued = executor.submit({"x": 5}, 1, ())
        await asyncio.wait_for(executor.close(0.0), WAIT_S)
        with pytest.raises(Unavailable, match="unloaded before the request ran"):
            await queued
        assert sched.unregistered == ["m"] and runner.closed == 0  # a batch still runs on its session
        lane.finish_next()
        assert await asyncio.wait_for(running, WAIT_S) == [6]
        assert runner.closed == 1
        executor.release()  # idempotent
        assert runner.closed == 1
    asyncio.run(main())


def test_a_lone_row_runs_on_the_loop_thread_once_its_shape_has_run_faster_than_the_limit():
    async def main():
        executor, lane, _, runner, _ = build(inline_max_ns=100_000)
        first = executor.submit({"x": 1}, 1, ((4,),))
        dispatch_all(executor, lane)
        assert lane.ran_here == [] and runner.runs == []  # run time unknown: the lane thread's
        lane.finish_next(elapsed_ns=40_000)
        second = executor.submit({"x": 2}, 1, ((4,),))
        dispatch_all(executor, lane)
        assert len(lane.ran_here) == 1 and runner.runs == [[1], [2]]  # ran before dispatch returned
        lane.finish_next(elapsed_ns=40_000)
        assert [await asyncio.wait_for(f, WAIT_S) for f in (first, second)] == [[2], [4]]
        other_shape = executor.submit({"x": 3}, 1, ((9,),))  # a longer row has not been timed
        dispatch_all(executor, lane)
        assert len(lane.ran_here) == 1
        lane.finish_next(elapsed_ns=40_000)
        assert await asyncio.wait_for(other_shape, WAIT_S) == [6]
    asyncio.run(main())


def test_a_small_batch_runs_on_the_loop_thread_while_its_rows_are_expected_to_run_faster_than_the_limit():
    """Several rows: one row's time times half the rows (rounded up) until such a batch has run, then the average
    of those; a lane run counts its thread's CPU time, not its wall time, and only lowers an average; more than
    INLINE_ROWS rows never run inline, nor small batches while InlineChoice has found the lane cheaper."""
    async def main():
        executor, lane, _, runner, _ = build(inline_max_ns=100_000, max_batch_size=16)

        def batch_of(n, elapsed_ns, cpu_ns=None):
            futures = [executor.submit({"x": x}, 1, ((4,),)) for x in range(1, n + 1)]
            dispatch_all(executor, lane)
            inline = len(lane.ran_here)
            lane.finish_next(elapsed_ns=elapsed_ns, cpu_ns=cpu_ns)
            return inline, futures

        batch_of(1, 30_000)  # the lane thread's first one-row run: 30 us
        assert batch_of(2, 60_000)[0] == 1  # guessed 30 us: inline, and now its own average, 60 us
        assert executor._rows_ns[(((4,),), 2)] == 60_000
        assert batch_of(3, 50_000)[0] == 2  # guessed 2 x 30 = 60 us: inline
        assert batch_of(4, 50_000)[0] == 3  # guessed 60 us
        assert batch_of(7, 300_000, cpu_ns=50_000)[0] == 3  # guessed 4 x 30 = 120 us: on the lane, whose thread's
        assert executor._rows_ns[(((4,),), 7)] == 50_000  # CPU time sets the average, not the wall time and its waits
        assert batch_of(2, 200_000)[0] == 4  # inline; the average rises to 95 us
        inline, futures = batch_of(2, 300_000)  # 95 < 100: inline again; now 146.25 us
        assert inline == 5 and [await asyncio.wait_for(f, WAIT_S) for f in futures] == [[2], [4]]
        assert batch_of(2, 500_000)[0] == 5  # on the lane, and slower: the average stays
        assert executor._rows_ns[(((4,),), 2)] == 146_250
        batch_of(2, 10_000)  # a faster lane run lowers it by a quarter of the difference: 112.19 us
        assert batch_of(2, 10_000)[0] == 5 and executor._rows_ns[(((4,),), 2)] == 86_640
        assert batch_of(2, 10_000)[0] == 6  # inline again
        executor._lone_ns[((4,),)] = 1_000
        assert batch_of(7, 1_000)[0] == 7 and batch_of(8, 1_000)[0] == 7  # 7 rows may, 8 never (LaunchChoice's)
        assert runner.runs[-1] == list(range(1, 9))
        executor._inline_choice.inline = False  # InlineChoice measured the lane cheaper for small batches
        assert batch_of(2, 1_000)[0] == 7 and batch_of(1, 1_000)[0] == 8  # a lone row stays on the loop
    asyncio.run(main())


def test_a_lone_run_on_the_lane_thread_only_lowers_the_shapes_run_time():
    """A lane run also times the hand-off (cold caches on another core): a shape near the limit must not stay on the
    lane because it runs slower there. Inline runs move the average both ways."""
    async def main():
        executor, lane, _, _, _ = build(inline_max_ns=100_000)

        def lone(elapsed_ns):
            executor.submit({"x": 1}, 1, ((4,),))
            dispatch_all(executor, lane)
            inline = len(lane.ran_here)
            lane.finish_next(elapsed_ns=elapsed_ns)
            return inline

        lone(90_000)  # the first run of a shape: the lane thread's, and its time is the average
        ran = lone(200_000)  # inline (90 us < 100 us), slow: the average rises to 117.5 us
        assert ran == 1 and executor._lone_ns[((4,),)] == 117_500
        assert lone(300_000) == 1  # on the lane now, and slower still: the average stays
        assert executor._lone_ns[((4,),)] == 117_500
        lone(37_500)  # a faster lane run lowers it (by a quarter of the difference): 97.5 us
        assert executor._lone_ns[((4,),)] == 97_500
        assert lone(50_000) == 2  # inline again
    asyncio.run(main())


def test_a_slow_shape_an_idle_lane_for_the_queue_or_a_gpu_lane_keeps_the_lane_thread():
    async def main():
        executor, lane, _, _, _ = build(inline_max_ns=100_000)
        executor.submit({"x": 1}, 1, ((4,),))
        dispatch_all(executor, lane)
        lane.finish_next(elapsed_ns=400_000)  # slower than the limit
        executor.submit({"x": 1}, 1, ((4,),))
        dispatch_all(executor, lane)
        assert lane.ran_here == []
        lane.finish_next(elapsed_ns=400_000)

        other = FakeLane("cpu.1")
        fast, fast_lane, _, _, _ = build(inline_max_ns=100_000, extra_lanes=[other], max_batch_size=0)
        fast.submit({"x": 1}, 1, ((4,),))
        dispatch_all(fast, fast_lane)
        fast_lane.finish_next(elapsed_ns=1_000)
        lone, behind = fast.submit({"x": 1}, 1, ((4,),)), fast.submit({"x": 2}, 1, ((4,),))
        dispatch_all(fast, fast_lane)  # a model that does not batch: one taken, one queued behind it
        assert fast_lane.ran_here == []  # the other lane is idle: this one computes while the loop hands it the next
        dispatch_all(fast, other)
        fast_lane.finish_next()
        other.finish_next()
        fast_lane.on_gpu = True
        fast.submit({"x": 3}, 1, ((4,),))
        dispatch_all(fast, fast_lane)
        assert fast_lane.ran_here == []  # a GPU lane's stream is the lane thread's
        fast_lane.finish_next()
        assert [await asyncio.wait_for(f, WAIT_S) for f in (lone, behind)] == [[2], [4]]

        off, off_lane, _, _, _ = build()  # inline_max_ns 0: never
        for _ in range(2):
            off.submit({"x": 1}, 1, ((4,),))
            dispatch_all(off, off_lane)
            off_lane.finish_next(elapsed_ns=1)
        assert off_lane.ran_here == []
    asyncio.run(main())


def test_a_lone_row_with_a_queue_behind_it_runs_on_the_loop_when_no_other_lane_is_idle():
    """A model without dynamic batching under load: every batch is one row and more wait; handing each to the
    lane thread and back cost more than the run (issue #17), and the waiting ones could not have joined it."""
    async def main():
        busy_other = FakeLane("cpu.1")
        executor, lane, _, runner, _ = build(inline_max_ns=100_000, extra_lanes=[busy_other], max_batch_size=0)
        executor.submit({"x": 1}, 1, ((4,),))
        dispatch_all(executor, lane)
        lane.finish_next(elapsed_ns=1_000)  # the shape is timed: fast
        busy_other.busy = True  # running something of its own
        futures = [executor.submit({"x": x}, 1, ((4,),)) for x in (2, 3, 4)]
        dispatch_all(executor, lane)
        assert lane.ran_here and runner.runs[-1] == [2] and executor.pending == 2
        lane.finish_next()
        for _ in range(2):
            dispatch_all(executor, lane)
            lane.finish_next()
        assert len(lane.ran_here) == 3
        assert [await asyncio.wait_for(f, WAIT_S) for f in futures] == [[4], [6], [8]]
    asyncio.run(main())


async def one_loop_turn():
    """Return after the callbacks already scheduled on the loop have run (call_soon is FIFO)."""
    loop = asyncio.get_running_loop()
    turn = loop.create_future()
    loop.call_soon(turn.set_result, None)
    await turn


def test_batches_of_several_requests_are_launched_once_the_lane_has_timed_them_fast():
    async def main():
        executor, lane, _, runner, _ = build(launch="auto", max_batch_size=16, inline_max_ns=100_000)

        def batch_of(values, elapsed_ns=8 * 10_000):  # one-row requests taken as one batch; 10 us a row
            futures = [executor.submit({"x": np.int64(x)}, 1, ()) for x in values]
            dispatch_all(executor, lane)
            lane.finish_next(elapsed_ns=elapsed_ns)
            return futures

        for _ in range(_SETTLE):
            batch_of(range(8))
        assert lane.launched == [] and len(runner.runs) == _SETTLE  # timed on the lane first
        futures = batch_of([1, 2, 3])
        assert len(lane.launched) == 1 and lane.launched[0].launch is True
        assert [await asyncio.wait_for(f, WAIT_S) for f in futures] == [[2], [4], [6]]
        lone = batch_of([4])  # one request: never launched (inline or on the lane); its shape runs fast
        assert len(lane.launched) == 1
        batch_of([7, 8])  # a small batch of a fast shape: launched, as the model's larger batches are (under load
        assert len(lane.launched) == 2 and lane.ran_here == []  # it is a straggler), not run on the loop
        lane.on_gpu = True
        batch_of([5, 6])  # a GPU lane's stream is its thread's
        assert len(lane.launched) == 2
        assert await asyncio.wait_for(lone[0], WAIT_S) == [8]
    asyncio.run(main())


def test_a_tiny_models_batches_of_any_size_run_on_the_loop_on_a_cpu_lane_with_inlining_on():
    """core/tiny_models.py told it tiny at load: no batch is handed to another thread (not launched, not queued for
    the lane thread), whatever its rows and whatever LaunchChoice would say; a GPU lane's stream stays its own, and
    `lanes.inline_max_us: 0` keeps every batch off the loop."""
    async def main():
        executor, lane, _, runner, _ = build(inline_max_ns=300_000, max_batch_size=32, launch="always", tiny=True)
        for rows in (1, 5, 20, 32):
            futures = [executor.submit({"x": np.int64(x)}, 1, ()) for x in range(rows)]
            dispatch_all(executor, lane)
            lane.finish_next()
            assert [await asyncio.wait_for(f, WAIT_S) for f in futures] == [[2 * x] for x in range(rows)]
        assert len(lane.ran_here) == 4 and lane.launched == []
        lane.on_gpu = True
        executor.submit({"x": np.int64(1)}, 1, ())
        executor.submit({"x": np.int64(2)}, 1, ())
        dispatch_all(executor, lane)
        assert len(lane.ran_here) == 4
        executor, lane, _, _, _ = build(inline_max_ns=0, max_batch_size=32, tiny=True)
        for x in range(12):
            executor.submit({"x": np.int64(x)}, 1, ())
        dispatch_all(executor, lane)
        assert lane.ran_here == []
    asyncio.run(main())


def test_a_model_with_a_max_batch_size_under_8_launches_its_full_batches_once_timed_fast():
    async def main():
        executor, lane, _, runner, _ = build(launch="auto", max_batch_size=4)
        for _ in range(_SETTLE):
            for x in range(4):
                executor.submit({"x": np.int64(x)}, 1, ())
            dispatch_all(executor, lane)
            lane.finish_next(elapsed_ns=4 * 10_000)
        assert lane.launched == [] and len(runner.runs) == _SETTLE
        futures = [executor.submit({"x": np.int64(x)}, 1, ()) for x in (1, 2, 3, 4)]
        dispatch_all(executor, lane)
        assert len(lane.launched) == 1
        lane.finish_next()
        assert [await asyncio.wait_for(f, WAIT_S) for f in futures] == [[2], [4], [6], [8]]
    asyncio.run(main())


def test_a_model_whose_batches_are_all_small_runs_them_on_the_loop_while_that_measures_cheaper_than_launching():
    """max_batch_size 4 (a model without config.pbtxt): once its batches launch, InlineChoice measures the loop
    against launching for them, where a fast shape's batch runs under the loop's limit (a tree ensemble's 4 rows)."""
    async def main():
        executor, lane, _, _, _ = build(launch="auto", max_batch_size=4, inline_max_ns=100_000)

        def batch_of(values, elapsed_ns=4 * 10_000):
            futures = [executor.submit({"x": np.int64(x)}, 1, ()) for x in values]
            dispatch_all(executor, lane)
            lane.finish_next(elapsed_ns=elapsed_ns)
            return futures

        executor._inline_choice.inline = False  # InlineChoice found the lane cheaper than the loop so far
        for _ in range(_SETTLE):
            batch_of(range(4))  # timed on the lane: 40 us for 4 rows
        assert executor._launch.launching and lane.ran_here == [] and lane.launched == []
        futures = batch_of([5, 6])  # launched now, not on the lane
        assert len(lane.launched) == 1 and lane.ran_here == []
        executor._inline_choice.inline = True  # InlineChoice, now against launching, measured the loop cheaper
        futures += batch_of([1, 2, 3, 4])
        assert len(lane.ran_here) == 1 and len(lane.launched) == 1
        assert [await asyncio.wait_for(f, WAIT_S) for f in futures] == [[10], [12], [2], [4], [6], [8]]
    asyncio.run(main())


def test_a_request_of_a_model_that_does_not_batch_is_launched_where_the_loop_would_run_it():
    """onnxruntime's pool computes it while the loop reads the next requests. A shape not yet timed, or one slower
    than the loop's limit, keeps the lane thread; `launch: never` keeps the loop's run."""
    async def main():
        executor, lane, _, runner, _ = build(launch="auto", max_batch_size=0, inline_max_ns=100_000)
        futures = [executor.submit({"x": 1}, 1, ((4,),))]
        dispatch_all(executor, lane)
        assert lane.launched == [] and lane.ran_here == []  # run time unknown: the lane thread's
        lane.finish_next(elapsed_ns=40_000)
        for x, elapsed_ns in ((2, 400_000), (3, 40_000)):  # a launched run's time (GIL waits and all) is not noted
            futures.append(executor.submit({"x": x}, 1, ((4,),)))
            dispatch_all(executor, lane)
            assert lane.launched[-1].launch is True and lane.ran_here == []
            lane.finish_next(elapsed_ns=elapsed_ns)
        assert len(lane.launched) == 2
        for elapsed_ns in (400_000, 400_000):  # another shape: untimed, then slower than the limit
            futures.append(executor.submit({"x": 4}, 1, ((9,),)))
            dispatch_all(executor, lane)
            lane.finish_next(elapsed_ns=elapsed_ns)
        assert len(lane.launched) == 2 and lane.ran_here == []
        assert [await asyncio.wait_for(f, WAIT_S) for f in futures] == [[2], [4], [6], [8], [8]]

        never, never_lane, _, _, _ = build(launch="never", max_batch_size=0, inline_max_ns=100_000)
        for x in (1, 2):
            never.submit({"x": x}, 1, ((4,),))
            dispatch_all(never, never_lane)
            never_lane.finish_next(elapsed_ns=40_000)
        assert never_lane.launched == [] and len(never_lane.ran_here) == 1
    asyncio.run(main())


def test_a_lane_busy_with_launched_runs_may_take_one_more_full_batch_of_a_model_that_launches():
    """`launches_more` and `full`, which the scheduler asks before it gives a spare lane (Lane.spare) a batch."""
    async def main():
        rows = lambda *sizes: [SimpleNamespace(batch_size=n) for n in sizes]  # noqa: E731
        unbatched, _, _, _, _ = build(launch="auto", max_batch_size=0)
        assert unbatched.launches_more and unbatched.full(rows(1)) and unbatched.full(rows(3))
        auto, lane, _, _, _ = build(launch="auto", max_batch_size=4)
        assert not auto.launches_more  # its batches go to the lane until timed fast
        for _ in range(_SETTLE):
            for x in range(4):
                auto.submit({"x": np.int64(x)}, 1, ())
            dispatch_all(auto, lane)
            lane.finish_next(elapsed_ns=4 * 10_000)
        assert auto.launches_more
        assert auto.full(rows(1, 1, 2)) and not auto.full(rows(1, 1, 1))
        assert build(launch="always")[0].launches_more
        assert not build(launch="never", max_batch_size=0)[0].launches_more
    asyncio.run(main())


def test_launch_always_never_and_jobs_that_cannot_launch():
    async def main():
        async def first_batch(executor, lane):
            futures = [executor.submit({"x": np.int64(x)}, 1, ()) for x in (1, 2)]
            dispatch_all(executor, lane)
            lane.finish_next()
            return [await asyncio.wait_for(f, WAIT_S) for f in futures]

        always, lane, _, _, _ = build(launch="always")
        assert await first_batch(always, lane) == [[2], [4]] and len(lane.launched) == 1  # no timing first
        never, lane, _, _, _ = build(launch="never")
        assert await first_batch(never, lane) == [[2], [4]] and lane.launched == []
        bound, lane, _, _, _ = build(launch="always", launchable=False)  # e.g. a job that binds its buffers
        assert await first_batch(bound, lane) == [[2], [4]] and lane.launched == []
    asyncio.run(main())


def lone_ready(executor, lane, key=((4,),), elapsed_ns=40_000):
    """One one-row request through the queue, timed at `elapsed_ns` on the lane: its shape may now run at once."""
    executor.submit({"x": 1}, 1, key)
    dispatch_all(executor, lane)
    lane.finish_next(elapsed_ns=elapsed_ns)
    far_apart(executor)


def far_apart(executor):
    """Requests have come a millisecond apart, and the next one comes long after the last (ModelExecutor.run_now)."""
    executor._gap_ns, executor._asked_ns = 1_000_000, 0


def test_a_lone_row_runs_at_once_while_requests_come_one_at_a_time():
    """No future, no queue entry, no turn of the loop: the outputs come back from the call, charged as a batch of one
    that went through the queue is charged (statistics, energy, fair share, the shape's run time) in the loop's next
    turn, after the caller has written the answer."""
    async def main():
        charged = []
        executor, lane, sched, runner, stats = build(lambda *a: charged.append(a) or 0.5, inline_max_ns=100_000)
        assert executor.run_now({"x": 1}, ((4,),)) is None  # the shape has never run: the queue times it
        lone_ready(executor, lane)
        before = (stats.inference_count, stats.execution_count, len(sched.finished_calls), len(charged))
        successes = stats.durations["success"].count
        assert executor.run_now({"x": 7}, ((4,),)) == [14]
        assert runner.runs[-1] == [7] and lane.ran_now == 1 and not lane.busy and executor.in_flight == 0
        assert (stats.inference_count, stats.execution_count, len(sched.finished_calls), len(charged)) == before
        await one_loop_turn()  # the books, once the answer is out
        assert (stats.inference_count, stats.execution_count, len(sched.finished_calls)) == \
            (before[0] + 1, before[1] + 1, before[2] + 1)
        assert stats.durations["success"].count == successes + 1
        assert charged[-1] == ("m", "cpu", 1, 20 / 1e9) and executor._lone_ns[((4,),)] < 40_000
        assert executor.run_now({"x": 1}, ((9,),)) is None  # another shape, not timed yet
        far_apart(executor)
        assert executor.run_now({"x": 8}, ((4,),)) == [16] and lane.ran_now == 2
    asyncio.run(main())


def test_run_now_declines_where_the_queue_would_not_run_the_request_at_once():
    async def main():
        executor, lane, sched, runner, _ = build(inline_max_ns=100_000)
        lone_ready(executor, lane)
        executor._gap_ns, executor._asked_ns = 0, time.monotonic_ns() + 10**9  # requests close together
        assert executor.run_now({"x": 1}, ((4,),)) is None
        far_apart(executor)
        sched.due = True  # requests queued this turn wait for the pump, or every lane is busy
        assert executor.run_now({"x": 1}, ((4,),)) is None
        sched.due = False
        queued = executor.submit({"x": 2}, 1, ((4,),))
        far_apart(executor)
        assert executor.run_now({"x": 1}, ((4,),)) is None  # one is queued: it goes first
        burst = [executor.submit({"x": x}, 1, ((4,),)) for x in (3, 4)]
        dispatch_all(executor, lane)
        lane.finish_next(elapsed_ns=40_000)  # a batch of three rows: requests no longer come one at a time
        assert [await asyncio.wait_for(f, WAIT_S) for f in (queued, *burst)] == [[4], [6], [8]]
        far_apart(executor)
        assert executor.run_now({"x": 1}, ((4,),)) is None
        lone_ready(executor, lane)  # one row again
        lane.on_gpu = True
        assert executor.run_now({"x": 1}, ((4,),)) is None  # a GPU lane's stream is its thread's
        lane.on_gpu = False
        far_apart(executor)
        executor.batcher.close("unloading")
        assert executor.run_now({"x": 1}, ((4,),)) is None
        assert lane.ran_now == 0 and len(runner.runs) == 3

        off, off_lane, _, _, _ = build()  # inline_max_ns 0: never
        lone_ready(off, off_lane, elapsed_ns=1)
        assert off.run_now({"x": 1}, ((4,),)) is None
    asyncio.run(main())


def test_a_failed_lone_run_raises_the_error_its_future_would_get_and_counts_no_success():
    async def main():
        executor, lane, _, _, stats = build(inline_max_ns=100_000)
        lone_ready(executor, lane)
        served, successes = stats.inference_count, stats.durations["success"].count
        with pytest.raises(Internal, match=r"model 'm': inference failed on lane cpu.0: RuntimeError: session explo"):
            executor.run_now({"x": "boom"}, ((4,),))
        await one_loop_turn()  # (the books come a turn later)
        assert stats.inference_count == served and not lane.busy and stats.durations["success"].count == successes
        far_apart(executor)
        assert executor.run_now({"x": 5}, ((4,),)) == [10]  # the next one runs
    asyncio.run(main())


def test_a_batch_of_every_client_runs_on_the_loop_once_such_batches_ran_in_under_twice_the_inline_bound():
    """`_runs_round`: the clients of a batch of 10 (max_batch_size 10) are expected back, nothing being queued; once
    two batches in a row expected theirs and all 10 are back, their batch runs on the loop if batches of 10 ran in
    under 2 x inline_max_ns; not after one such batch only, not with a request queued behind it, and not when such
    runs were slower."""
    async def main():
        def on_loop(ran_ns, rounds=2, extra=0):
            executor, lane, _, runner, _ = build(max_batch_size=10, delay_s=0.01, inline_max_ns=100_000)
            for x in range(10):
                executor.submit({"x": x}, 1, ())
            for r in range(1, rounds + 1):
                dispatch_all(executor, lane)
                lane.finish_next(ran_ns)  # batches of 10 rows take `ran_ns`
                for x in range(10 + (extra if r == rounds else 0)):  # the answered clients come back
                    executor.submit({"x": 100 * r + x}, 1, ())
            dispatch_all(executor, lane)
            batch = lane.submitted[-1][2]
            ran_here = any(batch is tag for tag in lane.ran_here)
            return ran_here, runner.runs[-1] if ran_here else batch.size

        assert on_loop(150_000) == (True, list(range(200, 210)))  # all 10 back, 10 rows ran in 150 µs < 200 µs
        assert on_loop(150_000, rounds=1) == (False, 10)  # one batch expected its clients: not yet
        assert on_loop(250_000) == (False, 10)  # such batches ran slower than 2 x inline_max_ns: the lane's way
        assert on_loop(150_000, extra=1) == (False, 10)  # one more queued behind the batch: a request to read
    asyncio.run(main())


def test_the_clients_of_a_small_batch_are_expected_back_and_those_of_a_large_one_or_with_a_long_queue_are_not():
    async def main():
        executor, lane, sched, runner, stats = build(max_batch_size=16, delay_s=0.01)
        batcher = executor.batcher

        def run_batch(n, queued_after=0, elapsed_ns=1_000):
            futures = [executor.submit({"x": x}, 1, ()) for x in range(1, n + 1)]
            dispatch_all(executor, lane)
            later = [executor.submit({"x": x}, 1, ()) for x in range(queued_after)]
            lane.finish_next(elapsed_ns)
            return futures + later

        run_batch(3)
        assert batcher.returning == 3  # 3 requests, nothing queued: a few closed-loop clients
        executor.submit({"x": 9}, 1, ())
        assert batcher.returning == 2  # one came back: it waits for the other two
        decision, _ = batcher.decide(time.monotonic_ns(), 1)
        assert decision.take == 0 and decision.wait_s == float("inf")  # their answers are not written yet
        for _ in range(3):  # the turns of the loop that write the answers: the window opens after them
            await asyncio.sleep(0)
        decision, _ = batcher.decide(time.monotonic_ns(), 1)
        assert decision.take == 0 and 0 < decision.wait_s <= 0.01
        executor.submit({"x": 8}, 1, ())
        executor.submit({"x": 7}, 1, ())
        dispatch_all(executor, lane)  # all three back: one batch
        lane.finish_next()
        assert runner.runs[-1] == [9, 8, 7] and batcher.returning == 3
        run_batch(3, queued_after=5)
        assert batcher.returning == 0  # 3 answered and 5 queued: many clients

        def expected_after(answered, queued, max_batch_size=16):
            fresh, fresh_lane = build(max_batch_size=max_batch_size, delay_s=0.01)[:2]
            for x in range(answered + queued):
                fresh.submit({"x": x}, 1, ())
                if x == answered - 1:
                    dispatch_all(fresh, fresh_lane)
            fresh_lane.finish_next()
            return fresh.batcher.returning

        assert expected_after(8, 0) == 8  # more than INLINE_ROWS, nothing queued: up to _EXPECT_REQUESTS are waited for
        assert expected_after(6, 4) == 6  # fewer queued than answered: not all came back while the lane computed
        assert expected_after(8, 8) == 0  # as many queued as answered: they come back while the lane computes
        assert expected_after(12, 6, max_batch_size=32) == 0  # more than _EXPECT_REQUESTS together
        assert expected_after(6, 3, max_batch_size=8) == 0  # more than one batch of max_batch_size 8
        for elapsed_ns, expected in ((79_000_000, 0), (80_000_000, 8)):  # 8 answered, 9 queued, a run of ~8 delays
            slow, slow_lane = build(max_batch_size=16, delay_s=0.01)[:2]
            for x in range(17):
                slow.submit({"x": x}, 1, ())
                if x == 7:
                    dispatch_all(slow, slow_lane)
            slow_lane.finish_next(elapsed_ns)
            assert slow.batcher.returning == expected  # a compute-bound model's clients are waited for
        idle = build(max_batch_size=16)[0]  # no queue delay: nothing is ever waited for
        idle.submit({"x": 1}, 1, ())
        dispatch_all(idle, idle.lanes[0])
        idle.lanes[0].finish_next()
        assert idle.batcher.returning == 0
    asyncio.run(main())
