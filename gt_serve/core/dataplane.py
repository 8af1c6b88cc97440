"""DataPlane: the single entry point for HTTP, gRPC and requests forwarded by peers.

A thin façade: it routes each call to the collaborator that owns it, all given to its constructor
(nothing is attached later). The transports only translate wire formats to and from the calls
below. Every failure is raised as a gt_serve.errors.GtServeError subclass whose message is meant
for the client (protocol/status.py maps it to each transport's status).

  registry      core/registry.py         loaded models (the hot-path lookup)
  control       core/model_control.py    metadata, config, statistics, repository index/load/unload
  readiness     core/model_control.py    ready / strict readiness / draining (App drives it)
  fleet         core/fleet_link.py       routing to peers; None on a single node, empty until the cluster starts
  pipelines     core/pipeline.py         models split into stages, addressed by name (built here: each stage is
                                         routed as infer routes a request, here or on a peer)
  ensembles     core/ensemble.py         registry models whose steps go to a local step model's queue, else are
                                         routed likewise; core/ensemble_groups.py runs the steps of requests that
                                         come together as one request under load
  A drain refuses new requests (`infer`); the stages and steps of one taken in before go through `_route` and finish.
  shm/cuda_shm  core/shared_memory.py    registered regions; inputs read and outputs written there
  request_checks / outputs               the per-request checks and the response's tensors

Contract (stable; the protocol modules code against it). Sync, cheap and static, for probes:
  live() -> bool, ready() -> bool, server_metadata() -> {"name", "version", "extensions": [...]}
Everything else is `async def`, whether or not it waits (one contract: the transports always await):
  model_ready(name, version="") -> bool              (False for an unknown model, never raises)
  model_metadata(name, version="") -> {"name", "versions": ["1"], "platform", "inputs": [{"name","datatype","shape"}], "outputs": [...]}
  model_config(name, version="") -> model_config_pb2.ModelConfig
  infer(InferRequest) -> InferResponse
      Inputs arrive as Tensor with numpy data, or data=None and parameters naming a shared-memory
      region (shared_memory_region / shared_memory_offset / shared_memory_byte_size): the data plane
      reads those. Requested outputs are honoured in request order (all model outputs when None);
      an output whose parameters name a region is written there and returned with data=None and the
      shm parameters; `classification: k` turns an output into BYTES "value:index[:label]".
  statistics(name="", version="") -> {"model_stats": [...]}   (JSON form, ints; see PROTOCOL.md §6)
  repository_index(ready_only=False) -> [{"name","version","state","reason"}]
  load_model(name, parameters: dict) -> None    parameters: "config" JSON str; "file:<path>" bytes
  unload_model(name, unload_dependents=False) -> None
  shm_register(name, key, offset, byte_size) / shm_unregister(name="") / shm_status(name="") -> [{"name","key","offset","byte_size"}]
  cuda_shm_register(name, raw_handle: bytes, device_id, byte_size) / cuda_shm_unregister(name="") / cuda_shm_status(name="") -> [...]
The front ends' express lanes (protocol/express_plans.py), sync, for a request of a form checked on a model:
  express_model(name, version="") -> LoadedModel | None   the model a plain request goes straight to, else None
  express_submit(model, feeds, batch_size, shape_key, priority) -> Future of the outputs in model order
  express_run(model, feeds, shape_key) -> that Future already done, a one-row request run at once; else None
  express_failed(model, start_ns, error)                   count a failure as infer does
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from .. import __version__
from ..errors import GtServeError, InvalidArgument, Unavailable
from ..types import InferRequest, InferResponse, Tensor
from .ensemble import record_ensemble_success, run_ensemble
from .ensemble_groups import EnsembleGroups, groupable
from .fleet_call import VISITED_PARAMETER, parse_visited
from .fleet_link import FleetLink
from .memory_budget import MemoryGovernor
from .model_control import ModelControl, Readiness
from .outputs import make_outputs
from .pipeline import Pipeline, PipelineSet
from .registry import READY, LoadedModel, ModelRegistry
from .request_checks import check_inputs, check_outputs, check_region, check_request, read_shm_input
from .response_cache import ResponseCache, serve_cached
from .sequences import held_here, sequence_call
from .shared_memory import CudaSharedMemory, SystemSharedMemory
from .trace_context import RequestTrace
from .worker_stats import merge_statistics

HOPS_PARAMETER = "gt_hops"  # how many nodes a forwarded request has passed through
_NOT_ECHOED = frozenset({"binary_data_output", "headers", HOPS_PARAMETER,
                         VISITED_PARAMETER})  # transport directives; gt_visited: no node visited twice

EXTENSIONS = ["classification", "sequence", "model_repository", "model_repository(unload_dependents)",
              "schedule_policy", "model_configuration", "system_shared_memory", "cuda_shared_memory",
              "binary_tensor_data", "parameters", "statistics"]

_now_ns = time.monotonic_ns


class DataPlane:
    def __init__(self, registry: ModelRegistry, control: ModelControl, readiness: Readiness, *,
                 fleet: FleetLink | None = None, pipelines: Mapping[str, Sequence[str]] | None = None,
                 node: str = "", shm: SystemSharedMemory | None = None, cuda_shm: CudaSharedMemory | None = None,
                 server_name: str = "gt_serve", default_timeout_s: float = 0.0, max_batch_size: int = 0,
                 response_cache: ResponseCache | None = None, memory: MemoryGovernor | None = None,
                 peers: Any = None) -> None:
        """`peers`: the other worker processes of this server (protocol/worker_link.WorkerLink:
        `broadcast(op, *args)`, `everyone(here, op, *args)`), which a model load or unload and a shared-memory
        registration reach too, and whose statistics are added to this one's (None: one process); `memory`: evicts
        past each device's model-memory budget and reloads on demand (None: no budget);
        `pipelines`: {name: [stage model, ...]} served as models (a name may not be a repository model's:
        InvalidArgument); `node`: this node's name, reported as who served a pipeline's stages."""
        self._registry = registry
        self._control = control
        self._readiness = readiness
        self._fleet = fleet
        self._shm = shm or SystemSharedMemory()
        self._cuda_shm = cuda_shm or CudaSharedMemory()
        self._server_name = server_name
        self._default_timeout_s = default_timeout_s
        self._max_batch_size = max_batch_size
        self._response_cache = response_cache  # for models with response_cache { enable: true }
        self._memory = memory
        self._peers = peers
        self._pipelines = self._build_pipelines(pipelines, node) if pipelines else None

    def _build_pipelines(self, pipelines: Mapping[str, Sequence[str]], node: str) -> PipelineSet:
        clash = sorted(set(pipelines) & set(self._registry.names()))
        if clash:
            raise InvalidArgument(f"pipeline '{clash[0]}' has the name of a model in the repository")
        fleet = self._fleet
        return PipelineSet([Pipeline(n, tuple(s)) for n, s in pipelines.items()],
                           local_info=self._control.stage_info,
                           peer_targets=fleet.targets_for if fleet is not None else lambda model: [],
                           describe_peer=lambda: fleet.describe_peer if fleet is not None else None,
                           infer=self._route, node=node)

    def _is_pipeline(self, name: str) -> bool:
        return self._pipelines is not None and name in self._pipelines

    # -- health & metadata --------------------------------------------------------------------
    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return self._readiness.ready()

    def server_metadata(self) -> dict:
        return {"name": self._server_name, "version": __version__, "extensions": list(EXTENSIONS)}

    async def model_ready(self, name: str, version: str = "") -> bool:
        if self._is_pipeline(name):
            return self._pipelines.ready(name, version)
        return self._registry.ready(name, version)

    async def model_metadata(self, name: str, version: str = "") -> dict:
        if self._is_pipeline(name):
            return await self._pipelines.metadata(name, version)  # a stage may be described by a peer
        return self._control.metadata(name, version)

    async def model_config(self, name: str, version: str = ""):
        if self._is_pipeline(name):
            return await self._pipelines.config(name, version)
        return self._control.config(name, version)

    # -- inference ------------------------------------------------------------------------------
    async def infer(self, request: InferRequest, trace: RequestTrace | None = None) -> InferResponse:
        """`trace`: the request's record when the front end traces it (core/trace_context.py), else None."""
        if self._readiness.draining:
            raise Unavailable("the server is shutting down and takes no new requests")
        return await self._route(request, trace)

    async def _route(self, request: InferRequest, trace: RequestTrace | None = None) -> InferResponse:
        """A request taken in (a client's, or a stage or step of one): to its pipeline, ensemble, a peer or here."""
        hops = request.parameters.pop(HOPS_PARAMETER, None)
        if isinstance(hops, int) and not isinstance(hops, bool):
            request.hops = max(request.hops, hops)
        if self._pipelines is not None and request.model_name in self._pipelines:
            return await self._pipelines.infer(request)
        ensemble = self._registry.ensemble_of(request.model_name, request.model_version)
        if ensemble is not None:  # runs here; each step goes to its model's queue, or is routed (here or a peer)
            return await self._infer_ensemble(ensemble, request)
        visited = request.parameters.pop(VISITED_PARAMETER, None)
        fleet = self._fleet
        if fleet is not None and fleet.routes(request) and not held_here(self._registry, request):
            registry = self._registry
            return await fleet.serve(request, parse_visited(visited),
                                     local=lambda: self._infer_here(request, trace),
                                     local_ready=lambda: registry.ready(request.model_name, request.model_version))
        return await self._infer_here(request, trace)

    async def _infer_here(self, request: InferRequest, trace: RequestTrace | None = None,
                          model: LoadedModel | None = None) -> InferResponse:
        """`model`: the ready model the request is for, where the caller has looked it up (`_local_model`)."""
        start_ns = _now_ns()
        if model is None:
            try:
                model = self._registry.get(request.model_name, request.model_version)
            except Unavailable as exc:
                model = await self._reloaded(request, exc)
            if model.state != READY:
                raise Unavailable(f"model '{model.name}' version {model.version} is not ready ({model.state})")
        try:
            feeds, batch_size, shape_key, requested = check_request(model, request, self._shm, self._max_batch_size)
            executor = model.executor if model.spec.sequence is None else sequence_call(model, request, batch_size)
            deadline_s = request.deadline_s
            if deadline_s is None and self._default_timeout_s > 0:
                deadline_s = time.monotonic() + self._default_timeout_s
            if self._response_cache is None:  # no cache on this server: the plain path, no closure, no lookup
                if trace is None:
                    outputs = await executor.submit(feeds, batch_size, shape_key, request.priority, deadline_s)
                else:  # traced: the batch it runs in notes its queue and compute times on the trace
                    outputs = await executor.submit(feeds, batch_size, shape_key, request.priority,
                                                    deadline_s, trace)
                response_outputs = make_outputs(model, outputs, requested, self._shm)
            else:
                traced = () if trace is None else (trace,)

                async def run():
                    outputs = await executor.submit(feeds, batch_size, shape_key, request.priority,
                                                    deadline_s, *traced)
                    return make_outputs(model, outputs, requested, self._shm)

                response_outputs = await serve_cached(self._response_cache, model, request, requested, start_ns, run)
        except GtServeError as exc:
            model.stats.record_failure(_now_ns() - start_ns, exc)
            raise
        echo = {k: v for k, v in request.parameters.items() if k not in _NOT_ECHOED} if request.parameters else {}
        return InferResponse(model.name, model.version, request.id, response_outputs, echo)

    # -- the front ends' express lanes (protocol/express_plans.py) ---------------------------------------------
    def express_model(self, name: str, version: str = "") -> LoadedModel | None:
        """The loaded model that `infer` would hand a plain request for `name` / `version` to at once (`_infer_here`:
        its queue, nothing else), or None where anything else decides: draining, a pipeline, ensemble or sequence
        model of that name, peers, a response cache, a model not loaded or not ready. A plain request: no parameters but
        `binary_data_output`, no timeout of its own, a form already checked on that model (its regions looked up
        for each request: `express_regions`, `express_outputs`)."""
        return None if self._readiness.draining else self._local_model(name, version)

    def _local_model(self, name: str, version: str = "") -> LoadedModel | None:
        """express_model's answer for a request already taken in (a drain lets it finish)."""
        if self._response_cache is not None or self._is_pipeline(name):
            return None
        fleet = self._fleet
        if fleet is not None and fleet.connected:
            return None
        try:
            model = self._registry.get(name, version)
        except GtServeError:
            return None
        return model if model.state == READY and model.ensemble is None and model.spec.sequence is None else None

    def express_submit(self, model: LoadedModel, feeds: dict, batch_size: int, shape_key: tuple, priority: int):
        """Queue a plain request of a form checked on `model` (express_model's): its future, as `_infer_here` awaits
        it (the outputs in model order); Unavailable / QueueFull as there."""
        deadline_s = time.monotonic() + self._default_timeout_s if self._default_timeout_s > 0 else None
        return model.executor.submit(feeds, batch_size, shape_key, priority, deadline_s)

    @staticmethod
    def express_run(model: LoadedModel, feeds: dict, shape_key: tuple):
        """A one-row plain request run at once where the queue would run it on the loop's thread a turn later
        (ModelExecutor.run_now): a done future, as `express_submit`'s would be once its batch ran (the error a
        failed run gives it), or None when it must be queued."""
        try:
            outputs = model.executor.run_now(feeds, shape_key)
        except GtServeError as exc:
            future = model.executor.batcher.loop.create_future()
            future.set_exception(exc)
            return future
        if outputs is None:
            return None
        future = model.executor.batcher.loop.create_future()
        future.set_result(outputs)
        return future

    def express_regions(self, inputs: Sequence[Tensor], outputs: Sequence | None) -> dict:
        """An express request's inputs in system shared memory read from their regions, and its outputs' regions
        looked up again, as check_request does for a checked form (InvalidArgument as there)."""
        shm = self._shm
        feeds = {t.name: read_shm_input(t, shm) for t in inputs}
        for out in outputs or ():
            if out.in_shared_memory:
                check_region(out, shm)
        return feeds

    def express_outputs(self, model: LoadedModel, arrays: list, requested: Sequence | None) -> list[Tensor]:
        """An express request's response tensors, as `_infer_here` makes them (outputs in shared memory written)."""
        return make_outputs(model, arrays, None if requested is None else list(requested), self._shm)

    @staticmethod
    def express_failed(model: LoadedModel, start_ns: int, error: BaseException) -> None:
        """An express request failed with a GtServeError: counted as `_infer_here` counts it."""
        model.stats.record_failure(_now_ns() - start_ns, error)

    async def _reloaded(self, request: InferRequest, error: Unavailable) -> LoadedModel:
        """A model evicted for the memory budget: reloaded, the request waiting (bounded); else the error."""
        memory = self._memory
        if memory is None or request.model_name not in memory.evicted:
            raise error
        await memory.reload(request.model_name)
        return self._registry.get(request.model_name, request.model_version)

    async def _infer_ensemble(self, model: LoadedModel, request: InferRequest) -> InferResponse:
        start_ns = _now_ns()
        try:
            if model.state != READY:
                raise Unavailable(f"model '{model.name}' version {model.version} is not ready ({model.state})")
            feeds, batch_size, _ = check_inputs(model, request, self._shm, self._max_batch_size)
            requested = check_outputs(model, request.outputs, self._shm)
            if request.deadline_s is None and self._default_timeout_s > 0:
                request.deadline_s = time.monotonic() + self._default_timeout_s  # one deadline for every step
            if self._response_cache is None or not model.config.response_cache.enable:
                outputs = await self._ensemble_outputs(model, request, feeds, batch_size, requested, start_ns)
            else:  # Triton caches an ensemble's own requests too: a hit runs no step (and counts as a hit)
                run = partial(self._ensemble_outputs, model, request, feeds, batch_size, requested, start_ns)
                outputs = await serve_cached(self._response_cache, model, request, requested, start_ns, run)
        except GtServeError as exc:
            model.stats.record_failure(_now_ns() - start_ns, exc)
            raise
        echo = {k: v for k, v in request.parameters.items() if k not in _NOT_ECHOED} if request.parameters else {}
        return InferResponse(model.name, model.version, request.id, outputs, echo)

    async def _ensemble_outputs(self, model: LoadedModel, request: InferRequest, feeds: dict, batch_size: int,
                                requested: list | None, start_ns: int) -> list[Tensor]:
        """The response's tensors of an ensemble request, checked: its steps run alone or in a group; a success
        counted in the ensemble's statistics."""
        spec = model.spec
        if spec.max_batch_size > 0 and model.ensemble.groups and groupable(request):
            groups = model.groups
            if groups is None:
                most = min(spec.max_batch_size, self._max_batch_size or spec.max_batch_size)
                groups = model.groups = EnsembleGroups(partial(self._run_ensemble, model), most)
            if groups.alone():  # the common case at light load, without run()'s coroutine
                with groups:
                    produced = await self._run_ensemble(model, request, feeds)
            else:
                produced = await groups.run(request, feeds, batch_size)
        else:
            produced = await self._run_ensemble(model, request, feeds)
        outputs = make_outputs(model, [produced[n] for n in spec.output_order], requested, self._shm)
        record_ensemble_success(model.stats, batch_size, _now_ns() - start_ns)
        return outputs

    async def _run_ensemble(self, model: LoadedModel, request: InferRequest, feeds: dict) -> dict:
        """The ensemble's outputs (arrays by name) for `feeds` (arrays by name, checked against the ensemble)."""
        spec = model.spec
        inputs = {n: Tensor(n, spec.inputs[n].datatype, a.shape, a) for n, a in feeds.items()}
        produced = await run_ensemble(model.ensemble, request, inputs, self._ensemble_step)
        return {n: t.data for n, t in produced.items()}

    async def _ensemble_step(self, request: InferRequest) -> InferResponse:
        """One ensemble step's request: straight to the step model's queue where a plain request would go there
        (`_local_model`), its form checked once (`step_request` sets it); else routed as `infer` routes a request.
        Never run at once (`run_now`): each step would look idle and run one row at a time (0.82x the inf/s at 4
        gRPC clients; DESIGN-NOTES, twenty-ninth pass)."""
        model = self._local_model(request.model_name, request.model_version)
        if model is None:
            return await self._route(request)
        return await self._infer_here(request, model=model)

    # -- statistics and repository ----------------------------------------------------------------
    async def statistics(self, name: str = "", version: str = "") -> dict:
        here = self._control.statistics(name, version)
        if self._peers is None:
            return here
        return merge_statistics(await self._peers.everyone(here, "statistics", name, version))

    async def repository_index(self, ready_only: bool = False) -> list[dict]:
        return self._control.index(ready_only)

    async def load_model(self, name: str, parameters: dict | None = None) -> None:
        await self._control.load(name, parameters)
        await self.tell_workers("load_model", name, parameters)

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        await self._control.unload(name, unload_dependents)
        await self.tell_workers("unload_model", name, unload_dependents)

    async def tell_workers(self, op: str, *args) -> None:
        """What this worker has just done, done by every other worker too (server.workers > 1; `op` is one of
        peer_calls, or a front end's: trace and log settings)."""
        if self._peers is not None:
            await self._peers.broadcast(op, *args)

    def peer_calls(self) -> dict:
        """What another worker may ask of this one: the same calls, done here only."""
        return {"load_model": self._control.load, "unload_model": self._control.unload,
                "statistics": self._control.statistics, "shm_register": self._shm.register,
                "shm_unregister": self._shm.unregister, "cuda_shm_register": self._cuda_shm.register,
                "cuda_shm_unregister": self._cuda_shm.unregister}

    # -- shared memory --------------------------------------------------------------------------
    async def shm_register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._shm.register(name, key, offset, byte_size)
        await self.tell_workers("shm_register", name, key, offset, byte_size)

    async def shm_unregister(self, name: str = "") -> None:
        self._shm.unregister(name)
        await self.tell_workers("shm_unregister", name)

    async def shm_status(self, name: str = "") -> list[dict]:
        return self._shm.status(name)

    def close(self) -> None:
        """After the front ends have stopped: the shared memory regions' kept descriptors are closed."""
        self._shm.close()

    async def cuda_shm_register(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        self._cuda_shm.register(name, raw_handle, device_id, byte_size)
        await self.tell_workers("cuda_shm_register", name, raw_handle, device_id, byte_size)

    async def cuda_shm_unregister(self, name: str = "") -> None:
        self._cuda_shm.unregister(name)
        await self.tell_workers("cuda_shm_unregister", name)

    async def cuda_shm_status(self, name: str = "") -> list[dict]:
        return self._cuda_shm.status(name)
