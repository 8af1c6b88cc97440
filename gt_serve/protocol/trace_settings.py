"""The trace extension's settings (`/v2/trace/setting`, `/v2/models/{m}/trace/setting`, gRPC TraceSetting):
validated, bounded, and the sampling decision that follows from them.

One TraceSettings is owned by the app and given to both front ends (protocol/tracing.py wraps it with the
span export). Triton's rules, kept here:
- per-model settings exist only for a ready model (the caller checks: 400 'Request for unknown model : M');
- `trace_file` and `trace_mode` cannot be changed over the network;
- `trace_level` is ["OFF"] alone, or a set of "TIMESTAMPS" / "TENSORS" (those the tracer supports);
- `trace_rate` and `log_frequency` are uint32, `trace_count` an int32 of -1 (no limit) or more, sent as strings;
- a null value clears a model's own setting (the global one applies again) or resets a global one to its
  start-up value;
- sampling: 1 request in `trace_rate` (the first, then every rate-th; 0 = none) until `trace_count` traces
  were taken; models without settings of their own share the global counters, as in Triton. A request
  whose client `traceparent` is sampled is traced whatever the rate (the trace is already being taken),
  still within the count. Updating a scope's settings restarts its counters.
Unlike Triton, an unknown setting is refused (400) instead of ignored. Bounded: every stored value is a
normalised level tuple or integer string, and at most `max_models` models have their own settings.
"""
from __future__ import annotations

from ..errors import InvalidArgument, Unsupported

MAX_MODELS = 1024  # models with their own trace settings (they must also be ready models)
_DEFAULTS: dict[str, object] = {"trace_level": ("OFF",), "trace_rate": "1000", "trace_count": "-1",
                                "log_frequency": "0", "trace_file": "", "trace_mode": "triton"}
_LEVELS = ("TIMESTAMPS", "TENSORS")  # in the order they are reported
_MAX_LEVEL_NAMES = 8
_INT_RANGES = {"trace_rate": (0, 2**32 - 1), "log_frequency": (0, 2**32 - 1), "trace_count": (-1, 2**31 - 1)}
_READ_ONLY = ("trace_file", "trace_mode")


class _Sampler:
    """The counters of one scope (the global settings, or a model's own)."""

    __slots__ = ("on", "rate", "remaining", "seen")

    def __init__(self, settings: dict) -> None:
        self.on = settings["trace_level"] != ("OFF",)
        self.rate = int(settings["trace_rate"])
        self.remaining = int(settings["trace_count"])  # -1: no limit
        self.seen = 0

    def take(self, parent_sampled: bool) -> bool:
        if not self.on or self.remaining == 0:
            return False
        if not parent_sampled:
            seen = self.seen
            self.seen = seen + 1
            if not self.rate or seen % self.rate:
                return False
        if self.remaining > 0:
            self.remaining -= 1
        return True


