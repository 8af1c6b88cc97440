"""This node's way into the fleet, as the data plane sees it.

The DataPlane is given one FleetLink at construction (None: a single node, no cluster configured).
The link is empty until the cluster starts (after the start-up models load: the node's caps list
them), when App._start_cluster connects it once to the FleetRouter and the peer client
(edge/peer_client.py: forward a request, describe a model). Until then every request is served here.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from ..types import InferRequest, InferResponse
from .fleet import FleetRouter, PeerTarget
from .fleet_call import Local, serve_in_fleet
from .pipeline import StageInfo


class Peers(Protocol):
    """How requests and questions reach a peer (edge/peer_client.PeerClient)."""

    def forward(self, node: str, endpoint: str, request: InferRequest, deadline_s: float | None,
                visited: frozenset[str], verified: bool) -> Awaitable[InferResponse]: ...

    def describe(self, node: str, endpoint: str, model: str, verified: bool) -> Awaitable[StageInfo]: ...


class FleetLink:
    def __init__(self, max_hops: int = 2) -> None:
        self.max_hops = max_hops  # a request that has passed this many nodes is served where it is
        self._router: FleetRouter | None = None
        self._peers: Peers | None = None

    def connect(self, router: FleetRouter, peers: Peers) -> None:
        """Once, when the cluster starts."""
        if self._router is not None:
            raise RuntimeError("the fleet link is already connected")
        self._router, self._peers = router, peers

    @property
    def connected(self) -> bool:
        return self._router is not None

    @property
    def describe_peer(self) -> Callable[[PeerTarget, str], Awaitable[StageInfo]] | None:
        """(peer, model) -> the peer's StageInfo of the model; None until connected (core/pipeline.py)."""
        return self._describe if self._peers is not None else None

    def _describe(self, target: PeerTarget, model: str) -> Awaitable[StageInfo]:
        return self._peers.describe(target.node, target.endpoint, model, target.verified)

    def _forward(self, target: PeerTarget, request: InferRequest, deadline_s: float | None = None,
                 visited: frozenset[str] = frozenset()) -> Awaitable[InferResponse]:
        # the bearer token goes to verified peers only (PeerClient decides on `verified`)
        return self._peers.forward(target.node, target.endpoint, request, deadline_s, visited, target.verified)

    def routes(self, request: InferRequest) -> bool:
        """Whether the fleet decides where `request` runs (else it runs here)."""
        return self._router is not None and request.hops < self.max_hops and forwardable(request)

    def targets_for(self, model: str) -> list:
        return self._router.targets_for(model) if self._router is not None else []

    def serve(self, request: InferRequest, visited: frozenset[str], local: Local,
              local_ready: Callable[[], bool]) -> Awaitable[InferResponse]:
        """Serve here or on peers, as the fleet router decides, under one deadline (core/fleet_call.py)."""
        return serve_in_fleet(self._router, request, visited, local=local, local_ready=local_ready,
                              forward=self._forward)


def forwardable(request: InferRequest) -> bool:
    """Requests that touch this node's shared memory must be served here."""
    if any(t.data is None for t in request.inputs):
        return False
    return not any(o.in_shared_memory for o in (request.outputs or ()))
