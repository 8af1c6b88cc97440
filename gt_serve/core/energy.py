"""Energy model: latency and dynamic energy per (model, device, batch size), idle/parked power.

Power profile schema (one per device, as written under a device in the node YAML)::

    name: "gpu-server"        # optional, for reports
    idle_w: 120.0             # awake and idle (W)                                   required
    busy_w: 700.0             # running flat out (W); used where power_w has no entry required
    parked_w: 60.0            # low-power state (W); default idle_w (cannot park)
    wake_ms: 15.0             # time to leave the parked state; default 0
    park_after_s: 1.0         # idle time before the device parks itself; default never
    latency_ms:               # per model: batch size -> run time of one batch (ms)  required
      resnet50: {1: 1.2, 8: 2.1, 64: 9.0}
      "*": {1: 5.0, 8: 12.0}  # default for models not listed
    power_w:                  # optional, per model: batch size -> average power while running
      resnet50: {1: 250, 64: 650}     # that batch (W); missing -> busy_w

Batch sizes between table entries interpolate linearly; above the largest entry latency and energy
grow with the last segment's slope; below the smallest entry latency is flat and energy falls
linearly to 0 at batch 0. Dynamic energy of a batch is (power_w(b) - idle_w) * latency(b): the
energy above idle that running it costs.

What routing charges is the *marginal* energy of one more request in the batch it would join:
dynamic_j(b + 1) - dynamic_j(b), so a request joining an open batch of 31 on a GPU pays a sliver
while one starting a new batch pays the whole fixed cost.

Tables are refined online with an exponentially weighted moving average of measured latency and
dynamic energy (`EnergyModel.observe`).
"""
from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Mapping

from gt_serve.errors import ConfigError, NotFound

DEFAULT_MODEL_KEY = "*"
_DYNAMIC_W_CACHE = 4096  # (model, batch) entries a profile keeps
# used when a profile has neither the model nor a "*" entry: a slow, unbatched guess
FALLBACK_LATENCY_MS: Mapping[int, float] = {1: 10.0, 8: 60.0}


class Curve:
    """Latency (s) and dynamic energy (J) tabulated on batch sizes; scalar interpolation."""

    __slots__ = ("_b", "_lat", "_dyn")

    def __init__(self, points: Mapping[int, tuple[float, float]]) -> None:
        if not points:
            raise ConfigError("an energy curve needs at least one batch size")
        items = sorted(points.items())
        self._b = [int(b) for b, _ in items]
        self._lat = [float(v[0]) for _, v in items]
        self._dyn = [float(v[1]) for _, v in items]

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(self._b)

    def latency_s(self, batch: float) -> float:
        return self._interp(self._lat, batch, flat_below=True)

    def dynamic_j(self, batch: float) -> float:
        if batch <= 0:
            return 0.0
        return self._interp(self._dyn, batch, flat_below=False)

    def observe(self, batch: int, latency_s: float, dynamic_j: float | None, alpha: float) -> None:
        """EWMA update of the entry at `batch` (inserted, seeded by interpolation, if new)."""
        i = bisect_left(self._b, batch)
        if i == len(self._b) or self._b[i] != batch:
            lat0, dyn0 = self.latency_s(batch), self.dynamic_j(batch)
            self._b.insert(i, batch)
            self._lat.insert(i, lat0)
            self._dyn.insert(i, dyn0)
        self._lat[i] += alpha * (latency_s - self._lat[i])
        if dynamic_j is not None:
            self._dyn[i] += alpha * (dynamic_j - self._dyn[i])

    def _interp(self, ys: list[float], batch: float, flat_below: bool) -> float:
        bs = self._b
        if len(bs) == 1:
            return ys[0] * batch / bs[0] if (batch > bs[0] or not flat_below) else ys[0]
        if batch <= bs[0]:
            return ys[0] if flat_below else ys[0] * batch / bs[0]
        i = bisect_left(bs, batch)
        if i == len(bs):
            i -= 1  # extrapolate with the last segment
        b0, b1 = bs[i - 1], bs[i]
        y0, y1 = ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (batch - b0) / (b1 - b0)


@dataclass(frozen=True, slots=True)
class DeviceProfile:
    """A parsed, validated power profile."""

    name: str
    idle_w: float
    busy_w: float
    parked_w: float
    wake_s: float
    park_after_s: float
    latency_ms: Mapping[str, Mapping[int, float]]
    power_w: Mapping[str, Mapping[int, float]] = field(default_factory=dict)
    # (model, batch) -> dynamic power: charged once per executed batch, so looked up, not re-interpolated
    _dynamic_w: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def wake_j(self) -> float:
        """Energy committed by waking a parked device: the wake itself at idle power, then at
        least `park_after_s` awake before it may park again."""
        if self.parked_w >= self.idle_w:
            return 0.0
        hold_s = self.park_after_s if math.isfinite(self.park_after_s) else 0.0
        return self.idle_w * self.wake_s + (self.idle_w - self.parked_w) * hold_s

    def dynamic_power_w(self, model: str, batch: int) -> float:
        """Power above idle while running a batch of `model` (its power table, else "*", else busy_w;
        flat outside the table)."""
        key = (model, batch)
        cached = self._dynamic_w.get(key)
        if cached is None:
            power = self.power_w.get(model) or self.power_w.get(DEFAULT_MODEL_KEY) or {}
            p_w = _interp_table(power, batch) if power else self.busy_w
            cached = max(p_w - self.idle_w, 0.0)
            if len(self._dynamic_w) < _DYNAMIC_W_CACHE:
                self._dynamic_w[key] = cached
        return cached

    def curve(self, model: str) -> Curve:
        """A fresh curve for `model` (its own table, else the "*" default, else a fallback)."""
        lat = self.latency_ms.get(model) or self.latency_ms.get(DEFAULT_MODEL_KEY) or FALLBACK_LATENCY_MS
        return Curve({b: (ms / 1e3, self.dynamic_power_w(model, b) * ms / 1e3) for b, ms in lat.items()})

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], name: str = "") -> "DeviceProfile":
        where = f"power profile {raw.get('name', name) or '?'}"
        idle_w = _number(raw, "idle_w", where)
        busy_w = _number(raw, "busy_w", where)
        if busy_w < idle_w:
            raise ConfigError(f"{where}: busy_w ({busy_w}) must be >= idle_w ({idle_w})")
        parked_w = _number(raw, "parked_w", where, default=idle_w)
        if parked_w > idle_w:
            raise ConfigError(f"{where}: parked_w ({parked_w}) must be <= idle_w ({idle_w})")
        latency = _tables(raw.get("latency_ms"), "latency_ms", where)
        if not latency:
            raise ConfigError(f"{where}: latency_ms needs at least one model table")
        return cls(
            name=str(raw.get("name", name)),
            idle_w=idle_w,
            busy_w=busy_w,
            parked_w=parked_w,
            wake_s=_number(raw, "wake_ms", where, default=0.0) / 1e3,
            park_after_s=_number(raw, "park_after_s", where, default=math.inf),
            latency_ms=latency,
            power_w=_tables(raw.get("power_w", {}), "power_w", where),
        )


