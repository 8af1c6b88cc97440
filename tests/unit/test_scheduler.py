"""ModelExecutor + batcher + stream scheduler on real lanes (worker threads): work conservation,
batching under load, queue limits, timeouts, priorities and fair share between models.

The batch jobs here are gated callables instead of onnxruntime sessions, so each test decides exactly
when a lane finishes: scheduling order is then deterministic (the end-to-end path with real sessions
is covered by the integration tests)."""
import asyncio
import contextlib
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from gt_serve.core.batch_completion import BatchCompletion
from gt_serve.core.batch_policy import BatchConfig
from gt_serve.core.batcher import Batcher, QueuePolicy
from gt_serve.core.model_executor import ModelExecutor
from gt_serve.core.statistics import ModelStats
from gt_serve.core.stream_scheduler import StreamScheduler
from gt_serve.errors import DeadlineExceeded, QueueFull
from gt_serve.execution.lanes import Lane


class Gate:
    """Jobs block until released; records the batches in the order lanes ran them."""

    def __init__(self):
        self.ran = []
        self.started = threading.Semaphore(0)
        self._go = threading.Semaphore(0)

    def job_factory(self, runner, batch, spec, lane):
        """A JobFactory: `runner` is the model's name here."""
        def run():
            self.ran.append((runner, [e.feeds["tag"] for e in batch.entries]))
            self.started.release()
            assert self._go.acquire(timeout=10)
            return [[e.feeds["tag"]] for e in batch.entries], (0, 0, 0)
        return run

    def launchable(self, runner, batch, spec, lane):
        """A JobFactory whose jobs may be launched (Lane.launch): the gated job runs on a thread of its own, as on
        onnxruntime's pool, and calls back from there."""
        return _Launchable(self.job_factory(runner, batch, spec, lane))

    def release(self, n=1):
        for _ in range(n):
            self._go.release()


class _Launchable:
    launchable = True

    def __init__(self, run):
        self.run = run

    def __call__(self):
        return self.run()

    def start(self, finish, retry):
        threading.Thread(target=lambda: finish(self.run(), None), daemon=True).start()


async def wait_started(gate, n=1):
    for _ in range(n):
        assert await asyncio.to_thread(gate.started.acquire, True, 10)


@contextlib.asynccontextmanager
async def scheduled(n_lanes=1):
    """The running loop's `n_lanes` started lanes, their scheduler, a gate, and `model(name, **kw)`: make_batcher's
    executor on them. At the end, even of a failed test, a job still at the gate is let through and the lanes stop."""
    loop = asyncio.get_running_loop()
    lanes = [Lane(f"cpu.{i}", "cpu", loop) for i in range(n_lanes)]
    for lane in lanes:
        lane.start()
    gate = Gate()
    try:
        sched = StreamScheduler(loop, lanes)
        yield SimpleNamespace(loop=loop, lanes=lanes, sched=sched, gate=gate,
                              model=lambda name, **kw: make_batcher(sched, lanes, gate, name, **kw))
    finally:
        gate.release(len(lanes))
        for lane in lanes:
            lane.stop()


def make_batcher(sched, lanes, gate, name, mbs=8, delay_s=0.0, policy=QueuePolicy(), levels=0, weight=1.0,
                 launch="never", level_policies=None, default_level=0):
    """The model's executor (submit, pending, batcher) on `lanes`, registered with `sched`; with `launch`, its
    batches are launched (`Gate.launchable`)."""
    batcher = Batcher(name, BatchConfig(mbs, (), delay_s), policy, wake=sched.notify, priority_levels=levels,
                      level_policies=level_policies, default_priority=default_level)
    jobs = gate.job_factory if launch == "never" else gate.launchable
    executor = ModelExecutor(batcher, {lane: name for lane in lanes}, jobs,
                             BatchCompletion(name, ModelStats(name, "1")), sched,
                             SimpleNamespace(input_order=["tag"], output_order=["tag"]), weight=weight,
                             launch=launch)
    sched.register(executor)
    return executor


