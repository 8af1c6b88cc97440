"""GPU parity: kernels/scoring.cu (via CupyScorer) against the NumPy twin."""
import math

import numpy as np
import pytest

from gt_serve.backends.scoring import CupyScorer, numpy_score

pytestmark = pytest.mark.gpu

COLUMNS = ("alive", "healthy", "parked", "free_mem_bytes", "queue_depth", "queue_limit", "ready_at_s",
           "service_s", "link_s", "wake_s", "marginal_j", "link_j", "wake_j")


@pytest.fixture(scope="module")
def scorer() -> CupyScorer:
    cupy = pytest.importorskip("cupy")
    if cupy.cuda.runtime.getDeviceCount() == 0:
        pytest.skip("no CUDA device")
    return CupyScorer()


def random_columns(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        rng.random(n) > 0.05, rng.random(n) > 0.05, rng.random(n) < 0.2,
        rng.uniform(0, 10, n), rng.integers(0, 10, n).astype(float), rng.integers(1, 10, n).astype(float),
        rng.uniform(0, 0.1, n), rng.uniform(1e-3, 0.1, n), rng.choice([0.0, 0.004], n), rng.uniform(0, 0.02, n),
        rng.uniform(0, 3, n), rng.choice([0.0, 0.05], n), rng.uniform(0, 20, n),
    ]


@pytest.mark.parametrize("n", [1, 7, 255, 256, 257, 10_000, 1_000_003])
@pytest.mark.parametrize("eps", [0.0, 0.5, math.inf])
def test_kernel_matches_numpy_twin(scorer: CupyScorer, n: int, eps: float) -> None:
    cols = random_columns(n, n)
    kwargs = dict(now_s=0.02, mem_bytes=3.0, slo_s=0.12, eps=eps)
    pred, score = scorer(*cols, **kwargs)
    ref_pred, ref_score = numpy_score(*cols, **kwargs)
    np.testing.assert_allclose(pred, ref_pred, rtol=1e-12)
    np.testing.assert_allclose(score, ref_score, rtol=1e-12)
    if np.isfinite(ref_score).any():
        assert int(np.argmin(score)) == int(np.argmin(ref_score))


def test_kernel_edge_cases(scorer: CupyScorer) -> None:
    cols = random_columns(100, 1)
    cols[0] = np.zeros(100, dtype=bool)  # every row dead
    pred, score = scorer(*cols, now_s=0.0, mem_bytes=0.0, slo_s=1.0, eps=0.5)
    assert np.isinf(pred).all() and np.isinf(score).all()
    empty = [c[:0] for c in random_columns(4, 2)]
    pred, score = scorer(*empty, now_s=0.0, mem_bytes=0.0, slo_s=1.0, eps=0.5)
    assert pred.size == 0 and score.size == 0
