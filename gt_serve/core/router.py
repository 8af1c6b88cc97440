"""Pure routing policies over a resource-tensor snapshot.

`Router(policy, eps, rng).choose(snapshot, demand, now_s) -> RouteDecision`

A row is *viable* when it is alive, healthy, has room for the request's memory and its queue is
not full. Never-viable rows are never chosen; with no viable row `choose` raises Unavailable.

Predicted latency of a row: wait until the batch the request would join can start, plus that
batch's run time, plus the link, plus the wake-up when parked. Marginal energy: the increment the
request adds to that batch, plus link energy, plus the wake commitment when parked.

Policies:
  balanced      (default) keep rows that meet the model's SLO; among those within (1 + eps) of the
                best predicted latency take the lowest marginal energy; ties on energy go to the
                less loaded of two random tied rows (power of two choices, injected RNG).
                With no row meeting the SLO, fall back to the lowest latency.
  latency       balanced with eps = 0: minimum predicted latency (ties: energy, then load)
  energy        balanced with eps = inf: minimum marginal energy among rows meeting the SLO
  round_robin   next viable row after the previous choice (baseline)
  least_loaded  fewest queued+running requests, ties at random (baseline)
  cosine        highest cosine similarity between the demand vector (memory, compute) and the
                free-capacity vector (baseline; also an optional tie-break for balanced)

Everything is vectorised: a handful of numpy operations per decision whatever the row count.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable, Literal, Mapping

import numpy as np

from gt_serve.backends import scoring
from gt_serve.core.resource_tensor import TensorSnapshot
from gt_serve.errors import ConfigError, Unavailable

PolicyName = Literal["balanced", "latency", "energy", "round_robin", "least_loaded", "cosine"]
POLICIES: tuple[str, ...] = ("balanced", "latency", "energy", "round_robin", "least_loaded", "cosine")
TIE_REL = 1e-9  # energies within this relative distance of the best count as a tie
_INF = math.inf

# scorer(alive, healthy, parked, free_mem_bytes, queue_depth, queue_limit, ready_at_s, service_s,
#        link_s, wake_s, marginal_j, link_j, wake_j, *, now_s, mem_bytes, slo_s, eps)
#   -> (predicted_latency_s, score): see gt_serve/backends/scoring.py (NumPy twin, CuPy kernel)
Scorer = Callable[..., tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True, slots=True)
class RequestDemand:
    """What one routing decision asks for."""

    model: str = ""
    batch_size: int = 1
    mem_bytes: float = 0.0
    slo_s: float = _INF  # the model's latency target


@dataclass(frozen=True, slots=True)
class RouteDecision:
    row_index: int
    candidate_id: str
    predicted_latency_s: float
    marginal_energy_j: float


# ---- the scoring rule over a snapshot (written once, in backends/scoring.py) -------------------
def viable_mask(snap: TensorSnapshot, mem_bytes: float) -> np.ndarray:
    return scoring.viable_rows(snap.alive, snap.healthy, snap.free_mem_bytes, snap.queue_depth, snap.queue_limit,
                               mem_bytes)


def predicted_latency_s(snap: TensorSnapshot, mem_bytes: float, now_s: float) -> np.ndarray:
    """Per-row predicted latency of one new request from the raw columns; inf where the row is not
    viable. The reference for `fast_predicted_latency_s`."""
    base = scoring.base_latency_s(snap.service_s, snap.link_s, snap.wake_s, snap.parked)
    return scoring.predict_latency_s(snap.ready_at_s, np.where(viable_mask(snap, mem_bytes), base, _INF), now_s)


def fast_predicted_latency_s(snap: TensorSnapshot, mem_bytes: float, now_s: float) -> np.ndarray:
    """Same values as `predicted_latency_s`, from the tensor's derived `base_s` column (already +inf
    where dead, unhealthy or full): only the memory check is left per request."""
    pred = scoring.predict_latency_s(snap.ready_at_s, snap.base_s, now_s)
    if mem_bytes > 0:
        pred[snap.free_mem_bytes < mem_bytes] = _INF
    return pred


def marginal_energy_j(snap: TensorSnapshot) -> np.ndarray:
    return scoring.marginal_energy_j(snap.marginal_j, snap.link_j, snap.wake_j, snap.parked)


class Router:
    """One routing policy with its own state (round-robin cursor, RNG)."""

    def __init__(
        self,
        policy: str = "balanced",
        eps: float = 0.5,
        rng: random.Random | None = None,
        *,
        tie_break: Literal["load", "cosine"] = "load",
        scorer: Scorer | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise ConfigError(f"unknown router policy {policy!r}; expected one of {', '.join(POLICIES)}")
        if not eps >= 0.0:
            raise ConfigError(f"router eps must be >= 0, got {eps}")
        if tie_break not in ("load", "cosine"):
            raise ConfigError(f"router tie_break must be 'load' or 'cosine', got {tie_break!r}")
        self.policy = policy
        self.eps = 0.0 if policy == "latency" else _INF if policy == "energy" else float(eps)
        self._rng = rng if rng is not None else random.Random(0)
        self._tie_break = tie_break
        self._scorer = scorer
        self._cursor = 0

    def choose(self, snap: TensorSnapshot, demand: RequestDemand, now_s: float) -> RouteDecision:
        if self.policy in ("balanced", "latency", "energy"):
            if self._scorer is not None:
                pred, score = self._external_scores(snap, demand, now_s)
            else:
                pred = fast_predicted_latency_s(snap, demand.mem_bytes, now_s)
                score = self._balanced_scores(snap, demand, pred)
            row = int(score.argmin()) if score.size else 0
            best = score[row] if score.size else _INF
            if best == _INF:
                raise self._unavailable(snap, demand)
            ties = np.flatnonzero(score <= best + abs(best) * TIE_REL)
            if ties.size > 1:
                row = self._break_tie(snap, demand, ties)
        else:
            pred = fast_predicted_latency_s(snap, demand.mem_bytes, now_s)
            viable = np.flatnonzero(pred < _INF)
            if viable.size == 0:
                raise self._unavailable(snap, demand)
            if self.policy == "round_robin":
                row = self._round_robin(viable)
            elif self.policy == "least_loaded":
                row = self._least_loaded(snap, viable)
            else:
                row = self._most_similar(snap, demand, viable)
        return RouteDecision(row, snap.ids[row], float(pred[row]), float(snap.energy_j[row]))

    # ---- policies ----------------------------------------------------------------------------
    def _balanced_scores(self, snap: TensorSnapshot, demand: RequestDemand, pred: np.ndarray) -> np.ndarray:
        if pred.size == 0:
            return pred
        best = pred[int(pred.argmin())]
        if best == _INF:
            return pred
        bound_s = scoring.latency_bound_s(float(best), self.eps, demand.slo_s)
        return scoring.balanced_score(pred, snap.energy_j, bound_s)

    def _external_scores(
        self, snap: TensorSnapshot, demand: RequestDemand, now_s: float
    ) -> tuple[np.ndarray, np.ndarray]:
        assert self._scorer is not None
        return self._scorer(
            snap.alive, snap.healthy, snap.parked, snap.free_mem_bytes, snap.queue_depth,
            snap.queue_limit, snap.ready_at_s, snap.service_s, snap.link_s, snap.wake_s,
            snap.marginal_j, snap.link_j, snap.wake_j,
            now_s=now_s, mem_bytes=demand.mem_bytes, slo_s=demand.slo_s, eps=self.eps,
        )

    def _round_robin(self, viable: np.ndarray) -> int:
        i = int(np.searchsorted(viable, self._cursor))
        row = int(viable[i] if i < viable.size else viable[0])
        self._cursor = row + 1
        return row

    def _least_loaded(self, snap: TensorSnapshot, viable: np.ndarray) -> int:
        load = snap.queue_depth[viable]
        ties = viable[load == load.min()]
        return int(ties[self._rng.randrange(ties.size)]) if ties.size > 1 else int(ties[0])

    def _most_similar(self, snap: TensorSnapshot, demand: RequestDemand, viable: np.ndarray) -> int:
        cos = cosine_similarity(snap, demand, viable)
        ties = viable[cos >= cos.max() - 1e-12]
        return self._power_of_two(snap, ties) if ties.size > 1 else int(ties[0])

    def _break_tie(self, snap: TensorSnapshot, demand: RequestDemand, ties: np.ndarray) -> int:
        if self._tie_break == "cosine":
            return self._most_similar(snap, demand, ties)
        return self._power_of_two(snap, ties)

    def _power_of_two(self, snap: TensorSnapshot, ties: np.ndarray) -> int:
        if ties.size == 2:
            a, b = int(ties[0]), int(ties[1])
        else:
            a, b = (int(ties[i]) for i in self._rng.sample(range(ties.size), 2))
        qa, qb = snap.queue_depth[a], snap.queue_depth[b]
        if qa == qb:
            return a if self._rng.random() < 0.5 else b
        return a if qa < qb else b

    def _unavailable(self, snap: TensorSnapshot, demand: RequestDemand) -> Unavailable:
        n = snap.n
        dead = int(n - np.count_nonzero(snap.alive)) if n else 0
        unhealthy = int(np.count_nonzero(snap.alive & ~snap.healthy)) if n else 0
        no_mem = int(np.count_nonzero(snap.free_mem_bytes < demand.mem_bytes)) if n else 0
        full = int(np.count_nonzero(snap.queue_depth >= snap.queue_limit)) if n else 0
        return Unavailable(
            f"no viable candidate for model {demand.model!r}: {n} candidates, {dead} dead, "
            f"{unhealthy} unhealthy, {no_mem} without {demand.mem_bytes:.0f} bytes free, {full} with full queues",
            model=demand.model, candidates=n,
        )


def cosine_similarity(snap: TensorSnapshot, demand: RequestDemand, rows: np.ndarray) -> np.ndarray:
    """cos(demand, free capacity) per row in `rows`; each dimension scaled by its max over `rows`
    so that bytes and compute shares are comparable."""
    mem = snap.free_mem_bytes[rows]
    finite = mem[np.isfinite(mem)]
    mem_scale = finite.max() if finite.size and finite.max() > 0 else 1.0
    mem = np.minimum(mem, mem_scale) / mem_scale
    compute = snap.free_compute[rows]
    want_mem = min(demand.mem_bytes / mem_scale, 1.0)
    want_compute = 1.0
    dot = want_mem * mem + want_compute * compute
    norm = math.hypot(want_mem, want_compute) * np.hypot(mem, compute)
    return np.divide(dot, norm, out=np.zeros_like(dot), where=norm > 0)


class RouterSet:
    """Per-model policy selection: a default router plus overrides by model name."""

    def __init__(self, default: Router, per_model: Mapping[str, Router] | None = None) -> None:
        self._default = default
        self._per_model = dict(per_model or {})

    def for_model(self, model: str) -> Router:
        return self._per_model.get(model, self._default)

    def choose(self, snap: TensorSnapshot, demand: RequestDemand, now_s: float) -> RouteDecision:
        return self.for_model(demand.model).choose(snap, demand, now_s)