def submit(b, tag, **kw):
    return b.submit({"tag": tag}, 1, (), **kw)


def run(coro):
    return asyncio.run(coro)


def test_idle_lane_dispatches_without_waiting_out_the_delay():
    async def main():
        async with scheduled() as s:
            gate = s.gate
            b = s.model("m", delay_s=30.0)  # a delay that would fail the test
            f = submit(b, 1)
            await wait_started(gate)
            gate.release()
            assert await asyncio.wait_for(f, 10) == [1]
    run(main())


def test_requests_queued_behind_a_busy_lane_form_one_batch():
    async def main():
        async with scheduled() as s:
            gate = s.gate
            b = s.model("m", mbs=8)
            first = submit(b, 0)
            await wait_started(gate)
            rest = [submit(b, i) for i in range(1, 6)]
            gate.release()
            await wait_started(gate)
            gate.release()
            assert await asyncio.wait_for(asyncio.gather(first, *rest), 10) == [[i] for i in range(6)]
            assert gate.ran == [("m", [0]), ("m", [1, 2, 3, 4, 5])]  # merged, order kept
    run(main())


def test_full_queue_is_refused_at_once_and_timeouts_fail_clearly():
    async def main():
        async with scheduled() as s:
            gate = s.gate
            b = s.model("m", mbs=1, policy=QueuePolicy(max_queue_size=2))
            running = submit(b, 0)
            await wait_started(gate)
            queued = [submit(b, 1), submit(b, 2)]
            with pytest.raises(QueueFull, match="queue is full"):
                submit(b, 3)
            b.batcher.policies = [QueuePolicy(max_queue_size=3)]
            late = submit(b, 4, deadline_s=time.monotonic() + 0.05)
            with pytest.raises(DeadlineExceeded, match="timed out in the queue"):
                await asyncio.wait_for(late, 10)
            gate.release(3)
            assert await asyncio.wait_for(asyncio.gather(running, *queued), 10) == [[0], [1], [2]]
            assert [tags for _, tags in gate.ran] == [[0], [1], [2]]  # the expired request never ran
    run(main())


def test_priority_levels_are_honoured():
    async def main():
        async with scheduled() as s:
            gate = s.gate
            b = s.model("m", mbs=1, levels=2)
            blocker = submit(b, "first")
            await wait_started(gate)
            low = submit(b, "low", priority=2)
            high = submit(b, "high", priority=1)
            gate.release(3)
            await asyncio.wait_for(asyncio.gather(blocker, low, high), 10)
            assert [tags[0] for _, tags in gate.ran] == ["first", "high", "low"]
    run(main())


def test_each_priority_level_has_its_own_queue_policy():
    """Triton's priority_queue_policy: a level's own queue size and timeout; the default policy for the other levels,
    each level bounded on its own (not the model's whole queue)."""
    async def main():
        async with scheduled() as s:
            gate = s.gate
            b = s.model("m", mbs=1, levels=3, default_level=3, policy=QueuePolicy(max_queue_size=1),
                        level_policies={1: QueuePolicy(max_queue_size=3, default_timeout_s=30.0),
                                        2: QueuePolicy(default_timeout_s=0.01, allow_timeout_override=False)})
            running = submit(b, "running")
            await wait_started(gate)
            urgent = [submit(b, f"urgent{i}", priority=1) for i in range(3)]
            with pytest.raises(QueueFull, match=r"queue is full \(3 requests at priority level 1\)"):
                submit(b, "one too many", priority=1)
            low = submit(b, "low")  # the default level, 3: its own queue of one
            with pytest.raises(QueueFull, match=r"queue is full \(1 requests at priority level 3\)"):
                submit(b, "low too")
            soon = submit(b, "soon", priority=2, deadline_s=time.monotonic() + 60)  # no override at level 2: 10 ms
            with pytest.raises(DeadlineExceeded, match="timed out in the queue"):
                await asyncio.wait_for(soon, 10)
            gate.release(5)
            assert await asyncio.wait_for(asyncio.gather(running, *urgent, low), 10) == \
                [["running"], ["urgent0"], ["urgent1"], ["urgent2"], ["low"]]
            assert [tags[0] for _, tags in gate.ran] == ["running", "urgent0", "urgent1", "urgent2", "low"]
    run(main())


