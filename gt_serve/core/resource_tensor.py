"""The resource tensor: one row per routing candidate, one numpy array per column.

A row is a place a request of one model can run: a local lane/device today, a peer node later.
There is one tensor per routed model (rows = the candidates that serve it), so the model-level
estimates (`service_s`, `marginal_j`) are plain columns and scoring is a few vectorised ops.

Columns (struct-of-arrays, `n` live rows packed at the front):

========================  =======  ===============================================================
column                    dtype    meaning
========================  =======  ===============================================================
alive                     bool     False once the candidate is known dead (kept until removed)
healthy                   bool     False while suspect / draining / not ready
parked                    bool     in a low-power state; waking costs `wake_s` and `wake_j`
free_mem_bytes            float64  memory still available for this model's work
queue_depth               float64  requests queued or running on the candidate
queue_limit               float64  back-pressure bound: a full row is not viable (inf = none)
ready_at_s                float64  absolute time the batch a new request would join can start
service_s                 float64  predicted run time of that batch with the new request in it
marginal_j                float64  energy the new request adds to that batch (J above idle)
idle_w/busy_w/parked_w    float64  device power in each state (W)
link_s, link_j            float64  transfer cost to reach the candidate (0 for local lanes)
wake_s, wake_j            float64  cost of waking a parked candidate
free_compute              float64  0..1 share of compute still free (for the cosine baseline)
------------------------  -------  ---------------------------------------------------------------
base_s          (derived) float64  service_s + link_s + (wake_s if parked); +inf when the row is
                                   dead, unhealthy or its queue is full
energy_j        (derived) float64  marginal_j + link_j + (wake_j if parked)
========================  =======  ===============================================================

The derived columns are recomputed whenever a row is written, so a routing decision costs a
handful of vector operations: predicted latency = max(ready_at_s - now_s, 0) + base_s.

The owner (the scheduler, the node view or the simulator) updates rows as their state changes;
routers only read a `TensorSnapshot`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from gt_serve.errors import InvalidArgument, NotFound

BOOL_COLUMNS = ("alive", "healthy", "parked")
FLOAT_COLUMNS = (
    "free_mem_bytes",
    "queue_depth",
    "queue_limit",
    "ready_at_s",
    "service_s",
    "marginal_j",
    "idle_w",
    "busy_w",
    "parked_w",
    "link_s",
    "link_j",
    "wake_s",
    "wake_j",
    "free_compute",
)
DERIVED_COLUMNS = ("base_s", "energy_j")
COLUMNS = BOOL_COLUMNS + FLOAT_COLUMNS
_INF = float("inf")

_DEFAULTS: dict[str, float | bool] = {
    "alive": True,
    "healthy": True,
    "parked": False,
    "free_mem_bytes": float("inf"),
    "queue_limit": float("inf"),
    "free_compute": 1.0,
}


@dataclass(frozen=True, slots=True)
class TensorSnapshot:
    """Read-only views of the first `n` rows. Valid until the tensor is next mutated: take it and
    route in the same synchronous step (or pass `copy=True`)."""

    ids: tuple[str, ...]
    alive: np.ndarray
    healthy: np.ndarray
    parked: np.ndarray
    free_mem_bytes: np.ndarray
    queue_depth: np.ndarray
    queue_limit: np.ndarray
    ready_at_s: np.ndarray
    service_s: np.ndarray
    marginal_j: np.ndarray
    idle_w: np.ndarray
    busy_w: np.ndarray
    parked_w: np.ndarray
    link_s: np.ndarray
    link_j: np.ndarray
    wake_s: np.ndarray
    wake_j: np.ndarray
    free_compute: np.ndarray
    base_s: np.ndarray
    energy_j: np.ndarray

    @property
    def n(self) -> int:
        return len(self.ids)


class ResourceTensor:
    """Growable struct-of-arrays table of candidates, addressed by candidate id or row index."""

    def __init__(self, capacity: int = 16) -> None:
        self._cap = max(1, int(capacity))
        self._n = 0
        self._ids: list[str] = []
        self._row_of: dict[str, int] = {}
        self._cols: dict[str, np.ndarray] = {}
        for name in BOOL_COLUMNS:
            self._cols[name] = np.zeros(self._cap, dtype=bool)
        for name in FLOAT_COLUMNS + DERIVED_COLUMNS:
            self._cols[name] = np.zeros(self._cap, dtype=np.float64)
        self._version = 0
        self._snapshot: TensorSnapshot | None = None

    # ---- shape -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._n

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(self._ids)

    @property
    def version(self) -> int:
        """Bumped on every mutation; lets callers cache derived data."""
        return self._version

    def row(self, candidate_id: str) -> int:
        try:
            return self._row_of[candidate_id]
        except KeyError:
            raise NotFound(f"no candidate {candidate_id!r} in the resource tensor") from None

    def __contains__(self, candidate_id: object) -> bool:
        return candidate_id in self._row_of

    # ---- rows --------------------------------------------------------------------------------
    def add_row(self, candidate_id: str, **values: float | bool) -> int:
        """Append a candidate (a peer appeared, a lane started); returns its row index."""
        if candidate_id in self._row_of:
            raise InvalidArgument(f"candidate {candidate_id!r} is already in the resource tensor")
        if self._n == self._cap:
            self._grow(self._cap * 2)
        row = self._n
        self._n += 1
        self._ids.append(candidate_id)
        self._row_of[candidate_id] = row
        for name, col in self._cols.items():
            col[row] = _DEFAULTS.get(name, 0)
        self._reshaped()
        self._set(row, values)
        return row

    def update(self, candidate_id: str, **values: float | bool) -> None:
        """Set some columns of one row."""
        self._set(self.row(candidate_id), values)

    def update_row(self, row: int, **values: float | bool) -> None:
        if not 0 <= row < self._n:
            raise InvalidArgument(f"row {row} out of range (n={self._n})")
        self._set(row, values)

    def mark_dead(self, candidate_id: str) -> None:
        """The candidate is gone but its row is kept (e.g. until its queued work is re-routed)."""
        self._set(self.row(candidate_id), {"alive": False, "healthy": False})

    def remove_row(self, candidate_id: str) -> None:
        """Remove a candidate; the last row moves into its slot (row indices are not stable)."""
        row = self.row(candidate_id)
        last = self._n - 1
        if row != last:
            moved = self._ids[last]
            for col in self._cols.values():
                col[row] = col[last]
            self._ids[row] = moved
            self._row_of[moved] = row
        self._ids.pop()
        del self._row_of[candidate_id]
        self._n = last
        self._reshaped()

    def get(self, candidate_id: str, column: str) -> float | bool:
        row = self.row(candidate_id)
        return self._column(column)[row].item()

    def column(self, name: str) -> np.ndarray:
        """Read-only view of one column over the live rows."""
        view = self._column(name)[: self._n]
        view.flags.writeable = False
        return view

    # ---- snapshot ----------------------------------------------------------------------------
    def snapshot(self, copy: bool = False) -> TensorSnapshot:
        """Views of the live rows (cached until the next mutation), or copies with `copy=True`."""
        if not copy and self._snapshot is not None:
            return self._snapshot
        n = self._n
        cols = {}
        for name, col in self._cols.items():
            view = col[:n].copy() if copy else col[:n]
            if not copy:
                view = view.view()
                view.flags.writeable = False
            cols[name] = view
        snap = TensorSnapshot(ids=tuple(self._ids), **cols)
        if not copy:
            self._snapshot = snap
        return snap

    # ---- internals ---------------------------------------------------------------------------
    def _column(self, name: str) -> np.ndarray:
        try:
            return self._cols[name]
        except KeyError:
            raise InvalidArgument(f"unknown resource-tensor column {name!r}") from None

    def _set(self, row: int, values: dict[str, float | bool]) -> None:
        cols = self._cols
        for name, value in values.items():
            col = cols.get(name)
            if col is None or name in DERIVED_COLUMNS:
                raise InvalidArgument(f"unknown or derived resource-tensor column {name!r}")
            col[row] = value
        self._derive(row)
        self._touch()

    def _derive(self, row: int) -> None:
        c = self._cols
        parked = bool(c["parked"][row])
        ok = bool(c["alive"][row]) and bool(c["healthy"][row]) and c["queue_depth"][row] < c["queue_limit"][row]
        if ok:
            base = float(c["service_s"][row]) + float(c["link_s"][row])
            c["base_s"][row] = base + float(c["wake_s"][row]) if parked else base
        else:
            c["base_s"][row] = _INF
        energy = float(c["marginal_j"][row]) + float(c["link_j"][row])
        c["energy_j"][row] = energy + float(c["wake_j"][row]) if parked else energy

    def _touch(self) -> None:
        self._version += 1

    def _reshaped(self) -> None:
        # in-place updates stay visible through the cached views; add/remove changes the shape
        self._snapshot = None
        self._touch()

    def _grow(self, capacity: int) -> None:
        for name, col in self._cols.items():
            grown = np.zeros(capacity, dtype=col.dtype)
            grown[: self._n] = col[: self._n]
            self._cols[name] = grown
        self._cap = capacity
        self._snapshot = None


def build_tensor(rows: Iterable[tuple[str, dict[str, float | bool]]]) -> ResourceTensor:
    """Convenience constructor for tests and benchmarks."""
    tensor = ResourceTensor()
    for candidate_id, values in rows:
        tensor.add_row(candidate_id, **values)
    return tensor
