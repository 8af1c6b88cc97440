"""Triton's response cache: a server-wide LRU of responses, bounded in bytes, used by models whose config
says `response_cache { enable: true }`.

Keyed on model, version, every input's name, datatype, shape and bytes, and the requested outputs with
their parameters (a BLAKE2b-256 digest). Never caches an error. Bypassed for requests that read or
write shared memory or belong to a sequence. Cached arrays are private copies, read-only.
Statistics follow Triton: a hit is a success without an execution, `cache_hit` is the lookup time,
`cache_miss` the lookup plus the insertion time. Runs on the event loop only.
"""
from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from ..datatypes import raw_from_array
from ..errors import ConfigError
from ..types import InferRequest, Tensor

ENTRY_OVERHEAD_BYTES = 256  # key, bookkeeping and the Tensor objects, counted against the capacity
_SEQUENCE_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end")
_now_ns = time.monotonic_ns


class ResponseCache:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = int(capacity_bytes)
        self.used_bytes = 0
        self.evictions = 0
        self._entries: OrderedDict[bytes, tuple[list[Tensor], int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> list[Tensor] | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return [Tensor(t.name, t.datatype, t.shape, t.data, dict(t.parameters)) for t in entry[0]]

    def put(self, key: bytes, outputs: list[Tensor]) -> bool:
        """Keep private read-only copies of `outputs`; evict the least recently used to make room.
        False when the response alone is larger than the cache."""
        copies = [Tensor(t.name, t.datatype, tuple(t.shape), _frozen_copy(t.data), dict(t.parameters)) for t in outputs]
        size = ENTRY_OVERHEAD_BYTES + len(key) + sum(_nbytes(t.data) for t in copies)
        if size > self.capacity_bytes:
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self.used_bytes -= old[1]
        while self._entries and self.used_bytes + size > self.capacity_bytes:
            _, (_, evicted) = self._entries.popitem(last=False)
            self.used_bytes -= evicted
            self.evictions += 1
        self._entries[key] = (copies, size)
        self.used_bytes += size
        return True


def check_cache_available(config: Any, name: str, server_has_cache: bool) -> None:
    """A model (or ensemble) whose config asks for the cache loads only where the server has one."""
    if config.response_cache.enable and not server_has_cache:
        raise ConfigError(f"model '{name}': response_cache.enable needs the server's response cache: start "
                          "gt-serve with --cache-config local,size=BYTES (server.response_cache_bytes)")


def request_key(model: Any, request: InferRequest, requested: list | None) -> bytes | None:
    """The cache key of a checked request, or None when it may not be cached."""
    if any(request.parameters.get(p) for p in _SEQUENCE_PARAMETERS):
        return None
    h = hashlib.blake2b(digest_size=32)
    h.update(f"{model.name}\0{model.version}\0".encode())
    for tensor in sorted(request.inputs, key=lambda t: t.name):
        if tensor.data is None:  # shared memory: its contents may change under the same request
            return None
        h.update(f"{tensor.name}\0{tensor.datatype}\0{tuple(tensor.shape)}\0".encode())
        raw = raw_from_array(tensor.data, tensor.datatype)
        h.update(len(raw).to_bytes(8, "little"))
        h.update(raw)
    if requested is None:
        h.update(b"\1all")
    else:
        for out in requested:
            if out.in_shared_memory:
                return None
            h.update(f"\1{out.name}\0{sorted(out.parameters.items())!r}".encode())
    return h.digest()


async def serve_cached(cache: ResponseCache | None, model: Any, request: InferRequest, requested: list | None,
                       start_ns: int, run: Callable[[], Awaitable[list[Tensor]]]) -> list[Tensor]:
    """The response outputs: from the cache when the model uses it and has answered this request
    before, else from `run()` (then cached unless it raised). A hit of a model that answers in order (preserve_ordering)
    is answered after the batches taken before it, or, while requests are queued before it, runs as a miss behind
    them."""
    if cache is None or not model.config.response_cache.enable:
        return await run()
    lookup_start_ns = _now_ns()
    key = request_key(model, request, requested)
    if key is None:
        return await run()
    hit = cache.get(key)
    executor = model.executor  # (None: an ensemble)
    in_order = executor is not None and executor.batcher.cfg.preserve_ordering
    if hit is not None and not (in_order and executor.pending):  # else it runs as a miss, behind the queued requests
        now_ns = _now_ns()
        model.stats.record_cache_hit(now_ns - start_ns, now_ns - lookup_start_ns)
        turn = executor.turn() if in_order else None
        if turn is not None:  # after the batches taken before it
            await turn
        return hit
    lookup_ns = _now_ns() - lookup_start_ns
    outputs = await run()
    insert_start_ns = _now_ns()
    cache.put(key, outputs)
    model.stats.record_cache_miss(lookup_ns + _now_ns() - insert_start_ns)
    return outputs


def _frozen_copy(data: np.ndarray | None) -> np.ndarray | None:
    if data is None:
        return None
    copy = np.array(data, copy=True)
    copy.flags.writeable = False
    return copy


def _nbytes(data: np.ndarray | None) -> int:
    if data is None:
        return 0
    if data.dtype == object:
        return data.size * 8 + sum(len(x) if isinstance(x, (bytes, bytearray, str)) else 8 for x in data.reshape(-1))
    return int(data.nbytes)