class TraceSettings:
    """`active` is the one check a request pays with tracing off: False unless some scope's level is on
    (and tracing is available: `unavailable` is None)."""

    def __init__(self, max_models: int = MAX_MODELS, *, initial: dict | None = None,
                 levels: tuple[str, ...] = _LEVELS, unavailable: str | None = None, mode: str = "triton") -> None:
        """`initial`: start-up values of the updatable settings (the server's tracing config); `levels`: the
        levels the tracer records (others: Unsupported); `unavailable`: why tracing cannot be turned on here
        (any level but OFF is then refused with it); `mode`: the trace_mode reported."""
        self._levels = levels
        self._unavailable = unavailable
        self._start = {**_DEFAULTS, "trace_mode": mode}
        self._start.update({key: self._validated(key, value) for key, value in (initial or {}).items()
                            if key not in _READ_ONLY})
        self._global: dict[str, object] = dict(self._start)
        self._models: dict[str, dict[str, object]] = {}
        self._max_models = max_models
        self._global_sampler = _Sampler(self._global)
        self._samplers: dict[str, _Sampler] = {}
        self.active = False
        self._refresh(None)

    @property
    def model_count(self) -> int:
        return len(self._models)

    def get(self, model: str = "") -> dict:
        """The settings in effect for `model` ("" = the global ones), as the JSON the protocol returns."""
        out = self._effective(model)
        out["trace_level"] = list(out["trace_level"])
        return out

    def _effective(self, model: str) -> dict:
        out = dict(self._global)
        out.update(self._models.get(model, {}))
        return out

    def sample(self, model: str, parent_sampled: bool = False) -> bool:
        """Whether to trace this request of `model` (counts it against its scope's rate and count)."""
        sampler = self._samplers.get(model) or self._global_sampler
        return sampler.take(parent_sampled)

    def update(self, model: str, doc: dict) -> dict:
        """Apply a POSTed settings object (all of it or nothing); returns the settings now in effect."""
        changes = {key: self._validated(key, value) for key, value in doc.items()}
        if not model:
            for key, value in changes.items():
                self._global[key] = self._start[key] if value is None else value
            self._refresh(None)
            return self.get()
        own = self._models.get(model)
        if own is None:
            if all(value is None for value in changes.values()):
                return self.get(model)
            if len(self._models) >= self._max_models:
                raise InvalidArgument(f"trace settings: {self._max_models} models already have their own settings; "
                                      "clear some (null values) first")
            own = self._models[model] = {}
        for key, value in changes.items():
            if value is None:
                own.pop(key, None)
            else:
                own[key] = value
        if not own:
            del self._models[model]
        self._refresh(model)
        return self.get(model)

    def _refresh(self, model: str | None) -> None:
        """New counters for the scope updated (the global one: every scope, as models inherit from it)."""
        if model is None:
            self._global_sampler = _Sampler(self._global)
            self._samplers = {name: _Sampler(self._effective(name)) for name in self._models}
        elif model in self._models:
            self._samplers[model] = _Sampler(self._effective(model))
        else:
            self._samplers.pop(model, None)
        self.active = self._unavailable is None and (
            self._global_sampler.on or any(s.on for s in self._samplers.values()))

    def _validated(self, key: str, value):
        value = _validated(key, value, self._levels)
        if key == "trace_level" and value not in (None, ("OFF",)) and self._unavailable is not None:
            raise Unsupported(self._unavailable)
        return value


def _validated(key: str, value, levels: tuple[str, ...] = _LEVELS):
    if not isinstance(key, str) or key not in _DEFAULTS:
        raise InvalidArgument(f"unknown trace setting '{str(key)[:64]}' (known: {', '.join(_DEFAULTS)})")
    if key in _READ_ONLY:
        raise Unsupported(f"{key} can not be updated through network protocol")
    if value is None:
        return None
    if key == "trace_level":
        return _levels(value, levels)
    low, high = _INT_RANGES[key]
    number = _integer(key, value)
    if not low <= number <= high:
        raise InvalidArgument(f"Unable to parse '{key}', value is out of range [ {low}, {high} ], got: {number}")
    return str(number)


def _levels(value, supported: tuple[str, ...]) -> tuple[str, ...]:
    if not isinstance(value, list) or not 1 <= len(value) <= _MAX_LEVEL_NAMES:
        raise InvalidArgument(f"'trace_level' must be a list of 1 to {_MAX_LEVEL_NAMES} level names")
    names = set()
    for name in value:
        if name != "OFF" and name not in _LEVELS:
            shown = name[:64] if isinstance(name, str) else type(name).__name__
            raise InvalidArgument(f"unknown trace level '{shown}' (expected OFF, TIMESTAMPS or TENSORS)")
        if name != "OFF" and name not in supported:
            raise Unsupported(f"trace level '{name}' is not supported: this server records timestamps only "
                              "(use TIMESTAMPS)")
        names.add(name)
    if "OFF" in names:
        if len(value) != 1:
            raise InvalidArgument("Expect only one trace level 'OFF' is specified")
        return ("OFF",)
    return tuple(level for level in _LEVELS if level in names)


def _integer(key: str, value) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = value.strip() if isinstance(value, str) else ""
    if not text or len(text) > 20 or not text.lstrip("-").isdigit() or not text.isascii():
        shown = value[:64] if isinstance(value, str) else type(value).__name__
        raise InvalidArgument(f"Unable to parse '{key}', got: {shown}")
    return int(text)
