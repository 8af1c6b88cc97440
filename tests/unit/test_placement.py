"""The pure placement policy: triggers, hysteresis, rate limit, last-replica rule, memory, tie-break."""
from __future__ import annotations

import math

from gt_serve.core.placement import (ModelDemand, NodeLoad, PastDecision, PlacementSettings, PlacementView,
                                     decide)

CFG = PlacementSettings(max_per_minute=2, cold_after_s=30.0, hold_s=5.0, cooldown_s=20.0)
MB = 1 << 20


def fleet(*, a_over: bool = True, b_over: bool = False, c_util: float = 0.1, c_headroom: float = 100 * MB,
          c_j: float = 1.0, d_j: float = 1.0) -> tuple[NodeLoad, ...]:
    return (
        NodeLoad("a", frozenset({"m"}), utilisation=0.95, j_per_inference={"m": 2.0}, default_j=2.0,
                 over=frozenset({"m"}) if a_over else frozenset()),
        NodeLoad("b", frozenset({"m"}), utilisation=0.95, j_per_inference={"m": 2.0}, default_j=2.0,
                 over=frozenset({"m"}) if b_over else frozenset()),
        NodeLoad("c", frozenset(), utilisation=c_util, headroom_bytes=c_headroom, default_j=c_j),
        NodeLoad("d", frozenset(), utilisation=0.1, headroom_bytes=100 * MB, default_j=d_j),
    )


def over_demand(since_s: float = 0.0, **kw) -> tuple[ModelDemand, ...]:
    return (ModelDemand("m", load_ratio=1.6, over_since_s=since_s, mem_bytes=10 * MB, **kw),)


def test_overload_loads_a_replica_on_the_cheapest_idle_peer():
    view = PlacementView("a", fleet(c_j=1.5, d_j=0.5))
    [d] = decide(view, over_demand(), now_s=10.0, cfg=CFG)
    assert (d.action, d.model, d.node, d.reason) == ("load", "m", "d", "overload")


def test_hysteresis_waits_for_the_hold_and_ignores_a_ratio_below_high_water():
    view = PlacementView("a", fleet())
    assert decide(view, over_demand(since_s=8.0), now_s=10.0, cfg=CFG) == []  # over for 2 s < hold 5 s
    calm = (ModelDemand("m", load_ratio=0.9, over_since_s=None, mem_bytes=MB),)
    assert decide(view, calm, now_s=100.0, cfg=CFG) == []
    [d] = decide(view, over_demand(since_s=5.0), now_s=10.0, cfg=CFG)
    assert d.action == "load"


def test_rate_limit_counts_this_nodes_recent_actions():
    history = (PastDecision(0.0, "load", "x", "c"), PastDecision(30.0, "unload", "y", "a"))
    [d] = decide(PlacementView("a", fleet(), history), over_demand(), now_s=50.0, cfg=CFG)
    assert (d.action, d.reason) == ("none", "rate_limited")
    [d] = decide(PlacementView("a", fleet(), history), over_demand(), now_s=61.0, cfg=CFG)  # first one aged out
    assert d.action == "load"


def test_never_unloads_the_last_live_replica_or_a_pinned_one():
    nodes = (NodeLoad("c", frozenset({"m"})), NodeLoad("a", frozenset({"m"}), alive=False))
    cold = (ModelDemand("m", load_ratio=0.0, last_used_s=0.0, loaded_at_s=0.0, pinned=False),)
    [d] = decide(PlacementView("c", nodes), cold, now_s=100.0, cfg=CFG)
    assert (d.action, d.reason) == ("none", "last_replica")
    nodes = (NodeLoad("c", frozenset({"m"})), NodeLoad("a", frozenset({"m"})))
    [d] = decide(PlacementView("c", nodes), cold, now_s=100.0, cfg=CFG)
    assert (d.action, d.node, d.reason) == ("unload", "c", "cold")
    pinned = (ModelDemand("m", load_ratio=0.0, last_used_s=0.0, pinned=True),)
    assert decide(PlacementView("c", nodes), pinned, now_s=100.0, cfg=CFG) == []


