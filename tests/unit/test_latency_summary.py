"""Triton's latency summaries (core/latency_summary.py): exact quantiles of what the window holds, a window of the
last 48-60 s in rotating age buckets, bounded memory under a burst, and ModelStats feeding them only when asked."""
from __future__ import annotations

import argparse
import math

import pytest

from gt_serve.cli import _metrics_setting
from gt_serve.config import ServerConfig, validate
from gt_serve.config_layers import parse_config
from gt_serve.core import latency_summary
from gt_serve.core.latency_summary import LatencySummaries, SummarySettings, summary_settings
from gt_serve.core.statistics import ModelStats
from gt_serve.errors import ConfigError

S = 1_000_000_000  # ns


class Clock:
    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns


def _request(summaries: LatencySummaries, us: float) -> None:
    summaries.observe({"request": int(us * 1e3)})


def test_quantiles_are_the_nearest_rank_of_every_observation():
    summaries = LatencySummaries(SummarySettings(), Clock())
    for us in range(100, 0, -1):
        _request(summaries, us)
    assert summaries.quantile_values("request") == [50.0, 90.0, 95.0, 99.0, 100.0]
    assert summaries.count["request"] == 100 and summaries.sum_us["request"] == pytest.approx(5050.0)
    assert all(math.isnan(v) for v in summaries.quantile_values("queue"))  # nothing observed: NaN, as Triton
    assert summaries.count["queue"] == 0


def test_the_window_is_the_last_minute_in_five_buckets():
    clock = Clock()
    summaries = LatencySummaries(SummarySettings(quantiles=(0.99,)), clock)
    _request(summaries, 1000)  # bucket [0, 12 s)
    clock.ns = 30 * S
    _request(summaries, 10)  # bucket [24, 36 s)
    clock.ns = 50 * S
    assert summaries.quantile_values("request") == [1000.0]
    clock.ns = 61 * S  # [0, 12 s) has left the window
    assert summaries.quantile_values("request") == [10.0]
    clock.ns = 95 * S
    assert math.isnan(summaries.quantile_values("request")[0])
    assert summaries.count["request"] == 2 and summaries.sum_us["request"] == pytest.approx(1010.0)  # cumulative


def test_a_burst_keeps_a_bounded_even_sample(monkeypatch):
    monkeypatch.setattr(latency_summary, "MAX_SAMPLES", 64)
    summaries = LatencySummaries(SummarySettings(quantiles=(0.5, 0.9)), Clock())
    for us in range(1, 10_001):
        _request(summaries, us)
    (bucket,) = summaries._buckets
    assert len(bucket["request"].values) < 64 and bucket["request"].stride >= 256
    p50, p90 = summaries.quantile_values("request")
    assert abs(p50 - 5000) <= 2 * bucket["request"].stride and abs(p90 - 9000) <= 2 * bucket["request"].stride
    assert summaries.count["request"] == 10_000  # count and sum are of every observation
    assert summaries.sum_us["request"] == pytest.approx(10_000 * 10_001 / 2)


def test_a_batchs_compute_times_count_once_per_request():
    stats = ModelStats("m", "1", SummarySettings(quantiles=(0.5,)))
    stats.record_batch(4, input_ns=2_000, infer_ns=30_000, output_ns=1_000, request_count=3)
    stats.record_success(request_ns=50_000, queue_ns=5_000)
    stats.record_cache_hit(request_ns=7_000, lookup_ns=1_000)
    s = stats.summaries
    assert (s.count["compute_infer"], s.sum_us["compute_infer"]) == (3, pytest.approx(90.0))
    assert s.quantile_values("compute_input") == [2.0]
    assert (s.count["request"], s.count["queue"]) == (2, 2)  # a cache hit is a request (Triton: included)
    assert ModelStats("m", "1").summaries is None  # off unless asked: nothing is kept


def test_triton_flags_and_config_keys():
    assert _metrics_setting("summary_latencies=true") == ("metrics_summary_latencies", True)
    assert _metrics_setting("counter_latencies=false") == ("metrics_counter_latencies", False)
    assert _metrics_setting("summary_quantiles=0.5:0.05,0.99:0.001") == ("metrics_summary_quantiles", (0.5, 0.99))
    assert _metrics_setting("histogram_latencies=true") == (None, "histogram_latencies=true")  # noted, ignored
    for bad in ("summary_latencies", "summary_quantiles=half", "summary_latencies=maybe"):
        with pytest.raises(argparse.ArgumentTypeError):
            _metrics_setting(bad)
    assert summary_settings(ServerConfig()) is None
    on = parse_config({"server": {"metrics_summary_latencies": True}}).server
    assert summary_settings(on).quantiles == (0.5, 0.9, 0.95, 0.99, 0.999)
    for quantiles in ([0.5, 1.5], [0], ["0.5"], [True]):
        with pytest.raises(ConfigError, match="metrics_summary_quantiles"):
            parse_config({"server": {"metrics_summary_quantiles": quantiles}})
    validate(parse_config({"server": {"metrics_summary_quantiles": [0.5, 1]}}))