class EnergyModel:
    """Per-device profiles plus per-(model, device) curves refined online."""

    def __init__(self, alpha: float = 0.2) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ConfigError(f"energy model alpha must be in (0, 1], got {alpha}")
        self._alpha = alpha
        self._profiles: dict[str, DeviceProfile] = {}
        self._curves: dict[tuple[str, str], Curve] = {}

    def add_device(self, device: str, profile: DeviceProfile | Mapping[str, Any]) -> DeviceProfile:
        if not isinstance(profile, DeviceProfile):
            profile = DeviceProfile.from_dict(profile, name=device)
        self._profiles[device] = profile
        for key in [k for k in self._curves if k[1] == device]:
            del self._curves[key]
        return profile

    def profile(self, device: str) -> DeviceProfile:
        try:
            return self._profiles[device]
        except KeyError:
            raise NotFound(f"no power profile for device {device!r}") from None

    def curve(self, model: str, device: str) -> Curve:
        key = (model, device)
        curve = self._curves.get(key)
        if curve is None:
            curve = self._curves[key] = self.profile(device).curve(model)
        return curve

    def latency_s(self, model: str, device: str, batch: float) -> float:
        return self.curve(model, device).latency_s(batch)

    def dynamic_j(self, model: str, device: str, batch: float) -> float:
        return self.curve(model, device).dynamic_j(batch)

    def marginal_j(self, model: str, device: str, open_batch: int) -> float:
        """Energy one more request adds to a batch that already holds `open_batch` requests."""
        curve = self.curve(model, device)
        return curve.dynamic_j(open_batch + 1) - curve.dynamic_j(open_batch)

    def observe(
        self, model: str, device: str, batch: int, latency_s: float, dynamic_j: float | None = None
    ) -> None:
        """Fold one measured batch into the tables (EWMA)."""
        self.curve(model, device).observe(batch, latency_s, dynamic_j, self._alpha)

    def row_estimate(
        self,
        model: str,
        device: str,
        *,
        queued: int,
        busy_until_s: float,
        max_batch: int,
        now_s: float,
    ) -> tuple[float, float, float]:
        """(ready_at_s, service_s, marginal_j) of one new request on a single-lane device whose
        lane is busy until `busy_until_s` with `queued` requests waiting: full batches ahead run
        first, the request joins the open one. These are the resource-tensor columns."""
        curve = self.curve(model, device)
        cap = max(int(max_batch), 1)
        full, open_batch = divmod(int(queued), cap)
        ready_at_s = max(busy_until_s, now_s) + full * curve.latency_s(cap)
        service_s = curve.latency_s(open_batch + 1)
        marginal_j = curve.dynamic_j(open_batch + 1) - curve.dynamic_j(open_batch)
        return ready_at_s, service_s, marginal_j


def _interp_table(table: Mapping[int, float], batch: int) -> float:
    clamped = min(max(batch, min(table)), max(table))
    return Curve({b: (v, 0.0) for b, v in table.items()}).latency_s(clamped)


def _number(raw: Mapping[str, Any], key: str, where: str, default: float | None = None) -> float:
    value = raw.get(key, default)
    if value is None:
        raise ConfigError(f"{where}: missing {key}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {key} must be a number, got {value!r}") from None
    if math.isnan(number) or number < 0:
        raise ConfigError(f"{where}: {key} must be >= 0, got {value!r}")
    return number


def _tables(raw: Any, key: str, where: str) -> dict[str, dict[int, float]]:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: {key} must map model name -> {{batch size: value}}")
    tables: dict[str, dict[int, float]] = {}
    for model, table in raw.items():
        if not isinstance(table, Mapping) or not table:
            raise ConfigError(f"{where}: {key}.{model} must be a non-empty {{batch size: value}}")
        parsed: dict[int, float] = {}
        for b, v in table.items():
            try:
                batch, value = int(b), float(v)
            except (TypeError, ValueError):
                raise ConfigError(f"{where}: {key}.{model} has a bad entry {b!r}: {v!r}") from None
            if batch < 1 or not value > 0:
                raise ConfigError(f"{where}: {key}.{model}[{b}] needs batch >= 1 and value > 0")
            parsed[batch] = value
        tables[str(model)] = parsed
    return tables
