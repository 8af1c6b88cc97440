"""The model-memory budget's policy (core/memory_budget.py): which models are evicted, per device."""
from gt_serve.config import ConfigError
from gt_serve.config_layers import parse_config
from gt_serve.core.memory_budget import (
    Candidate,
    MemoryBook,
    choose_victims,
    process_rss_bytes,
)

MB = 1 << 20


def cand(name, mb, idle_since_s, busy=False, replica=False):
    return Candidate(name, mb * MB, idle_since_s, busy, replica)


def test_least_recently_used_goes_first_and_only_as_many_as_needed():
    models = [cand("a", 10, 300.0), cand("b", 10, 100.0), cand("c", 10, 200.0)]
    assert choose_victims(models, 5 * MB) == ["b"]
    assert choose_victims(models, 15 * MB) == ["b", "c"]


def test_busy_models_and_the_one_just_loaded_are_never_evicted():
    models = [cand("old_busy", 50, 1.0, busy=True), cand("new", 50, 2.0), cand("idle", 10, 3.0)]
    assert choose_victims(models, 40 * MB, keep="new") == ["idle"]  # not enough, but nothing else may go
    assert choose_victims([cand("x", 10, 1.0, busy=True)], MB) == []


def test_a_model_with_a_replica_elsewhere_goes_before_a_longer_idle_one():
    models = [cand("only_here", 10, 1.0), cand("replicated", 10, 50.0, replica=True)]
    assert choose_victims(models, MB) == ["replicated"]


def test_book_sums_footprints_per_device_against_its_budget():
    book = MemoryBook(100 * MB, {"gpu": 10 * MB, "gpu:1": 0})
    assert book.enabled
    assert (book.budget_for("cpu"), book.budget_for("gpu:0"), book.budget_for("gpu:1")) == (100 * MB, 10 * MB, 0)
    book.record("a", "1", {"cpu": 60 * MB, "gpu:0": 4 * MB})
    book.record("b", "1", {"cpu": 50 * MB, "gpu:1": 500 * MB})
    assert book.used_bytes("cpu") == 110 * MB
    assert book.over_budget() == {"cpu": 10 * MB}  # gpu:1 unlimited, gpu:0 within its 10 MB
    book.forget("a", "1")
    assert book.over_budget() == {}
    assert book.footprint("a", "1") == {}


def test_no_budget_is_disabled_and_rss_is_read():
    assert not MemoryBook().enabled
    assert process_rss_bytes() > MB


def test_config_keys_and_a_bad_budget_named():
    cfg = parse_config({"lanes": {"model_memory_budget_bytes": 64 * MB, "model_memory_budgets": {"gpu:0": MB}},
                        "server": {"reload_wait_s": 5}})
    assert cfg.lanes.model_memory_budget_bytes == 64 * MB and cfg.server.reload_wait_s == 5.0
    try:
        parse_config({"lanes": {"model_memory_budgets": {"cpu": -1}}})
    except ConfigError as exc:
        assert "lanes.model_memory_budgets.cpu" in str(exc)
    else:
        raise AssertionError("a negative budget was accepted")
