"""The trace extension's settings (`/v2/trace/setting`, `/v2/models/{m}/trace/setting`): validated and bounded.

This server does not trace requests; it keeps and reports the settings as Triton does, so that clients
and tools that read or set them keep working. Triton's rules, kept here:
- per-model settings exist only for a ready model (the caller checks: 400 'Request for unknown model : M');
- `trace_file` cannot be changed over the network (nor, here, `trace_mode`);
- `trace_level` is ["OFF"] alone, or a set of "TIMESTAMPS" / "TENSORS";
- `trace_rate` and `log_frequency` are uint32, `trace_count` an int32 of -1 (no limit) or more, sent as strings;
- a null value clears a model's own setting (the global one applies again) or resets a global one.
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


class TraceSettings:
    def __init__(self, max_models: int = MAX_MODELS) -> None:
        self._global: dict[str, object] = dict(_DEFAULTS)
        self._models: dict[str, dict[str, object]] = {}
        self._max_models = max_models

    @property
    def model_count(self) -> int:
        return len(self._models)

    def get(self, model: str = "") -> dict:
        """The settings in effect for `model` ("" = the global ones), as the JSON the protocol returns."""
        out = dict(self._global)
        out.update(self._models.get(model, {}))
        out["trace_level"] = list(out["trace_level"])
        return out

    def update(self, model: str, doc: dict) -> dict:
        """Apply a POSTed settings object (all of it or nothing); returns the settings now in effect."""
        changes = {key: _validated(key, value) for key, value in doc.items()}
        if not model:
            for key, value in changes.items():
                self._global[key] = _DEFAULTS[key] if value is None else value
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
        return self.get(model)


def _validated(key: str, value):
    if not isinstance(key, str) or key not in _DEFAULTS:
        raise InvalidArgument(f"unknown trace setting '{str(key)[:64]}' (known: {', '.join(_DEFAULTS)})")
    if key in _READ_ONLY:
        raise Unsupported(f"{key} can not be updated through network protocol")
    if value is None:
        return None
    if key == "trace_level":
        return _levels(value)
    low, high = _INT_RANGES[key]
    number = _integer(key, value)
    if not low <= number <= high:
        raise InvalidArgument(f"Unable to parse '{key}', value is out of range [ {low}, {high} ], got: {number}")
    return str(number)


def _levels(value) -> tuple[str, ...]:
    if not isinstance(value, list) or not 1 <= len(value) <= _MAX_LEVEL_NAMES:
        raise InvalidArgument(f"'trace_level' must be a list of 1 to {_MAX_LEVEL_NAMES} level names")
    names = set()
    for name in value:
        if name != "OFF" and name not in _LEVELS:
            shown = name[:64] if isinstance(name, str) else type(name).__name__
            raise InvalidArgument(f"unknown trace level '{shown}' (expected OFF, TIMESTAMPS or TENSORS)")
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
