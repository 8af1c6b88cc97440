"""The NumPy twin of kernels/scoring.cu agrees with the router's reference scoring, and the CUDA
source compiles (the GPU parity test is tests/gpu/test_scoring_gpu.py)."""
import math
import random
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gt_serve.backends import scoring
from gt_serve.backends.scoring import KERNEL_NAMES, balanced_score, latency_bound_s, numpy_score
from gt_serve.core.resource_tensor import ResourceTensor
from gt_serve.core.router import (
    RequestDemand,
    Router,
    marginal_energy_j,
    predicted_latency_s,
)

SOURCE = Path(__file__).resolve().parents[2] / "kernels" / "scoring.cu"
COLUMNS = ("alive", "healthy", "parked", "free_mem_bytes", "queue_depth", "queue_limit", "ready_at_s",
           "service_s", "link_s", "wake_s", "marginal_j", "link_j", "wake_j")


def random_tensor(rows: int, seed: int) -> ResourceTensor:
    rng = np.random.default_rng(seed)
    t = ResourceTensor(rows)
    for i in range(rows):
        t.add_row(
            f"r{i}", alive=bool(rng.random() > 0.1), healthy=bool(rng.random() > 0.1),
            parked=bool(rng.random() < 0.3), free_mem_bytes=float(rng.uniform(0, 10)),
            queue_depth=float(rng.integers(0, 10)), queue_limit=float(rng.integers(1, 10)),
            ready_at_s=float(rng.uniform(0, 0.1)), service_s=float(rng.uniform(1e-3, 0.1)),
            link_s=float(rng.choice([0, 0.004])), wake_s=float(rng.uniform(0, 0.02)),
            marginal_j=float(rng.choice([0.1, 0.2, rng.uniform(0, 3)])), link_j=float(rng.choice([0, 0.05])),
            wake_j=float(rng.uniform(0, 20)),
        )
    return t


def columns(t: ResourceTensor) -> list[np.ndarray]:
    snap = t.snapshot()
    return [getattr(snap, c) for c in COLUMNS]


def reference(t: ResourceTensor, now_s: float, mem: float, slo_s: float, eps: float):
    snap = t.snapshot()
    pred = predicted_latency_s(snap, mem, now_s)
    if not np.isfinite(pred).any():
        return pred, np.full_like(pred, np.inf)
    return pred, balanced_score(pred, marginal_energy_j(snap), latency_bound_s(float(pred.min()), eps, slo_s))


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 60), st.integers(0, 10_000), st.floats(0, 0.1), st.floats(0, 10),
       st.floats(0.005, 0.3), st.sampled_from([0.0, 0.1, 0.5, 2.0, math.inf]))
def test_numpy_twin_matches_router_reference(rows, seed, now_s, mem, slo_s, eps) -> None:
    t = random_tensor(rows, seed)
    pred, score = numpy_score(*columns(t), now_s=now_s, mem_bytes=mem, slo_s=slo_s, eps=eps)
    ref_pred, ref_score = reference(t, now_s, mem, slo_s, eps)
    # one rule (backends/scoring.py), the same sums in the same order: equal to the bit
    np.testing.assert_array_equal(pred, ref_pred)
    np.testing.assert_array_equal(score, ref_score)


def test_twin_handles_empty_and_all_blocked() -> None:
    empty = [np.zeros(0, dtype=bool)] * 3 + [np.zeros(0)] * 10
    pred, score = numpy_score(*empty, now_s=0.0, mem_bytes=0.0, slo_s=1.0, eps=0.5)
    assert pred.size == 0 and score.size == 0
    t = random_tensor(5, 0)
    for cid in t.ids:
        t.mark_dead(cid)
    pred, score = numpy_score(*columns(t), now_s=0.0, mem_bytes=0.0, slo_s=1.0, eps=0.5)
    assert np.isinf(pred).all() and np.isinf(score).all()


@pytest.mark.parametrize("policy", ["balanced", "latency", "energy"])
def test_router_with_injected_twin_decides_like_the_default(policy: str) -> None:
    demand = RequestDemand(model="m", mem_bytes=2.0, slo_s=0.15)
    for seed in range(30):
        t = random_tensor(40, seed)
        a = Router(policy, 0.5, random.Random(seed)).choose(t.snapshot(), demand, 0.01)
        b = Router(policy, 0.5, random.Random(seed), scorer=numpy_score).choose(t.snapshot(), demand, 0.01)
        assert (a.row_index, a.candidate_id, a.marginal_energy_j) == (b.row_index, b.candidate_id, b.marginal_energy_j)
        assert a.predicted_latency_s == pytest.approx(b.predicted_latency_s, rel=1e-12)


def test_module_imports_without_cupy() -> None:
    assert scoring.KERNEL_FAMILY == "scoring"
    try:
        import cupy  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError):
            scoring.CupyScorer()


def test_scoring_cu_compiles_to_ptx(tmp_path: Path) -> None:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed: kernels/scoring.cu was not compile-checked")
    ptx = tmp_path / "tmp.ptx"
    result = subprocess.run([nvcc, "--ptx", "-arch=sm_80", "-o", str(ptx), str(SOURCE)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert set(re.findall(r"\.entry\s+(gt_\w+)", ptx.read_text())) == set(KERNEL_NAMES)
    assert "#include" not in SOURCE.read_text()  # NVRTC (CuPy) has no toolkit include path
