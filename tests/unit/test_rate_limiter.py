"""Triton's rate limiter (core/rate_limiter.py): the config's needs by lane kind, resource copies (the most any model
needs, or --rate-limit-resource's, per device or global), and, in a StreamScheduler with fake lanes, a model's batch
that waits for a resource another model's batch holds although a lane is idle; without the limiter it does not."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from gt_serve.config import parse_rate_limit_resource
from gt_serve.core.batch_completion import BatchCompletion
from gt_serve.core.batch_policy import BatchConfig
from gt_serve.core.batcher import Batcher, QueuePolicy
from gt_serve.core.model_config import parse_pbtxt
from gt_serve.core.model_executor import ModelExecutor
from gt_serve.core.rate_limiter import Needs, RateLimiter, model_needs
from gt_serve.core.statistics import ModelStats
from gt_serve.core.stream_scheduler import StreamScheduler
from gt_serve.errors import ConfigError
from gt_serve.core.model_host import LocalModelHost
from tests.unit.test_model_executor import SPEC, WAIT_S, FakeLane, Runner, one_loop_turn

CPU, GPU0, GPU1 = SimpleNamespace(device="cpu"), SimpleNamespace(device="gpu:0"), SimpleNamespace(device="gpu:1")


def _needs(*resources, priority=1) -> dict[str, Needs]:
    return {"cpu": Needs(tuple(resources), priority), "gpu": Needs(tuple(resources), priority)}


def test_the_configs_needs_by_lane_kind():
    cfg = parse_pbtxt('name: "m"\ninstance_group [\n'
                      '  { kind: KIND_CPU rate_limiter { resources [ { name: "R" count: 2 } ] priority: 3 } },\n'
                      '  { kind: KIND_GPU rate_limiter { resources [ { name: "G" global: true count: 1 } ] } } ]', "t")
    needs = model_needs(cfg)
    assert needs["cpu"] == Needs((("R", False, 2),), 3) and needs["gpu"] == Needs((("G", True, 1),), 1)
    auto = model_needs(parse_pbtxt('name: "m"\ninstance_group [ { rate_limiter { resources [ { name: "R" count: 1 } ] '
                                   '} } ]', "t"))
    assert auto["cpu"] == auto["gpu"] == Needs((("R", False, 1),), 1)  # KIND_AUTO: either kind of lane
    assert model_needs(parse_pbtxt('name: "m"\ninstance_group [ { kind: KIND_CPU } ]', "t")) == {}
    with pytest.raises(ConfigError, match="resource without a name"):
        model_needs(parse_pbtxt('name: "m"\ninstance_group [ { rate_limiter { resources [ { count: 1 } ] } } ]', "t"))


def test_copies_are_the_most_any_model_needs_unless_given():
    limiter = RateLimiter()
    limiter.register("a", _needs(("R", False, 2)))
    limiter.register("b", _needs(("R", False, 5), ("G", True, 3)))
    assert (limiter.copies("R", "cpu"), limiter.copies("R", "gpu:0"), limiter.copies("G", "global")) == (5, 5, 3)
    given = RateLimiter(("R:10", "R:4:1", "G:2"))
    given.register("b", _needs(("R", False, 5), ("G", True, 2)))
    assert (given.copies("R", "cpu"), given.copies("R", "gpu:0"), given.copies("R", "gpu:1")) == (10, 10, 4)
    assert given.copies("G", "global") == 2
    with pytest.raises(ConfigError, match="needs 5 of resource 'R' on gpu:1 but --rate-limit-resource gives 4"):
        given.check(_needs(("R", False, 5)), ("cpu", "gpu:0", "gpu:1"))
    given.check(_needs(("R", False, 5)), ("cpu", "gpu:0"))  # that model never runs on GPU 1


@pytest.mark.parametrize("text", ["R", "R:x", ":3", "R:1:2:3", "R:-1", "R:1:gpu"])
def test_a_bad_rate_limit_resource_is_named(text):
    with pytest.raises(ConfigError, match="expected NAME:COUNT or NAME:COUNT:DEVICE"):
        parse_rate_limit_resource(text)


def test_resources_are_held_per_device_and_globally():
    limiter = RateLimiter()
    limiter.register("a", _needs(("R", False, 1)))
    limiter.register("g", _needs(("G", True, 1)))
    limiter.acquire("a", GPU0)
    assert not limiter.allows("a", GPU0) and limiter.allows("a", GPU1) and limiter.allows("a", CPU)
    limiter.acquire("g", CPU)
    assert not limiter.allows("g", GPU1)  # one global copy, held on any device
    assert limiter.in_use() == {"G@global": 1, "R@gpu:0": 1}
    limiter.release("a", GPU0)
    limiter.release("g", CPU)
    assert limiter.allows("a", GPU0) and limiter.allows("g", GPU1) and limiter.in_use() == {}
    assert limiter.allows("unregistered", CPU)  # a model with no rate_limiter settings needs nothing


def test_an_unloaded_models_batch_still_out_gives_its_resources_back():
    """An unload that stopped waiting for a batch unregisters the model while the batch holds its resources."""
    limiter = RateLimiter()
    limiter.register("a", _needs(("R", False, 1)))
    limiter.register("b", _needs(("R", False, 1)))
    limiter.acquire("a", CPU)
    limiter.unregister("a")
    assert not limiter.allows("b", CPU)
    limiter.release("a", CPU)
    assert limiter.allows("b", CPU) and limiter.in_use() == {}
    limiter.unregister("b")
    assert limiter.copies("R", "cpu") == 0  # both forgotten


class _Lane(FakeLane):
    spare = False


def _executor(name: str, scheduler: StreamScheduler, lanes: list, needs: dict, weight: float = 1.0) -> ModelExecutor:
    runner = Runner()
    batcher = Batcher(name, BatchConfig(8, (), 0.0), QueuePolicy(), wake=scheduler.notify)
    executor = ModelExecutor(batcher, {lane: runner for lane in lanes}, runner.job,
                             BatchCompletion(name, ModelStats(name, "1"), None), scheduler, SPEC, version="1",
                             weight=weight)
    executor.rate_needs = needs
    scheduler.register(executor)
    return executor


@pytest.mark.parametrize("limited", [True, False], ids=["execution_count", "off"])
def test_a_batch_waits_for_the_resource_another_models_batch_holds(limited):
    """Two models share a resource of one copy and two lanes: with the limiter, B's batch waits (a lane idle) until
    A's is back; off, both run at once."""
    async def main():
        lanes = [_Lane("cpu.0"), _Lane("cpu.1")]
        scheduler = StreamScheduler(asyncio.get_running_loop(), lanes, limiter=RateLimiter() if limited else None)
        a = _executor("a", scheduler, lanes, _needs(("R", False, 1)))
        b = _executor("b", scheduler, lanes, _needs(("R", False, 1)))
        fa, fb = a.submit({"x": 1}, 1, ()), b.submit({"x": 2}, 1, ())
        await one_loop_turn()  # the pump the submits scheduled
        busy = [lane for lane in lanes if lane.submitted]
        assert len(busy) == (1 if limited else 2)
        busy[0].finish_next()
        assert await asyncio.wait_for(fa, WAIT_S) == [2]
        for lane in lanes:  # B's batch started when A's came back (at once, off)
            while lane.submitted:
                lane.finish_next()
        assert await asyncio.wait_for(fb, WAIT_S) == [4]
        if limited:
            assert scheduler.limiter.in_use() == {}
    asyncio.run(main())