def test_a_hot_model_cannot_starve_a_cold_one():
    async def main():
        async with scheduled() as s:
            gate = s.gate
            hot = s.model("hot", mbs=1)
            cold = s.model("cold", mbs=1)
            hot_futures = [submit(hot, i) for i in range(20)]
            await wait_started(gate)
            gate.release()  # hot ran once: it now has more virtual time than cold
            cold_future = submit(cold, "c")
            await wait_started(gate)
            gate.release()
            await wait_started(gate)
            names = [name for name, _ in gate.ran]
            assert names[:3] == ["hot", "cold", "hot"], f"cold starved behind {names}"
            gate.release(100)
            await asyncio.wait_for(asyncio.gather(cold_future, *hot_futures), 10)
    run(main())


def test_two_lanes_run_two_batches_at_once():
    async def main():
        async with scheduled(n_lanes=2) as s:
            lanes, gate = s.lanes, s.gate
            b = s.model("m", mbs=1)
            futures = [submit(b, i) for i in range(2)]
            await wait_started(gate, 2)  # both started before either was released: they overlap
            gate.release(2)
            assert await asyncio.wait_for(asyncio.gather(*futures), 10) == [[0], [1]]
            assert {lane.batches_run for lane in lanes} == {1}
    run(main())


async def after_pump(loop):
    """Once the pump that the last submit scheduled (call_soon) has run."""
    turn = loop.create_future()
    loop.call_soon(turn.set_result, None)
    await asyncio.wait_for(turn, 10)


def test_a_lane_busy_with_a_launched_batch_takes_a_second_only_when_it_is_full():
    """A second launched batch queues in onnxruntime's pool and starts as soon as the first is computed; one that is
    not full waits for the lane, to be taken whole (Lane.spare, ModelExecutor.launches_more)."""
    async def main():
        async with scheduled() as s:
            lane, gate = s.lanes[0], s.gate
            b = s.model("m", mbs=4, launch="always")
            row = lambda i: submit(b, np.int64(i))  # noqa: E731 - inputs the launch can measure (LaunchChoice.fits)
            futures = [row(i) for i in (0, 1)]  # read in one turn: one batch of two, launched
            await wait_started(gate)
            assert lane.busy and lane.spare and lane.launched == 1
            futures += [row(i) for i in (2, 3, 4)]
            await after_pump(s.loop)
            assert b.pending == 3 and len(gate.ran) == 1  # three of four rows: they wait
            futures.append(row(5))
            await wait_started(gate)  # full: launched beside the first
            assert lane.flying == 2 and not lane.spare and b.pending == 0
            gate.release(2)
            assert await asyncio.wait_for(asyncio.gather(*futures), 10) == [[i] for i in range(6)]
            assert gate.ran == [("m", [0, 1]), ("m", [2, 3, 4, 5])] and not lane.busy
            assert (lane.launched, lane.batches_run) == (2, 2)
    run(main())


