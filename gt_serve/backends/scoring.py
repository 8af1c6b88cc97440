"""Balanced-policy scoring of a resource tensor: the rule, its NumPy twin and the CuPy kernel wrapper.

The rule is written once, here, over plain column arrays (the router in core and the twin both
use it; backends may not import core, core may import backends):
  viable_rows          alive, healthy, room for the request's memory, queue not full;
  base_latency_s       service + link + wake-up when parked: the part that does not age;
  predict_latency_s    max(ready_at_s - now_s, 0) + base: one new request's predicted latency;
  marginal_energy_j    marginal + link + wake-up commitment when parked;
  latency_bound_s      rows at or under it compete on energy (eps and the SLO);
  balanced_score       energy within the bound, +inf elsewhere.

`numpy_score` (host twin of kernels/scoring.cu) and `CupyScorer` take the tensor's columns and
return `(predicted_latency_s, score)`: latency per row (+inf where not viable) and the balanced
score. Either can be passed to `Router(scorer=...)`.

CuPy is imported lazily in `CupyScorer.__init__`, never at module import.
"""
from __future__ import annotations

import importlib
import math
from pathlib import Path
from typing import Any

import numpy as np

KERNEL_FAMILY = "scoring"
KERNEL_NAMES = ("gt_score_latency", "gt_score_balanced")
_MAX_FINITE = float(np.finfo(np.float64).max)


def viable_rows(
    alive: np.ndarray, healthy: np.ndarray, free_mem_bytes: np.ndarray, queue_depth: np.ndarray,
    queue_limit: np.ndarray, mem_bytes: float,
) -> np.ndarray:
    mask = alive.astype(bool) & healthy.astype(bool)
    mask &= free_mem_bytes >= mem_bytes
    mask &= queue_depth < queue_limit
    return mask


def base_latency_s(service_s: np.ndarray, link_s: np.ndarray, wake_s: np.ndarray, parked: np.ndarray) -> np.ndarray:
    """Service + link + wake-up when parked (the resource tensor keeps it per row as `base_s`)."""
    return service_s + link_s + np.where(parked.astype(bool), wake_s, 0.0)


def predict_latency_s(ready_at_s: np.ndarray, base_s: np.ndarray, now_s: float) -> np.ndarray:
    """Wait for the batch the request would join, then `base_s`; +inf stays +inf (not viable)."""
    pred = ready_at_s - now_s
    np.maximum(pred, 0.0, out=pred)
    pred += base_s
    return pred


def marginal_energy_j(marginal_j: np.ndarray, link_j: np.ndarray, wake_j: np.ndarray, parked: np.ndarray) -> np.ndarray:
    return marginal_j + link_j + np.where(parked.astype(bool), wake_j, 0.0)


def latency_bound_s(best_s: float, eps: float, slo_s: float) -> float:
    """Rows with predicted latency <= bound compete on energy. Always finite, so rows at +inf
    (not viable) never compete."""
    if best_s > slo_s:
        return best_s  # nobody meets the SLO: pure minimum latency
    bound = slo_s if math.isinf(eps) else min((1.0 + eps) * best_s, slo_s)
    return min(bound, _MAX_FINITE)


def balanced_score(pred_s: np.ndarray, energy_j: np.ndarray, bound_s: float) -> np.ndarray:
    return np.where(pred_s <= bound_s, energy_j, math.inf)


def numpy_score(
    alive: np.ndarray,
    healthy: np.ndarray,
    parked: np.ndarray,
    free_mem_bytes: np.ndarray,
    queue_depth: np.ndarray,
    queue_limit: np.ndarray,
    ready_at_s: np.ndarray,
    service_s: np.ndarray,
    link_s: np.ndarray,
    wake_s: np.ndarray,
    marginal_j: np.ndarray,
    link_j: np.ndarray,
    wake_j: np.ndarray,
    *,
    now_s: float,
    mem_bytes: float,
    slo_s: float,
    eps: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Host twin of kernels/scoring.cu (gt_score_latency, min, gt_score_balanced)."""
    viable = viable_rows(alive, healthy, free_mem_bytes, queue_depth, queue_limit, mem_bytes)
    base = np.where(viable, base_latency_s(service_s, link_s, wake_s, parked), math.inf)
    pred = predict_latency_s(ready_at_s, base, now_s)
    if pred.size == 0:
        return pred, pred.copy()
    best = float(pred.min())
    if best == math.inf:
        return pred, np.full_like(pred, np.inf)
    bound = latency_bound_s(best, eps, slo_s)
    return pred, balanced_score(pred, marginal_energy_j(marginal_j, link_j, wake_j, parked), bound)


class CupyScorer:
    """`numpy_score` on the GPU: loads kernels/scoring.cu with cupy.RawModule (lazily, by name).

    Worth it only for large tensors (thousands of rows) that already live on the device; inputs
    may be numpy (copied up) or cupy arrays. Results come back as numpy arrays.
    """

    def __init__(self, kernels_dir: Path | None = None, device_id: int = 0, threads: int = 256) -> None:
        self._cp = importlib.import_module("cupy")  # ImportError when CuPy is absent
        from gt_serve.backends.cupy_backend import kernel_source

        self._device_id = device_id
        self._threads = threads
        with self._cp.cuda.Device(device_id):
            module = self._cp.RawModule(
                code=kernel_source(KERNEL_FAMILY, kernels_dir),
                options=("--std=c++14",),
                name_expressions=KERNEL_NAMES,
            )
            self._latency = module.get_function("gt_score_latency")
            self._balanced = module.get_function("gt_score_balanced")

    def __call__(self, *columns: Any, **kwargs: Any) -> tuple[np.ndarray, np.ndarray]:
        return self.score(*columns, **kwargs)

    def score(
        self,
        alive: Any, healthy: Any, parked: Any, free_mem_bytes: Any, queue_depth: Any,
        queue_limit: Any, ready_at_s: Any, service_s: Any, link_s: Any, wake_s: Any,
        marginal_j: Any, link_j: Any, wake_j: Any,
        *,
        now_s: float, mem_bytes: float, slo_s: float, eps: float,
    ) -> tuple[np.ndarray, np.ndarray]:
        cp = self._cp
        n = len(alive)
        with cp.cuda.Device(self._device_id):
            u8 = [cp.asarray(np.asarray(a, dtype=np.uint8)) if isinstance(a, np.ndarray)
                  else cp.asarray(a).astype(cp.uint8) for a in (alive, healthy, parked)]
            f64 = [cp.ascontiguousarray(cp.asarray(a, dtype=cp.float64)) for a in (
                free_mem_bytes, queue_depth, queue_limit, ready_at_s, service_s, link_s, wake_s,
                marginal_j, link_j, wake_j)]
            pred = cp.empty(n, dtype=cp.float64)
            score = cp.empty(n, dtype=cp.float64)
            if n == 0:
                return cp.asnumpy(pred), cp.asnumpy(score)
            blocks = min((n + self._threads - 1) // self._threads, 4096)
            self._latency(
                (blocks,), (self._threads,),
                (*u8, *f64[:7], np.float64(now_s), np.float64(mem_bytes), np.int64(n), pred),
            )
            best = float(pred.min())
            if best == math.inf:
                score.fill(math.inf)
            else:
                bound = latency_bound_s(best, eps, slo_s)
                self._balanced(
                    (blocks,), (self._threads,),
                    (pred, u8[2], *f64[7:], np.float64(bound), np.int64(n), score),
                )
            return cp.asnumpy(pred), cp.asnumpy(score)
