"""The config's preserve_ordering (core/answer_order.py): a model's answers come in the order its requests were taken
into batches, whichever batch finishes first. AnswerOrder alone, then in a ModelExecutor with two fake lanes that
the test finishes in the order it chooses (tests/unit/test_model_executor.py's, no threads)."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from gt_serve.core.answer_order import AnswerOrder
from gt_serve.core.response_cache import ResponseCache, request_key, serve_cached
from gt_serve.types import InferRequest, Tensor
from tests.unit.test_model_executor import WAIT_S, FakeLane, build, dispatch_all, far_apart, lone_ready, one_loop_turn


def test_batches_are_answered_in_the_order_they_were_taken():
    order, answered = AnswerOrder(), []
    first, second, third = object(), object(), object()
    for batch in (first, second, third):
        order.taken(batch)
    order.finished(third, lambda: answered.append("third"))
    order.finished(second, lambda: answered.append("second"))
    assert answered == [] and order.waiting  # the first is still running
    order.finished(first, lambda: answered.append("first"))
    assert answered == ["first", "second", "third"] and not order.waiting
    order.finished(object(), lambda: answered.append("never taken"))  # answered at once
    assert answered[-1] == "never taken"


def test_a_release_that_fails_does_not_hold_back_the_answers_after_it(caplog):
    order, answered = AnswerOrder(), []
    first, second = object(), object()
    order.taken(first)
    order.taken(second)
    order.finished(second, lambda: answered.append("second"))
    order.finished(first, lambda: 1 / 0)
    assert answered == ["second"] and not order.waiting
    assert "answers released out of a batch failed" in caplog.text


def test_a_cache_hits_turn_comes_after_the_batches_taken_before_it_only():
    async def main():
        loop = asyncio.get_running_loop()
        order = AnswerOrder()
        assert order.turn(loop) is None  # nothing waiting: answered at once
        running = object()
        order.taken(running)
        turn = order.turn(loop)
        order.taken(later := object())
        assert turn is not None and not turn.done()
        order.finished(running, lambda: None)
        assert turn.done() and order.waiting  # the batch taken after the hit still runs
        order.finished(later, lambda: None)
        assert not order.waiting
        order.taken(gone := object())
        order.turn(loop).cancel()  # the client went away
        order.finished(gone, lambda: None)
        assert not order.waiting
    asyncio.run(main())


def _cached_model(executor, stats):
    return SimpleNamespace(name="m", version="1", executor=executor, stats=stats,
                           config=SimpleNamespace(response_cache=SimpleNamespace(enable=True)))


def _request(x: float) -> InferRequest:
    return InferRequest("m", inputs=[Tensor("x", "FP32", (1, 1), np.full((1, 1), x, dtype=np.float32))])


def test_a_cache_hit_is_answered_after_the_batches_taken_before_it_and_before_those_after():
    """serve_cached with an ordered model on two lanes: the hit waits for the batch running before it, and is
    answered in the same turn as that batch, ahead of the batch taken after it that finished first."""
    async def main():
        other = FakeLane("cpu.1")
        executor, lane, _, _, stats = build(extra_lanes=(other,), ordered=True)
        cache, model = ResponseCache(1 << 20), _cached_model(executor, stats)
        cache.put(request_key(model, _request(9), None), [Tensor("y", "FP32", (1, 1), np.ones((1, 1), np.float32))])
        answered = []

        async def queued(x):
            return await executor.submit({"x": x}, 1, ((x,),))

        async def never():
            raise AssertionError("a hit behind batches already taken runs no batch")

        before = asyncio.ensure_future(queued(1))
        await one_loop_turn()
        dispatch_all(executor, lane)
        hit = asyncio.ensure_future(serve_cached(cache, model, _request(9), None, 0, never))
        await one_loop_turn()
        after = asyncio.ensure_future(queued(2))
        await one_loop_turn()
        dispatch_all(executor, other)
        for task, name in ((before, "before"), (hit, "hit"), (after, "after")):
            task.add_done_callback(lambda _, name=name: answered.append(name))
        other.finish_next()
        await one_loop_turn()
        assert answered == [] and not hit.done()
        lane.finish_next()
        await asyncio.wait_for(asyncio.gather(before, hit, after), WAIT_S)
        assert answered == ["before", "hit", "after"]
        assert stats.durations["cache_hit"].count == 1
    asyncio.run(main())


def test_a_cache_hit_while_requests_are_queued_before_it_runs_as_a_miss_behind_them():
    async def main():
        executor, lane, _, runner, stats = build(ordered=True)
        cache, model = ResponseCache(1 << 20), _cached_model(executor, stats)
        cache.put(request_key(model, _request(9), None), [Tensor("y", "FP32", (1, 1), np.ones((1, 1), np.float32))])
        waiting = executor.submit({"x": 1}, 1, ())

        async def run():
            return [Tensor("y", "FP32", (1, 1), np.array(await executor.submit({"x": 9}, 1, ())))]

        hit = asyncio.ensure_future(serve_cached(cache, model, _request(9), None, 0, run))
        await one_loop_turn()
        dispatch_all(executor, lane)
        lane.finish_next()
        assert await asyncio.wait_for(waiting, WAIT_S) == [2]
        assert (await asyncio.wait_for(hit, WAIT_S))[0].data.tolist() == [18]  # run, not the cached ones
        assert runner.runs == [[1, 9]] and stats.durations["cache_hit"].count == 0
    asyncio.run(main())


@pytest.mark.parametrize("ordered", [True, False], ids=["preserve_ordering", "default"])
def test_a_batch_that_finishes_first_on_another_lane_waits_for_the_one_taken_before_it(ordered):
    """Two batches of different shapes on two lanes; the second finishes first. Without preserve_ordering its answer
    goes at once (the case the option is for); with it, after the first batch's."""
    async def main():
        other = FakeLane("cpu.1")
        executor, lane, _, _, stats = build(extra_lanes=(other,), ordered=ordered)
        done = []
        slow = executor.submit({"x": 1}, 1, ((400,),))
        fast = [executor.submit({"x": x}, 1, ((4,),)) for x in (2, 3)]
        for future, name in ((slow, "slow"), (fast[0], "fast2"), (fast[1], "fast3")):
            future.add_done_callback(lambda _, name=name: done.append(name))
        dispatch_all(executor, lane)  # the slow one's batch (its shape alone)
        dispatch_all(executor, other)  # both fast ones
        other.finish_next()
        await one_loop_turn()
        assert done == ([] if ordered else ["fast2", "fast3"])
        lane.finish_next()
        assert [await asyncio.wait_for(f, WAIT_S) for f in (slow, *fast)] == [[2], [4], [6]]
        assert done == (["slow", "fast2", "fast3"] if ordered else ["fast2", "fast3", "slow"])
        assert stats.inference_count == 3 and executor.in_flight == 0
    asyncio.run(main())


