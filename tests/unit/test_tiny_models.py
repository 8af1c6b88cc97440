"""core/tiny_models.py: which models are told tiny at load. The probe's inputs from the spec, its timing (the clock
is the test's: the rule, not this machine's speed) and its refusals; and real onnxruntime runners probed on real ONNX
files (a run is timed, a model refusing zeros is not tiny)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from gt_serve.backends.onnx_runner import OnnxRunner
from gt_serve.core import tiny_models
from gt_serve.core.tiny_models import TINY_RUN_NS, is_tiny, probe_feeds, probe_ns
from gt_serve.testing import model_builders as mb
from gt_serve.types import TensorSpec


def spec(mbs: int = 8, **inputs) -> SimpleNamespace:
    return SimpleNamespace(max_batch_size=mbs, output_order=("OUTPUT",), sequence=None,
                           inputs={n: TensorSpec(n, dt, dims) for n, (dt, dims) in inputs.items()})


def test_the_probe_is_the_largest_batch_of_zeros_where_every_shape_is_fixed():
    feeds = probe_feeds(spec(8, A=("FP32", (4,)), B=("INT64", (2, 3))))
    assert {n: (a.shape, a.dtype, a.any()) for n, a in feeds.items()} == {
        "A": ((8, 4), np.float32, False), "B": ((8, 2, 3), np.int64, False)}
    assert probe_feeds(spec(0, A=("FP16", (3, 3))))["A"].shape == (3, 3)  # a model that does not batch
    assert probe_feeds(spec(8, A=("FP32", (-1, 4)))) is None  # a variable dim: which size?
    assert probe_feeds(spec(8, A=("FP32", (4,)), S=("BYTES", (1,)))) is None  # strings: zeros are no request
    assert probe_feeds(spec(8)) is None


class ClockedRunner:
    """Each run advances the test's clock by the next of `durations`; records what it was given."""

    def __init__(self, clock: list, durations: list, fail: bool = False) -> None:
        self.clock, self.durations, self.fail, self.calls = clock, durations, fail, []

    def run(self, feeds, outputs):
        self.calls.append((next(iter(feeds.values())).shape[0], outputs))
        if self.fail:
            raise RuntimeError("zeros are not a valid input here")
        self.clock[0] += self.durations.pop(0)


def test_one_row_first_then_the_quickest_timed_run_of_the_largest_batch(monkeypatch):
    clock = [0]
    monkeypatch.setattr(tiny_models, "_now_ns", lambda: clock[0])
    a = spec(8, A=("FP32", (4,)))
    # a row (set-up run, timed run), then the largest batch (set-up run, three timed runs)
    runner = ClockedRunner(clock, [900_000, 9_000, 700_000, 40_000, 20_000, 25_000])
    assert probe_ns(runner, a) == 20_000
    assert [rows for rows, _ in runner.calls] == [1, 1, 8, 8, 8, 8]
    runner = ClockedRunner(clock, [1, 1, 1, TINY_RUN_NS - 1, TINY_RUN_NS + 5, TINY_RUN_NS])
    assert is_tiny(runner, a)
    runner = ClockedRunner(clock, [1, 1, 1, TINY_RUN_NS, TINY_RUN_NS + 5, TINY_RUN_NS * 9])
    assert not is_tiny(runner, a)
    runner = ClockedRunner(clock, [1, TINY_RUN_NS * 3, TINY_RUN_NS * 2])  # a row alone is too slow, timed twice:
    assert probe_ns(runner, a) == TINY_RUN_NS * 2 and len(runner.calls) == 3  # no larger batch is run
    # a row slow once (its run waited for a core) and quick the second time: the largest batch is probed
    runner = ClockedRunner(clock, [1, TINY_RUN_NS * 3, 10, 1, 20, 30, 40])
    assert probe_ns(runner, a) == 20 and [rows for rows, _ in runner.calls] == [1, 1, 1, 8, 8, 8, 8]
    runner = ClockedRunner(clock, [1, 5, 6, 7])  # a model that does not batch: its one shape, no row first
    assert probe_ns(runner, spec(0, A=("FP32", (4,)))) == 5 and [r for r, _ in runner.calls] == [4] * 4
    assert probe_ns(ClockedRunner(clock, [], fail=True), a) is None
    assert not is_tiny(ClockedRunner(clock, []), spec(8, A=("FP32", (-1,))))  # not probed at all
    assert probe_ns(ClockedRunner(clock, []), spec(8, A=("NOT_A_TYPE", (4,)))) is None  # refused, not raised


def test_real_runners_are_probed_and_a_model_refusing_zeros_is_not_tiny(tmp_path):
    mb.scale(tmp_path / "scale.onnx", width=4)
    runner = OnnxRunner(str(tmp_path / "scale.onnx"), intra_op_threads=1)
    try:
        took = probe_ns(runner, spec(8, INPUT=("FP32", (4,))))
        assert isinstance(took, int) and took > 0
        assert probe_ns(runner, spec(8, INPUT=("FP32", (5,)))) is None  # the graph wants 4: refused, not raised
    finally:
        runner.close()


@pytest.mark.parametrize("mbs", [0, 8])
def test_probe_feeds_match_the_models_client_dims(mbs):
    feeds = probe_feeds(spec(mbs, X=("UINT8", (2,))))
    assert feeds["X"].shape == ((mbs, 2) if mbs else (2,)) and feeds["X"].dtype == np.uint8
