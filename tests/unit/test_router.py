import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gt_serve.backends.scoring import latency_bound_s
from gt_serve.core.resource_tensor import ResourceTensor, build_tensor
from gt_serve.core.router import (
    POLICIES,
    RequestDemand,
    Router,
    RouterSet,
    cosine_similarity,
    fast_predicted_latency_s,
    marginal_energy_j,
    predicted_latency_s,
    viable_mask,
)
from gt_serve.errors import ConfigError, Unavailable

DEMAND = RequestDemand(model="m", slo_s=1.0)


def row_strategy() -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({
        "alive": st.booleans(),
        "healthy": st.booleans(),
        "parked": st.booleans(),
        "free_mem_bytes": st.floats(0, 10.0),
        "queue_depth": st.integers(0, 8).map(float),
        "queue_limit": st.integers(1, 8).map(float),
        "ready_at_s": st.floats(0, 0.2),
        "service_s": st.floats(1e-4, 0.2),
        "marginal_j": st.floats(0, 5.0),
        "link_s": st.sampled_from([0.0, 0.003]),
        "link_j": st.sampled_from([0.0, 0.1]),
        "wake_s": st.floats(0, 0.05),
        "wake_j": st.floats(0, 50.0),
        "free_compute": st.floats(0, 1),
    })


tensors = st.lists(row_strategy(), min_size=1, max_size=12).map(
    lambda rows: build_tensor((f"c{i}", r) for i, r in enumerate(rows))
)
demands = st.builds(RequestDemand, model=st.just("m"), mem_bytes=st.floats(0, 5.0), slo_s=st.floats(0.01, 1.0))


@settings(max_examples=200, deadline=None)
@given(tensors, demands, st.floats(0, 0.3))
def test_fast_path_matches_reference(tensor: ResourceTensor, demand: RequestDemand, now_s: float) -> None:
    snap = tensor.snapshot()
    np.testing.assert_array_equal(  # the tensor's base_s column sums as scoring.base_latency_s does
        fast_predicted_latency_s(snap, demand.mem_bytes, now_s), predicted_latency_s(snap, demand.mem_bytes, now_s)
    )
    np.testing.assert_allclose(snap.energy_j, marginal_energy_j(snap))


@settings(max_examples=200, deadline=None)
@given(tensors, demands, st.floats(0, 0.3), st.sampled_from(POLICIES), st.floats(0, 4))
def test_never_chooses_a_non_viable_row(tensor, demand, now_s, policy, eps) -> None:
    snap = tensor.snapshot()
    viable = viable_mask(snap, demand.mem_bytes)
    router = Router(policy, eps, random.Random(1))
    if not viable.any():
        with pytest.raises(Unavailable, match="no viable candidate"):
            router.choose(snap, demand, now_s)
        return
    for k in range(3):
        decision = router.choose(snap, demand, now_s + k * 0.01)
        assert viable[decision.row_index]
        assert decision.candidate_id == snap.ids[decision.row_index]
        expected = predicted_latency_s(snap, demand.mem_bytes, now_s + k * 0.01)[decision.row_index]
        assert decision.predicted_latency_s == pytest.approx(expected)


@settings(max_examples=200, deadline=None)
@given(tensors, demands, st.floats(0, 0.3))
def test_eps_zero_is_the_latency_policy(tensor, demand, now_s) -> None:
    snap = tensor.snapshot()
    if not viable_mask(snap, demand.mem_bytes).any():
        return
    a = Router("balanced", 0.0, random.Random(7)).choose(snap, demand, now_s)
    b = Router("latency", 0.9, random.Random(7)).choose(snap, demand, now_s)
    assert a == b
    pred = predicted_latency_s(snap, demand.mem_bytes, now_s)
    assert a.predicted_latency_s == pytest.approx(pred.min())


@settings(max_examples=100, deadline=None)
@given(row_strategy(), demands, st.sampled_from(POLICIES), st.floats(0, 4))
def test_one_candidate_never_changes_the_route(row, demand, policy, eps) -> None:
    row.update(alive=True, healthy=True, queue_depth=0.0, free_mem_bytes=10.0)
    tensor = build_tensor([("only", row)])
    router = Router(policy, eps, random.Random(3))
    for k in range(20):
        tensor.update("only", ready_at_s=k * 0.05, marginal_j=float(k), parked=bool(k % 2))
        decision = router.choose(tensor.snapshot(), demand, k * 0.01)
        assert (decision.row_index, decision.candidate_id) == (0, "only")