def test_a_spare_lane_is_not_given_while_a_model_that_does_not_launch_waits_for_it():
    """A model whose full batches keep coming would keep the lane busy for ever with launched batches; another model
    on the lane that does not launch waits for it idle, and is served first when it is (the least served)."""
    async def main():
        async with scheduled() as s:
            lane, gate = s.lanes[0], s.gate
            a, b = s.model("a", mbs=2, launch="always"), s.model("b", mbs=2)
            futures = [submit(a, np.int64(i)) for i in (0, 1)]  # one batch of two, launched
            await wait_started(gate)
            futures.append(submit(b, 10))
            futures += [submit(a, np.int64(i)) for i in (2, 3)]  # full, but b waits for the lane
            await after_pump(s.loop)
            assert lane.spare and a.pending == 2 and b.pending == 1
            gate.release()
            await wait_started(gate)
            assert gate.ran[1] == ("b", [10]) and a.pending == 2
            gate.release(2)
            assert await asyncio.wait_for(asyncio.gather(*futures), 10) == [[0], [1], [10], [2], [3]]
            assert gate.ran == [("a", [0, 1]), ("b", [10]), ("a", [2, 3])]
    run(main())


def test_requests_that_went_away_are_purged_not_run():
    async def main():
        async with scheduled() as s:
            gate = s.gate
            b = s.model("m", mbs=1)
            running = submit(b, 0)
            await wait_started(gate)
            gone, kept = submit(b, 1), submit(b, 2)
            gone.cancel()  # the client went away
            b.batcher.purge_done()
            assert b.pending == 1
            gate.release(2)
            assert await asyncio.wait_for(asyncio.gather(running, kept), 10) == [[0], [2]]
            assert [tags for _, tags in gate.ran] == [[0], [2]]
    run(main())


def test_lone_lane_is_the_idle_lane_a_pump_would_give_a_lone_request_now():
    """ModelExecutor.run_now asks it: none while a pump is due or every lane is busy, nor where the batch policy would
    wait for a preferred size; else the lane the chooser picks among the idle ones."""
    async def main():
        async with scheduled(n_lanes=2) as s:
            loop, lanes, sched, gate = s.loop, s.lanes, s.sched, s.gate
            b = s.model("m")
            assert sched.lone_lane(b) is lanes[0]
            first = submit(b, 1)
            assert sched.lone_lane(b) is None  # queued this turn: the pump decides it first
            await wait_started(gate)
            assert lanes[0].busy and sched.lone_lane(b) is lanes[1]
            second = submit(b, 2)
            await wait_started(gate)
            assert sched.lone_lane(b) is None  # both lanes busy
            gate.release(2)
            assert await asyncio.wait_for(asyncio.gather(first, second), 10) == [[1], [2]]
            waits = Batcher("w", BatchConfig(8, (2,), 30.0), QueuePolicy(), wake=sched.notify)
            pair = ModelExecutor(waits, {lanes[0]: "w"}, gate.job_factory, BatchCompletion("w", ModelStats("w", "1")),
                                 sched, SimpleNamespace(input_order=["tag"], output_order=["tag"]))
            assert not lanes[0].busy and sched.lone_lane(pair) is None  # one row waits to make the preferred two
            chooser = StreamScheduler(loop, lanes, choose_lane=lambda executor, idle: idle[-1])
            assert chooser.lone_lane(b) is lanes[1]
    run(main())


def test_answered_clients_that_come_back_one_by_one_form_one_batch():
    """Closed-loop clients: the three answered together send their next requests a little apart. While they are
    expected back (within the queue delay), the first waits for the others on an idle lane instead of running alone
    ahead of them."""
    async def main():
        async with scheduled() as s:
            gate = s.gate
            b = s.model("m", mbs=8, delay_s=30.0)
            first = [submit(b, i) for i in range(3)]
            await wait_started(gate)
            gate.release()
            assert await asyncio.wait_for(asyncio.gather(*first), 10) == [[0], [1], [2]]
            again = []
            for tag in (3, 4, 5):
                again.append(submit(b, tag))
                await asyncio.sleep(0)  # one turn: the pump decides on what has come
                assert b.pending == len(again) % 3  # waiting for the others, then all three taken
            await wait_started(gate)
            gate.release()
            assert await asyncio.wait_for(asyncio.gather(*again), 10) == [[3], [4], [5]]
            assert gate.ran == [("m", [0, 1, 2]), ("m", [3, 4, 5])]
    run(main())


