"""Batches between nodes (issue #18 item 3): requests forwarded to the same peer for the same model within
a short window go as one batched request (one RPC, one deadline = the earliest) and the answer is split.

Wraps a `Peers.forward`-shaped coroutine (core/fleet_link.py). Only requests that can be merged are held:
a model the caller says is batchable (`max_batch_for(model) > 0`: its max_batch_size on the peer), every
input in memory (no shared-memory region) with the same first dimension, and the same model version,
input names / datatypes / inner shapes, requested outputs, parameters, priority, hops and visited set.
A group is sent when the window closes or when it holds `max_batch` samples; a request alone in its
window goes as it came. A failure of the batched RPC is every member's failure (the caller re-routes
each as it would a single one); a member cancelled while waiting (a hedge lost) is left out, or its
share of the answer dropped.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np

from ..errors import Internal
from ..types import InferRequest, InferResponse, Tensor

Forward = Callable[..., Awaitable[InferResponse]]  # (node, endpoint, request, deadline_s, visited, verified)


@dataclass
class _Member:
    request: InferRequest
    deadline_s: float | None
    future: asyncio.Future


@dataclass
class _Group:
    members: list[_Member] = field(default_factory=list)
    samples: int = 0
    timer: asyncio.TimerHandle | None = None


class ForwardBatcher:
    """`window_s`: how long the first request of a group waits for others; `max_batch`: the most samples
    in one batched request (capped by `max_batch_for(model)`, 0 = the model is not merged)."""

    def __init__(self, forward: Forward, *, window_s: float, max_batch: int,
                 max_batch_for: Callable[[str], int]) -> None:
        self._forward = forward
        self._window_s = window_s
        self._max_batch = max_batch
        self._max_batch_for = max_batch_for
        self._groups: dict[tuple, _Group] = {}
        self._sending: set[asyncio.Task] = set()
        self.rpcs = 0  # batched RPCs sent (gt_serve extension, for the bench)
        self.merged = 0  # requests that went in them

    async def forward(self, node: str, endpoint: str, request: InferRequest, deadline_s: float | None = None,
                      visited: frozenset[str] = frozenset(), verified: bool = False) -> InferResponse:
        limit = min(self._max_batch, self._max_batch_for(request.model_name))
        samples = _samples(request)
        if limit <= 1 or samples is None or samples >= limit:
            return await self._forward(node, endpoint, request, deadline_s, visited, verified)
        key = (node, endpoint, visited, verified, _shape_key(request))
        group = self._groups.get(key)
        if group is not None and group.samples + samples > limit:
            self._flush(key, node, endpoint, visited, verified)
            group = None
        loop = asyncio.get_running_loop()
        if group is None:
            group = self._groups[key] = _Group()
            group.timer = loop.call_later(self._window_s, self._flush, key, node, endpoint, visited, verified)
        member = _Member(request, deadline_s, loop.create_future())
        group.members.append(member)
        group.samples += samples
        if group.samples >= limit:
            self._flush(key, node, endpoint, visited, verified)
        return await member.future

    def _flush(self, key: tuple, node: str, endpoint: str, visited: frozenset[str], verified: bool) -> None:
        group = self._groups.pop(key, None)
        if group is None:
            return
        if group.timer is not None:
            group.timer.cancel()
        task = asyncio.ensure_future(self._send(group.members, node, endpoint, visited, verified))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, members: list[_Member], node: str, endpoint: str, visited: frozenset[str],
                    verified: bool) -> None:
        members = [m for m in members if not m.future.done()]  # a waiter cancelled (a hedge lost): left out
        if not members:
            return
        try:
            if len(members) == 1:
                m = members[0]
                _settle(m, await self._forward(node, endpoint, m.request, m.deadline_s, visited, verified))
                return
            merged, deadline_s = _merge(members)
            self.rpcs += 1
            self.merged += len(members)
            response = await self._forward(node, endpoint, merged, deadline_s, visited, verified)
            for member, part in zip(members, _split(response, members)):
                _settle(member, part)
        except BaseException as exc:  # every member fails as its own forward would have
            for m in members:
                if not m.future.done():
                    if isinstance(exc, Exception):
                        m.future.set_exception(exc)
                    else:
                        m.future.cancel()
            if not isinstance(exc, Exception):
                raise


def _samples(request: InferRequest) -> int | None:
    """The requests' first dimension, when every input is in memory and shares it; else None."""
    sizes = {t.shape[0] if t.data is not None and len(t.shape) >= 1 else None for t in request.inputs}
    return next(iter(sizes)) if len(sizes) == 1 and None not in sizes else None


def _shape_key(request: InferRequest) -> tuple:
    outputs = None if request.outputs is None else tuple((o.name, repr(sorted(o.parameters.items())))
                                                         for o in request.outputs)
    return (request.model_name, request.model_version, request.priority, request.hops,
            tuple((t.name, t.datatype, tuple(t.shape[1:])) for t in request.inputs), outputs,
            repr(sorted(request.parameters.items())))


def _merge(members: list[_Member]) -> tuple[InferRequest, float | None]:
    first = members[0].request
    inputs = [Tensor(t.name, t.datatype, (sum(m.request.inputs[i].shape[0] for m in members), *t.shape[1:]),
                     np.concatenate([m.request.inputs[i].data for m in members]))
              for i, t in enumerate(first.inputs)]
    limits = [d for m in members for d in (m.request.deadline_s, m.deadline_s) if d is not None]
    deadline_s = min(limits) if limits else None
    merged = InferRequest(first.model_name, first.model_version, first.id, inputs, first.outputs,
                          dict(first.parameters), deadline_s, first.priority, first.hops)
    return merged, deadline_s


def _split(response: InferResponse, members: list[_Member]) -> list[InferResponse]:
    sizes = [m.request.inputs[0].shape[0] for m in members]
    total = sum(sizes)
    for t in response.outputs:
        if t.data is None or not t.shape or t.shape[0] != total:
            raise Internal(f"model '{response.model_name}': a batched forward's output '{t.name}' has shape "
                           f"{list(t.shape)}, not {total} rows: it cannot be split")
    bounds = np.cumsum([0, *sizes])
    parts = []
    for member, lo, hi in zip(members, bounds[:-1], bounds[1:]):
        outs = [Tensor(t.name, t.datatype, (int(hi - lo), *t.shape[1:]), t.data[lo:hi]) for t in response.outputs]
        parts.append(InferResponse(response.model_name, response.model_version, member.request.id, outs,
                                   dict(response.parameters)))
    return parts


def _settle(member: _Member, response: InferResponse) -> None:
    if not member.future.done():
        member.future.set_result(response)


class BatchingPeers:
    """A `Peers` (core/fleet_link.py) whose forwards go through a ForwardBatcher; describe as it was."""

    def __init__(self, peers, batcher: ForwardBatcher) -> None:
        self.batcher = batcher
        self.forward = batcher.forward
        self.describe = peers.describe


def forwarding_peers(peers, cluster):
    """`peers` (edge/peer_client.PeerClient), behind a forward batcher when the config's `cluster` section
    sets forward_batch_window_us and forward_batch_models (only those models are merged)."""
    if cluster.forward_batch_window_us <= 0 or not cluster.forward_batch_models:
        return peers
    models, limit = frozenset(cluster.forward_batch_models), cluster.forward_batch_max
    batcher = ForwardBatcher(peers.forward, window_s=cluster.forward_batch_window_us / 1e6, max_batch=limit,
                             max_batch_for=lambda model: limit if model in models else 0)
    return BatchingPeers(peers, batcher)