def two_rows(a: dict, b: dict) -> ResourceTensor:
    return build_tensor([("a", a), ("b", b)])


def test_balanced_trades_latency_slack_for_energy() -> None:
    t = two_rows({"service_s": 0.010, "marginal_j": 1.0}, {"service_s": 0.014, "marginal_j": 0.2})
    snap = t.snapshot()
    assert Router("balanced", 0.5).choose(snap, DEMAND, 0.0).candidate_id == "b"
    assert Router("balanced", 0.2).choose(snap, DEMAND, 0.0).candidate_id == "a"
    assert Router("latency").choose(snap, DEMAND, 0.0).candidate_id == "a"
    d = Router("energy").choose(snap, DEMAND, 0.0)
    assert (d.candidate_id, d.marginal_energy_j) == ("b", pytest.approx(0.2))


def test_latency_policy_ignores_energy_even_for_a_tiny_latency_gap() -> None:
    t = two_rows({"service_s": 0.0100, "marginal_j": 5.0}, {"service_s": 0.0101, "marginal_j": 0.01})
    for router in (Router("latency", 3.0), Router("balanced", 0.0)):
        assert router.choose(t.snapshot(), DEMAND, 0.0).candidate_id == "a"
    assert Router("balanced", 0.02).choose(t.snapshot(), DEMAND, 0.0).candidate_id == "b"


def test_queue_wait_counts_in_predicted_latency() -> None:
    t = two_rows({"service_s": 0.010, "ready_at_s": 0.050}, {"service_s": 0.030})
    decision = Router("latency").choose(t.snapshot(), DEMAND, now_s=0.0)
    assert decision.candidate_id == "b" and decision.predicted_latency_s == pytest.approx(0.030)
    decision = Router("latency").choose(t.snapshot(), DEMAND, now_s=0.045)  # a's wait almost over
    assert decision.candidate_id == "a" and decision.predicted_latency_s == pytest.approx(0.015)


def test_parked_rows_pay_wake_latency_and_energy() -> None:
    t = two_rows({"service_s": 0.010, "marginal_j": 0.5}, {"service_s": 0.010, "marginal_j": 0.1, "parked": True,
                                                             "wake_s": 0.002, "wake_j": 10.0})
    d = Router("balanced", 1.0).choose(t.snapshot(), DEMAND, 0.0)
    assert d.candidate_id == "a"  # waking b costs 10 J
    t.update("b", parked=False)
    assert Router("balanced", 1.0).choose(t.snapshot(), DEMAND, 0.0).candidate_id == "b"


def test_slo_caps_the_latency_slack_and_falls_back_to_min_latency() -> None:
    t = two_rows({"service_s": 0.010, "marginal_j": 1.0}, {"service_s": 0.030, "marginal_j": 0.1})
    tight = RequestDemand(model="m", slo_s=0.020)
    assert Router("balanced", 5.0).choose(t.snapshot(), tight, 0.0).candidate_id == "a"
    assert Router("energy").choose(t.snapshot(), tight, 0.0).candidate_id == "a"
    loose = RequestDemand(model="m", slo_s=0.050)
    assert Router("energy").choose(t.snapshot(), loose, 0.0).candidate_id == "b"
    impossible = RequestDemand(model="m", slo_s=0.001)
    for policy in ("balanced", "energy", "latency"):
        assert Router(policy, 5.0).choose(t.snapshot(), impossible, 0.0).candidate_id == "a"


def test_latency_bound_rules() -> None:
    assert latency_bound_s(0.01, 0.5, 1.0) == pytest.approx(0.015)
    assert latency_bound_s(0.01, 0.5, 0.012) == pytest.approx(0.012)
    assert latency_bound_s(0.02, 0.5, 0.01) == pytest.approx(0.02)
    assert latency_bound_s(0.01, math.inf, 0.5) == 0.5
    assert math.isfinite(latency_bound_s(0.01, math.inf, math.inf))


def test_energy_ties_go_to_the_less_loaded_row() -> None:
    t = two_rows({"service_s": 0.01, "marginal_j": 0.3, "queue_depth": 5},
                 {"service_s": 0.01, "marginal_j": 0.3, "queue_depth": 2})
    router = Router("balanced", 0.5, random.Random(0))
    assert {router.choose(t.snapshot(), DEMAND, 0.0).candidate_id for _ in range(50)} == {"b"}