def test_cold_is_measured_from_last_use_and_a_fresh_replica_is_kept_for_the_cooldown():
    nodes = (NodeLoad("c", frozenset({"m"})), NodeLoad("a", frozenset({"m"})))
    warm = (ModelDemand("m", load_ratio=0.0, last_used_s=80.0, loaded_at_s=0.0, pinned=False),)
    assert decide(PlacementView("c", nodes), warm, now_s=100.0, cfg=CFG) == []
    fresh = (ModelDemand("m", load_ratio=0.0, last_used_s=0.0, loaded_at_s=95.0, pinned=False),)
    [d] = decide(PlacementView("c", nodes), fresh, now_s=100.0, cfg=PlacementSettings(cold_after_s=1.0,
                                                                                     cooldown_s=20.0))
    assert (d.action, d.reason) == ("none", "cooldown")


def test_memory_budget_excludes_peers_without_headroom():
    view = PlacementView("a", fleet(c_headroom=5 * MB, c_j=0.1, d_j=1.0))
    [d] = decide(view, over_demand(), now_s=10.0, cfg=CFG)
    assert d.node == "d"  # c is cheaper but has 5 MB for a 10 MB model
    tight = (*fleet(c_headroom=5 * MB)[:3], NodeLoad("d", frozenset(), headroom_bytes=MB, default_j=1.0))
    [d] = decide(PlacementView("a", tight), over_demand(), now_s=10.0, cfg=CFG)
    assert (d.action, d.reason) == ("none", "no_memory")


def test_busy_or_more_costly_peers_are_not_targets():
    view = PlacementView("a", fleet(c_util=0.9, d_j=5.0))
    [d] = decide(view, over_demand(), now_s=10.0, cfg=CFG)
    assert (d.action, d.reason) == ("none", "no_cheaper_peer")  # c busy, d costs 5 J vs 2 J here
    view = PlacementView("a", fleet(c_util=0.9, d_j=2.1))  # within the 10 % slack
    [d] = decide(view, over_demand(), now_s=10.0, cfg=CFG)
    assert (d.action, d.node) == ("load", "d")


def test_two_nodes_seeing_the_same_overload_do_not_both_react():
    nodes = fleet(a_over=True, b_over=True)
    a = decide(PlacementView("a", nodes), over_demand(), now_s=10.0, cfg=CFG)
    b = decide(PlacementView("b", nodes), over_demand(), now_s=10.0, cfg=CFG)
    assert [d.action for d in a] == ["load"]
    assert [(d.action, d.reason, d.node) for d in b] == [("none", "deferred", "a")]
    # equal costs and loads: the target is the same whoever asks (name order)
    assert a[0].node == "c"


def test_an_unloaded_pair_is_not_reloaded_within_the_cooldown():
    history = (PastDecision(0.0, "unload", "m", "c"),)
    [d] = decide(PlacementView("a", fleet(c_j=0.1), history), over_demand(), now_s=10.0, cfg=CFG)
    assert d.node == "d"


def test_energy_trigger_moves_meaningful_demand_to_a_much_cheaper_peer():
    cfg = PlacementSettings(energy_gain=0.5)
    calm = (ModelDemand("m", load_ratio=0.5, mem_bytes=MB),)
    [d] = decide(PlacementView("a", fleet(c_j=0.5, d_j=1.5)), calm, now_s=0.0, cfg=cfg)
    assert (d.action, d.node, d.reason) == ("load", "c", "energy")
    assert decide(PlacementView("a", fleet(c_j=1.5, d_j=1.5)), calm, now_s=0.0, cfg=cfg) == []
    assert decide(PlacementView("a", fleet(c_j=0.5)), calm, now_s=0.0, cfg=CFG) == []  # off by default
    assert math.isinf(NodeLoad("x", frozenset()).j_for("m"))


def test_a_second_replica_waits_for_the_first_to_take_load():
    history = (PastDecision(0.0, "load", "m", "c"),)
    [d] = decide(PlacementView("a", fleet(), history), over_demand(), now_s=10.0, cfg=CFG)
    assert (d.action, d.reason) == ("none", "settling")
    [d] = decide(PlacementView("a", fleet(), history), over_demand(), now_s=21.0, cfg=CFG)
    assert (d.action, d.node) == ("load", "c")  # after the settling time: c still shows no replica
