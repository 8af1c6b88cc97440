"""At most one warning per key per interval: for loops that see the same fault many times a second."""
from __future__ import annotations

import logging
from typing import Callable


class RateLimitedLog:
    """At most one warning per key per ``interval_s``; counts what it suppressed."""

    def __init__(self, logger: logging.Logger, interval_s: float,
                 clock: Callable[[], float], max_keys: int = 64) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._clock = clock
        self._max_keys = max_keys
        self._last_s: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, key: str, fmt: str, *args: object) -> None:
        now_s = self._clock()
        last_s = self._last_s.get(key)
        if last_s is not None and now_s - last_s < self._interval_s:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return
        if last_s is None and len(self._last_s) >= self._max_keys:
            key = "(other)"
        suppressed = self._suppressed.pop(key, 0)
        self._last_s[key] = now_s
        suffix = f" ({suppressed} similar suppressed)" if suppressed else ""
        self._logger.warning(fmt + suffix, *args)
