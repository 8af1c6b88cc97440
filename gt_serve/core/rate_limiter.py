"""Triton's rate limiter (`--rate-limit execution_count`; Triton's user guide, "Rate Limiter"), over gt_serve's lanes.

A model's `instance_group` may say what its instances need to run (`rate_limiter { resources [ { name, count,
global } ] priority }`). With the rate limiter on, a batch of the model starts on a lane only while the lane's device
(`cpu`, `gpu:N`) has that many copies of each resource free, and of each global resource the server's one pool;
they are held until the batch is back. A resource's copies on a device are, as in Triton, the most any loaded model
asks for, unless `--rate-limit-resource NAME:COUNT[:DEVICE]` says (DEVICE: a GPU's index; without it, every device).
`priority` weighs the model's fair share between models that could run (priority 2: half the share of priority 1).
Off (Triton's default), the settings are loaded, shown and ignored.

The StreamScheduler asks `allows` before it gives a lane a batch, `acquire`s when it does and `release`s when the
batch is back; what waits is decided again at every batch's return, as any batch waiting for a lane.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from ..config import parse_rate_limit_resource
from ..errors import ConfigError

GLOBAL = "global"


@dataclass(frozen=True)
class Needs:
    """What one batch of a model holds while it runs on a lane of one kind: (resource, global?) -> copies."""
    resources: tuple[tuple[str, bool, int], ...] = ()
    priority: int = 1


def model_needs(cfg: mc.ModelConfig) -> dict[str, Needs]:
    """The config's rate limiter settings by lane kind ("cpu", "gpu"): KIND_CPU's group for CPU lanes, KIND_GPU's
    for GPU lanes, KIND_AUTO's for either where no group of that kind says otherwise."""
    by_kind: dict[str, Needs] = {}
    auto = None
    for group in cfg.instance_group:
        if not group.HasField("rate_limiter"):
            continue
        limiter = group.rate_limiter
        needs = Needs(tuple(sorted((r.name, bool(getattr(r, GLOBAL)), int(r.count)) for r in limiter.resources)),
                      max(1, int(limiter.priority)))
        for r in limiter.resources:
            if not r.name:
                raise ConfigError(f"model '{cfg.name}': instance_group rate_limiter resource without a name")
        if group.kind == mc.ModelInstanceGroup.KIND_CPU:
            by_kind.setdefault("cpu", needs)
        elif group.kind == mc.ModelInstanceGroup.KIND_GPU:
            by_kind.setdefault("gpu", needs)
        elif auto is None:
            auto = needs
    if auto is not None:
        for kind in ("cpu", "gpu"):
            by_kind.setdefault(kind, auto)
    return by_kind


class RateLimiter:
    def __init__(self, resources: tuple[str, ...] = ()) -> None:
        """`resources`: the --rate-limit-resource settings."""
        self._given: dict[tuple[str, str | None], int] = {}
        for text in resources:
            name, count, device = parse_rate_limit_resource(text)
            self._given[(name, device)] = count
        self._needs: dict[Any, dict[str, Needs]] = {}  # executor -> lane kind -> needs
        self._held: Counter = Counter()  # (resource, device key or GLOBAL) -> copies in use
        self._batches: Counter = Counter()  # executor -> its batches holding resources now
        self._retiring: set = set()  # unregistered with batches still out: forgotten when the last is back
        self._copies: dict[tuple[str, str], int] = {}  # `copies`, worked out again when the models change

    # -- models -------------------------------------------------------------------------------------
    def check(self, needs: dict[str, Needs], devices: tuple[str, ...]) -> None:
        """At load (any thread): a model that will run on lanes of `devices` and needs more copies of a resource
        than --rate-limit-resource gives there fails its load (its batches could never start)."""
        for device in devices:
            kind = "gpu" if device.startswith("gpu") else "cpu"
            for name, is_global, count in (needs[kind].resources if kind in needs else ()):
                where = GLOBAL if is_global else device
                given = self._given_copies(name, where)
                if given is not None and count > given:
                    raise ConfigError(f"rate limiter: a batch needs {count} of resource '{name}' on {where} but "
                                      f"--rate-limit-resource gives {given}")

    def register(self, executor: Any, needs: dict[str, Needs]) -> None:
        if needs:
            self._needs[executor] = needs
            self._copies.clear()

    def unregister(self, executor: Any) -> None:
        """An unloaded model; one whose batches still hold resources (an unload that stopped waiting for them)
        gives them back as they come back."""
        if self._batches[executor] > 0:
            self._retiring.add(executor)
        else:
            self._forget(executor)

    def priority(self, needs: dict[str, Needs]) -> int:
        """The model's priority: its groups' highest (the lowest number)."""
        return min((n.priority for n in needs.values()), default=1)

    # -- batches ------------------------------------------------------------------------------------
    def allows(self, executor: Any, lane: Any) -> bool:
        """Whether a batch of `executor` may start on `lane` now."""
        held = self._held
        return all(held[key] + count <= self.copies(*key) for key, count in self._holds(executor, lane))

    def acquire(self, executor: Any, lane: Any) -> None:
        holds = self._holds(executor, lane)
        if holds:
            self._batches[executor] += 1
            for key, count in holds:
                self._held[key] += count

    def release(self, executor: Any, lane: Any) -> None:
        holds = self._holds(executor, lane)
        if not holds:
            return
        for key, count in holds:
            self._held[key] = max(0, self._held[key] - count)
        self._batches[executor] -= 1
        if self._batches[executor] <= 0:
            del self._batches[executor]
            if executor in self._retiring:
                self._retiring.discard(executor)
                self._forget(executor)

    def copies(self, name: str, where: str) -> int:
        """The resource's copies on a device (or in the global pool): --rate-limit-resource's, else the most any
        loaded model's batch holds there (so every model can run)."""
        copies = self._copies.get((name, where))
        if copies is None:
            copies = self._copies[(name, where)] = self._count_copies(name, where)
        return copies

    def _count_copies(self, name: str, where: str) -> int:
        given = self._given_copies(name, where)
        if given is not None:
            return given
        is_global = where == GLOBAL
        kinds = ("cpu", "gpu") if is_global else ("gpu" if where.startswith("gpu") else "cpu",)
        return max((count for needs in self._needs.values() for kind in kinds if kind in needs
                    for r, g, count in needs[kind].resources if r == name and g == is_global), default=0)

    def _given_copies(self, name: str, where: str) -> int | None:
        """--rate-limit-resource's copies of the resource there (a device's own, else every device's), or None."""
        return self._given.get((name, where), self._given.get((name, None)))

    def _holds(self, executor: Any, lane: Any) -> list[tuple[tuple[str, str], int]]:
        """(resource, device key or GLOBAL), copies: what a batch of `executor` holds on `lane` (none: nothing)."""
        needs = self._lane_needs(executor, lane)
        if needs is None:
            return []
        return [((name, GLOBAL if is_global else lane.device), count) for name, is_global, count in needs.resources]

    def _forget(self, executor: Any) -> None:
        if self._needs.pop(executor, None) is not None:
            self._copies.clear()

    def in_use(self) -> dict[str, int]:
        """Copies held now, by "resource@device" (the status page, tests)."""
        return {f"{name}@{where}": n for (name, where), n in sorted(self._held.items()) if n}

    def _lane_needs(self, executor: Any, lane: Any) -> Needs | None:
        needs = self._needs.get(executor)
        if needs is None:
            return None
        return needs.get("gpu" if lane.device.startswith("gpu") else "cpu")