def test_the_window_for_answered_clients_opens_when_their_answers_are_written():
    """Answers that take the loop longer than the queue delay to write (a batch's answers on cold caches after a
    long run): the clients they answer are expected back within the delay after the answers are out, not after the
    batch came back, so the first to return waits for the other instead of running alone ahead of it."""
    async def main():
        async with scheduled() as s:
            gate = s.gate
            b = s.model("m", mbs=8, delay_s=0.2)
            first = [submit(b, i) for i in range(2)]
            first[0].add_done_callback(lambda f: time.sleep(0.4))  # the loop busy answering for twice the delay
            await wait_started(gate)
            gate.release()
            assert await asyncio.wait_for(asyncio.gather(*first), 10) == [[0], [1]]
            again = [submit(b, 2)]
            await asyncio.sleep(0)  # one turn: the pump decides on what has come
            assert b.pending == 1  # held for the other answered client
            again.append(submit(b, 3))
            await wait_started(gate)
            gate.release()
            assert await asyncio.wait_for(asyncio.gather(*again), 10) == [[2], [3]]
            assert gate.ran == [("m", [0, 1]), ("m", [2, 3])]
    run(main())


def test_requests_queued_behind_a_busy_lane_wait_for_the_clients_it_answers():
    """Four closed-loop clients in two halves: two run while the other two queue, and those have waited longer than
    the delay when the lane answers. They are held for the two answered clients (the delay counts from the answer),
    and the four run together instead of alternating in twos."""
    async def main():
        async with scheduled() as s:
            gate = s.gate
            b = s.model("m", mbs=8, delay_s=30.0)
            first = [submit(b, i) for i in range(2)]
            await wait_started(gate)
            behind = [submit(b, i) for i in (2, 3)]
            for q in b.batcher._queues:  # they came longer ago than the delay: their own budget is spent
                for entry in q:
                    entry.arrival_ns -= 60 * 10**9
            gate.release()
            assert await asyncio.wait_for(asyncio.gather(*first), 10) == [[0], [1]]
            assert b.pending == 2  # held for the two answered clients
            again = [submit(b, 4)]
            await asyncio.sleep(0)  # one turn: the pump decides on what has come
            assert b.pending == 3
            again.append(submit(b, 5))
            await wait_started(gate)
            gate.release()
            assert await asyncio.wait_for(asyncio.gather(*behind, *again), 10) == [[2], [3], [4], [5]]
            assert gate.ran == [("m", [0, 1]), ("m", [2, 3, 4, 5])]
    run(main())


def test_a_client_that_does_not_come_back_is_waited_for_once_within_the_delay():
    async def main():
        async with scheduled() as s:
            gate = s.gate
            b = s.model("m", mbs=8, delay_s=0.5)
            first = [submit(b, i) for i in range(2)]
            await wait_started(gate)
            gate.release()
            await asyncio.wait_for(asyncio.gather(*first), 10)
            lone = submit(b, 2)  # the other client went away
            await asyncio.sleep(0)
            assert b.pending == 1  # expected back: waited for, up to the delay
            await wait_started(gate)
            gate.release()
            assert await asyncio.wait_for(lone, 10) == [2]
            after = submit(b, 3)  # one answered, one back: nobody else is expected
            await asyncio.sleep(0)
            assert b.pending == 0
            await wait_started(gate)
            gate.release()
            assert await asyncio.wait_for(after, 10) == [3]
            assert gate.ran == [("m", [0, 1]), ("m", [2]), ("m", [3])]
            b.batcher.answered(2, time.monotonic_ns() - 10**9)  # answered longer ago than the delay: not expected now
            late = submit(b, 4)
            await asyncio.sleep(0)
            assert b.pending == 0
            await wait_started(gate)
            gate.release()
            assert await asyncio.wait_for(late, 10) == [4]
    run(main())