def test_a_failed_batch_keeps_its_place_in_the_order():
    async def main():
        other = FakeLane("cpu.1")
        executor, lane, _, _, _ = build(extra_lanes=(other,), ordered=True)
        failing = executor.submit({"x": "boom"}, 1, ((400,),))
        after = executor.submit({"x": 2}, 1, ((4,),))
        dispatch_all(executor, lane)
        dispatch_all(executor, other)
        other.finish_next()
        await one_loop_turn()
        assert not after.done()
        lane.finish_next()
        with pytest.raises(Exception, match="session exploded"):
            await asyncio.wait_for(failing, WAIT_S)
        assert await asyncio.wait_for(after, WAIT_S) == [4]
    asyncio.run(main())


def test_a_lone_row_is_not_run_at_once_while_an_answer_before_it_waits():
    """run_now would answer at once, ahead of a batch taken before it: it declines while one is waiting."""
    async def main():
        other = FakeLane("cpu.1")
        executor, lane, _, _, _ = build(inline_max_ns=100_000, extra_lanes=(other,), ordered=True)
        lone_ready(executor, lane)
        running = executor.submit({"x": 5}, 1, ((4,),))
        dispatch_all(executor, other)
        far_apart(executor)
        assert executor.run_now({"x": 1}, ((4,),)) is None  # `lane` is idle, but the batch on `other` is before it
        other.finish_next()
        assert await asyncio.wait_for(running, WAIT_S) == [10]
        far_apart(executor)
        assert executor.run_now({"x": 1}, ((4,),)) == [2]
    asyncio.run(main())