def test_priority_weighs_the_fair_share():
    """LocalModelHost divides a model's weight by its rate limiter priority (only with the limiter on); of two models
    that have been served the same compute time, the one of priority 1 then goes before the one of priority 2."""
    cfg = parse_pbtxt('name: "m"\ninstance_group [ { kind: KIND_CPU rate_limiter { priority: 2 } } ]', "t")
    model = SimpleNamespace(config=cfg)
    on, off = (SimpleNamespace(scheduler=SimpleNamespace(limiter=limiter)) for limiter in (RateLimiter(), None))
    assert LocalModelHost._rate_needs(on, model, [CPU])[1] == 2
    assert LocalModelHost._rate_needs(off, model, [CPU]) == ({}, 1)  # off: loaded and ignored

    async def main():
        lane = _Lane("cpu.0")
        scheduler = StreamScheduler(asyncio.get_running_loop(), [lane], limiter=RateLimiter())
        low = _executor("low", scheduler, [lane], {}, weight=1 / 2)
        high = _executor("high", scheduler, [lane], {}, weight=1.0)
        for executor in (low, high):  # one batch each, the same compute time served
            future = executor.submit({"x": 1}, 1, ())
            await one_loop_turn()
            lane.finish_next(elapsed_ns=1_000)
            await asyncio.wait_for(future, WAIT_S)
        order = []
        futures = [e.submit({"x": 1}, 1, ()) for e in (low, high)]
        for future, name in zip(futures, ("low", "high")):
            future.add_done_callback(lambda _, name=name: order.append(name))
        await one_loop_turn()
        while lane.submitted:
            lane.finish_next(elapsed_ns=1_000)
        await asyncio.wait_for(asyncio.gather(*futures), WAIT_S)
        return order

    assert asyncio.run(main()) == ["high", "low"]
