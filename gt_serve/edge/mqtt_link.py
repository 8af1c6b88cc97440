"""The MQTT broker link's settings and counters, and the helper that runs a session's loops together."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    """Where and how to reach the MQTT broker."""

    host: str = "127.0.0.1"
    port: int = 1883
    username: str | None = None
    password: str | None = None
    tls: bool = False  # implied by ca_file or cert_file
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    tls_insecure: bool = False  # skip the broker host name check (testing only)
    keepalive_s: int = 5
    connect_timeout_s: float = 5.0

    @property
    def uses_tls(self) -> bool:
        return self.tls or self.ca_file is not None or self.cert_file is not None


@dataclass(slots=True)
class AgentStats:
    connects: int = 0
    connect_failures: int = 0
    published: int = 0
    received: int = 0
    dropped: int = 0
    duplicates: int = 0  # retained messages the broker sent again (after a reconnect): not counted as dropped
    snapshot_errors: int = 0
    rejected: dict[str, int] = field(default_factory=dict)  # reason -> messages dropped (edge/auth.REASONS)

    def reject(self, reason: str) -> None:
        self.dropped += 1
        self.rejected[reason] = self.rejected.get(reason, 0) + 1


class Flag:
    __slots__ = ("set",)

    def __init__(self) -> None:
        self.set = False


async def first_of(over: Flag, *coros: Any) -> None:
    """Run ``coros`` until the first one ends; then raise ``over``, cancel the rest and
    re-raise the first one's failure."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        over.set = True
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