def test_power_of_two_choices_never_picks_the_most_loaded_of_three_ties() -> None:
    t = build_tensor([(c, {"service_s": 0.01, "marginal_j": 0.3, "queue_depth": q}) for c, q in
                      (("a", 1), ("b", 9), ("c", 4))])
    router = Router("balanced", 0.5, random.Random(0))
    picks = [router.choose(t.snapshot(), DEMAND, 0.0).candidate_id for _ in range(300)]
    assert "b" not in picks and {"a", "c"} == set(picks)
    assert picks.count("a") > picks.count("c")  # a wins every pair it is in


def test_round_robin_cycles_over_viable_rows() -> None:
    t = build_tensor([(c, {"service_s": 0.01}) for c in "abcd"])
    t.mark_dead("c")
    router = Router("round_robin")
    picks = [router.choose(t.snapshot(), DEMAND, 0.0).candidate_id for _ in range(6)]
    assert picks == ["a", "b", "d", "a", "b", "d"]


def test_least_loaded_and_full_queues() -> None:
    t = build_tensor([("a", {"queue_depth": 3, "queue_limit": 4}), ("b", {"queue_depth": 1}),
                      ("c", {"queue_depth": 0, "queue_limit": 0})])
    assert Router("least_loaded").choose(t.snapshot(), DEMAND, 0.0).candidate_id == "b"


def test_memory_demand_excludes_rows() -> None:
    t = two_rows({"service_s": 0.001, "free_mem_bytes": 1e9}, {"service_s": 0.1, "free_mem_bytes": 8e9})
    demand = RequestDemand(model="m", mem_bytes=2e9, slo_s=1.0)
    for policy in POLICIES:
        assert Router(policy).choose(t.snapshot(), demand, 0.0).candidate_id == "b"


def test_cosine_prefers_capacity_shaped_like_the_demand() -> None:
    t = two_rows({"free_mem_bytes": 8e9, "free_compute": 0.1}, {"free_mem_bytes": 2e9, "free_compute": 0.9})
    compute_heavy = RequestDemand(model="m", mem_bytes=1e6, slo_s=1.0)
    memory_heavy = RequestDemand(model="m", mem_bytes=7.9e9, slo_s=1.0)
    snap = t.snapshot()
    assert Router("cosine").choose(snap, compute_heavy, 0.0).candidate_id == "b"
    assert Router("cosine").choose(snap, memory_heavy, 0.0).candidate_id == "a"
    cos = cosine_similarity(snap, compute_heavy, np.arange(2))
    assert np.all((cos >= 0) & (cos <= 1 + 1e-12))


def test_cosine_as_tie_break() -> None:
    t = two_rows({"service_s": 0.01, "marginal_j": 0.3, "free_compute": 0.2, "queue_depth": 0},
                 {"service_s": 0.01, "marginal_j": 0.3, "free_compute": 0.9, "queue_depth": 3})
    assert Router("balanced", tie_break="cosine").choose(t.snapshot(), DEMAND, 0.0).candidate_id == "b"
    assert Router("balanced", tie_break="load").choose(t.snapshot(), DEMAND, 0.0).candidate_id == "a"


def test_unavailable_message_names_the_reasons() -> None:
    t = build_tensor([("a", {}), ("b", {"queue_depth": 2, "queue_limit": 2}), ("c", {"free_mem_bytes": 1.0})])
    t.mark_dead("a")
    with pytest.raises(Unavailable) as info:
        Router().choose(t.snapshot(), RequestDemand(model="m", mem_bytes=10.0), 0.0)
    text = str(info.value)
    assert "model 'm'" in text and "3 candidates, 1 dead" in text and "1 with full queues" in text
    with pytest.raises(Unavailable):
        Router().choose(ResourceTensor().snapshot(), DEMAND, 0.0)


def test_bad_configuration() -> None:
    with pytest.raises(ConfigError):
        Router("fastest")
    with pytest.raises(ConfigError):
        Router("balanced", -1.0)
    with pytest.raises(ConfigError):
        Router("balanced", tie_break="coin")  # type: ignore[arg-type]


def test_router_set_selects_per_model() -> None:
    t = two_rows({"service_s": 0.010, "marginal_j": 1.0}, {"service_s": 0.014, "marginal_j": 0.2})
    routers = RouterSet(Router("latency"), {"frugal": Router("energy")})
    assert routers.choose(t.snapshot(), RequestDemand(model="x", slo_s=1.0), 0.0).candidate_id == "a"
    assert routers.choose(t.snapshot(), RequestDemand(model="frugal", slo_s=1.0), 0.0).candidate_id == "b"
