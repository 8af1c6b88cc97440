"""DataPlane: the single entry point for HTTP, gRPC and requests forwarded by peers.

The transports only translate wire formats to and from the calls below. Every failure is raised
as a gt_serve.errors.GtServeError subclass whose message is meant for the client.

Contract (stable; the protocol modules code against it):
  live() -> bool, ready() -> bool
  server_metadata() -> {"name", "version", "extensions": [...]}
  model_metadata(name, version="") -> {"name", "versions": ["1"], "platform", "inputs": [{"name","datatype","shape"}], "outputs": [...]}
  model_ready(name, version="") -> bool              (False for an unknown model, never raises)
  model_config(name, version="") -> model_config_pb2.ModelConfig
      (for a pipeline name, model_metadata and model_config return awaitables: a stage may live on a peer)
  async infer(InferRequest) -> InferResponse
      Inputs arrive as Tensor with numpy data, or data=None and parameters naming a shared-memory
      region (shared_memory_region / shared_memory_offset / shared_memory_byte_size): the data plane
      reads those. Requested outputs are honoured in request order (all model outputs when None);
      an output whose parameters name a region is written there and returned with data=None and the
      shm parameters; `classification: k` turns an output into BYTES "value:index[:label]".
  statistics(name="", version="") -> {"model_stats": [...]}   (JSON form, ints; see PROTOCOL.md §6)
  repository_index(ready_only=False) -> [{"name","version","state","reason"}]
  async load_model(name, parameters: dict) -> None    parameters: "config" JSON str; "file:<path>" bytes
  async unload_model(name, unload_dependents=False) -> None
  shm_register(name, key, offset, byte_size) / shm_unregister(name="") / shm_status(name="") -> [{"name","key","offset","byte_size"}]
  cuda_shm_register(name, raw_handle: bytes, device_id, byte_size) / cuda_shm_unregister(name="") / cuda_shm_status(name="") -> [...]
"""
from __future__ import annotations

import time

import numpy as np

from .. import __version__
from ..datatypes import array_from_raw, element_count, raw_from_array
from ..errors import GtServeError, InvalidArgument, ModelNotFound, Unavailable, Unsupported
from ..types import InferRequest, InferResponse, RequestedOutput, Tensor
from .fleet_call import VISITED_PARAMETER, parse_visited, serve_in_fleet
from .registry import READY, LoadedModel, ModelRegistry, decode_load_files
from .shared_memory import CudaSharedMemory, SystemSharedMemory

HOPS_PARAMETER = "gt_hops"  # how many nodes a forwarded request has passed through
_NOT_ECHOED = frozenset({"binary_data_output", "headers", HOPS_PARAMETER,
                         VISITED_PARAMETER})  # transport directives; gt_visited: no node visited twice

EXTENSIONS = ["classification", "model_repository", "model_repository(unload_dependents)", "schedule_policy",
              "model_configuration", "system_shared_memory", "cuda_shared_memory", "binary_tensor_data",
              "parameters", "statistics"]

_now_ns = time.monotonic_ns


class DataPlane:
    def __init__(self, registry: ModelRegistry, *, server_name: str = "gt_serve", model_control_mode: str = "none",
                 shm: SystemSharedMemory | None = None, cuda_shm: CudaSharedMemory | None = None,
                 default_timeout_s: float = 0.0, max_batch_size: int = 0) -> None:
        self.registry = registry
        self.server_name = server_name
        self.model_control_mode = model_control_mode
        self.shm = shm or SystemSharedMemory()
        self.cuda_shm = cuda_shm or CudaSharedMemory()
        self.default_timeout_s = default_timeout_s
        self.max_batch_size = max_batch_size
        # edge cluster (optional): fleet.choose() picks here or a peer; forward(target, request, deadline_s, visited)
        # sends it (core/fleet_call.py runs the attempts)
        self.fleet = None
        self.forward = None
        self.max_hops = 2
        # pipelines (optional, see core/pipeline.py): models split into stages, addressed by name
        self.pipelines = None
        self.describe_peer = None  # async (target, model) -> pipeline.StageInfo, for stages only peers serve
        self._stage_infos: dict = {}
        self.energy_totals = None  # optional () -> {"models", "devices", "total"} (NodeEnergy.totals)
        self._ready = False
        self._waiting_for: tuple[str, ...] = ()
        self._draining = False

    # -- health & metadata --------------------------------------------------------------------
    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        if self._waiting_for and all(self.registry.ready(name) for name in self._waiting_for):
            self._waiting_for = ()  # strict readiness: the start-up models that failed have been loaded since
        return self._ready and not self._waiting_for and not self._draining

    def set_ready(self, ready: bool, waiting_for: tuple[str, ...] = ()) -> None:
        """`waiting_for`: models that must be READY before the server is (strict readiness after a
        failed start-up load: loading them later through the repository API makes the server ready)."""
        self._ready = ready
        self._waiting_for = tuple(waiting_for)

    def set_draining(self) -> None:
        self._draining = True

    def server_metadata(self) -> dict:
        return {"name": self.server_name, "version": __version__, "extensions": list(EXTENSIONS)}

    def model_ready(self, name: str, version: str = "") -> bool:
        if self.pipelines is not None and name in self.pipelines:
            return self.pipelines.ready(name, version)
        return self.registry.ready(name, version)

    def model_metadata(self, name: str, version: str = ""):
        if self.pipelines is not None and name in self.pipelines:
            return self.pipelines.metadata(name, version)  # awaitable: a stage may be described by a peer
        model = self.registry.get(name, version)
        spec = model.spec
        batch = [-1] if spec.max_batch_size > 0 else []
        versions = sorted((m.version for m in self.registry.loaded() if m.name == name), key=int) if not version else [version]
        return {
            "name": name,
            "versions": versions,
            "platform": model.config.platform or "onnxruntime_onnx",
            "inputs": [{"name": n, "datatype": spec.inputs[n].datatype, "shape": batch + list(spec.inputs[n].dims)}
                       for n in spec.input_order],
            "outputs": [{"name": n, "datatype": spec.outputs[n].datatype, "shape": batch + list(spec.outputs[n].dims)}
                        for n in spec.output_order],
        }

    def model_config(self, name: str, version: str = ""):
        if self.pipelines is not None and name in self.pipelines:
            return self.pipelines.config(name, version)  # awaitable
        return self.registry.get(name, version).config

    # -- pipelines ------------------------------------------------------------------------------
    def set_pipelines(self, pipelines: dict, node: str = "") -> None:
        """Serve `pipelines` ({name: [stage model, ...]}) as models; a name may not be a repository model's."""
        from .pipeline import Pipeline, PipelineSet

        clash = sorted(set(pipelines) & set(self.registry.names()))
        if clash:
            raise InvalidArgument(f"pipeline '{clash[0]}' has the name of a model in the repository")
        self.pipelines = PipelineSet([Pipeline(n, tuple(s)) for n, s in pipelines.items()],
                                     local_info=self._stage_info, peer_targets=self._stage_peers,
                                     describe_peer=lambda: self.describe_peer, infer=self.infer, node=node)

    def _stage_info(self, name: str):
        """A ready local model's metadata and config, kept per loaded version."""
        from .pipeline import StageInfo

        try:
            model = self.registry.get(name)
        except GtServeError:
            return None
        if model.state != READY:
            return None
        cached = self._stage_infos.get(name)
        if cached is None or cached[0] is not model:
            cached = self._stage_infos[name] = (model, StageInfo(self.model_metadata(name), model.config))
        return cached[1]

    def _stage_peers(self, name: str) -> list:
        return self.fleet.targets_for(name) if self.fleet is not None else []

    # -- inference ------------------------------------------------------------------------------
    async def infer(self, request: InferRequest) -> InferResponse:
        if self._draining:
            raise Unavailable("the server is shutting down and takes no new requests")
        hops = request.parameters.pop(HOPS_PARAMETER, None)
        if isinstance(hops, int) and not isinstance(hops, bool):
            request.hops = max(request.hops, hops)
        if self.pipelines is not None and request.model_name in self.pipelines:
            return await self.pipelines.infer(request)
        visited = request.parameters.pop(VISITED_PARAMETER, None)
        if self.fleet is not None and request.hops < self.max_hops and _forwardable(request):
            return await self._infer_in_fleet(request, visited)
        return await self._infer_here(request)

    async def _infer_in_fleet(self, request: InferRequest, visited: object) -> InferResponse:
        """Serve here or on peers, as the fleet router decides, under one deadline; a peer that fails, turns
        slow or leaves the live set is routed around at once, so the request is answered once, by whoever can."""
        return await serve_in_fleet(
            self.fleet, request, parse_visited(visited), local=lambda: self._infer_here(request),
            local_ready=lambda: self.registry.ready(request.model_name, request.model_version), forward=self.forward)

    async def _infer_here(self, request: InferRequest) -> InferResponse:
        start_ns = _now_ns()
        model = self.registry.get(request.model_name, request.model_version)
        if model.state != READY:
            raise Unavailable(f"model '{model.name}' version {model.version} is not ready ({model.state})")
        try:
            feeds, batch_size, shape_key = self._check_inputs(model, request)
            requested = self._check_outputs(model, request.outputs)
            deadline_s = request.deadline_s
            if deadline_s is None and self.default_timeout_s > 0:
                deadline_s = time.monotonic() + self.default_timeout_s
            outputs = await model.executor.submit(feeds, batch_size, shape_key, request.priority, deadline_s)
            response_outputs = self._make_outputs(model, outputs, requested)
        except GtServeError:
            model.stats.record_failure(_now_ns() - start_ns)
            raise
        echo = {k: v for k, v in request.parameters.items() if k not in _NOT_ECHOED} if request.parameters else {}
        return InferResponse(model.name, model.version, request.id, response_outputs, echo)

    def _check_inputs(self, model: LoadedModel, request: InferRequest) -> tuple[dict, int, tuple]:
        spec = model.spec
        name = model.name
        mbs = spec.max_batch_size
        feeds: dict[str, np.ndarray] = {}
        batch_size = 1
        shape_key = []
        for tensor in request.inputs:
            ts = spec.inputs.get(tensor.name)
            if ts is None:
                raise InvalidArgument(f"unexpected inference input '{tensor.name}' for model '{name}'")
            if tensor.name in feeds:
                raise InvalidArgument(f"input '{tensor.name}' is given more than once for model '{name}'")
            if tensor.datatype != ts.datatype:
                raise InvalidArgument(f"inference input '{tensor.name}' data-type is '{tensor.datatype}', "
                                      f"but model '{name}' expects '{ts.datatype}'")
            shape = tuple(tensor.shape)
            dims = ts.dims
            body = shape[1:] if mbs > 0 else shape
            if len(body) != len(dims) or any(d != -1 and d != s for d, s in zip(dims, body)) or (mbs > 0 and not shape):
                expected = ([-1] if mbs > 0 else []) + list(dims)
                raise InvalidArgument(f"unexpected shape for input '{tensor.name}' for model '{name}'. "
                                      f"Expected {expected}, got {list(shape)}")
            if mbs > 0:
                b = shape[0]
                if b < 1 or b > mbs or (self.max_batch_size and b > self.max_batch_size):
                    limit = min(mbs, self.max_batch_size) if self.max_batch_size else mbs
                    raise InvalidArgument(f"inference request batch-size must be <= {limit} for '{name}', "
                                          f"got {b} (input '{tensor.name}')")
                if feeds and b != batch_size:
                    raise InvalidArgument(f"input '{tensor.name}' has batch size {b} but other inputs have "
                                          f"{batch_size} for model '{name}'")
                batch_size = b
            data = tensor.data
            if data is None:
                data = self._read_shm_input(tensor)
            elif data.shape != shape:
                raise InvalidArgument(f"input '{tensor.name}': data holds {data.size} elements, "
                                      f"shape {list(shape)} needs {element_count(shape)}")
            if ts.datatype == "BYTES":
                _check_utf8(tensor.name, name, data)
            feeds[tensor.name] = data
            shape_key.append(body)
        if len(feeds) != len(spec.inputs):
            missing = [n for n in spec.input_order if n not in feeds and not spec.inputs[n].optional]
            if missing:
                raise InvalidArgument(f"expected {len(spec.inputs)} inputs but got {len(feeds)} inputs for model "
                                      f"'{name}'. Got input(s) {sorted(feeds)}, but missing required input(s) {missing}")
        return feeds, batch_size, tuple(shape_key)

    def _read_shm_input(self, tensor: Tensor) -> np.ndarray:
        p = tensor.parameters
        region = p.get("shared_memory_region")
        if not region:
            raise InvalidArgument(f"input '{tensor.name}' has no data")
        if "shared_memory_byte_size" not in p:
            raise InvalidArgument(f"input '{tensor.name}': 'shared_memory_byte_size' is required with a shared memory region")
        raw = self.shm.read(region, p.get("shared_memory_offset", 0), p["shared_memory_byte_size"], tensor.name)
        return array_from_raw(tensor.name, tensor.datatype, tuple(tensor.shape), raw)

    def _check_outputs(self, model: LoadedModel, outputs: list[RequestedOutput] | None):
        if outputs is None:
            return None
        spec = model.spec
        seen = set()
        for out in outputs:
            if out.name not in spec.outputs:
                raise InvalidArgument(f"unexpected inference output '{out.name}' for model '{model.name}'")
            if out.name in seen:
                raise InvalidArgument(f"output '{out.name}' is requested more than once for model '{model.name}'")
            seen.add(out.name)
            k = out.parameters.get("classification")
            if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
                raise InvalidArgument(f"output '{out.name}': 'classification' must be a positive integer, got {k!r}")
            region = out.parameters.get("shared_memory_region")
            if k is not None and region:
                raise InvalidArgument(f"output '{out.name}': classification cannot be written to shared memory")
            if region:
                self.shm.check(region, out.parameters.get("shared_memory_offset", 0),
                               out.parameters.get("shared_memory_byte_size"), f"output '{out.name}'")
        return outputs

    def _make_outputs(self, model: LoadedModel, arrays: list[np.ndarray], requested) -> list[Tensor]:
        spec = model.spec
        order = spec.output_order
        if requested is None:
            return [Tensor(n, spec.outputs[n].datatype, a.shape, a) for n, a in zip(order, arrays)]
        index = {n: i for i, n in enumerate(order)}
        result = []
        for out in requested:
            array = arrays[index[out.name]]
            datatype = spec.outputs[out.name].datatype
            params = out.parameters
            k = params.get("classification")
            if k is not None:
                array = classify(array, int(k), spec.max_batch_size > 0, spec.labels.get(out.name))
                datatype = "BYTES"
            region = params.get("shared_memory_region")
            if region:
                raw = raw_from_array(array, datatype)
                self.shm.write(region, params.get("shared_memory_offset", 0), raw,
                               params.get("shared_memory_byte_size"), out.name)
                shm_params = {k2: v for k2, v in params.items() if k2.startswith("shared_memory_")}
                result.append(Tensor(out.name, datatype, array.shape, None, shm_params))
            else:
                result.append(Tensor(out.name, datatype, array.shape, array))
        return result

    # -- statistics ---------------------------------------------------------------------------
    def statistics(self, name: str = "", version: str = "") -> dict:
        if not name:
            models = self.registry.loaded()
        else:
            if name not in self.registry.names():
                raise ModelNotFound(f"Request for unknown model: '{name}' is not found")
            models = [m for m in self.registry.loaded() if m.name == name and (not version or m.version == version)]
            if version and not models:
                raise ModelNotFound(f"Request for unknown model: '{name}' version {version} is not found")
        out = {"model_stats": [m.stats.as_dict() for m in sorted(models, key=lambda m: (m.name, int(m.version)))]}
        if self.energy_totals is not None:  # gt_serve extension: J/inference per model and device, totals
            out["energy"] = self.energy_totals()
        return out

    # -- repository -----------------------------------------------------------------------------
    def repository_index(self, ready_only: bool = False) -> list[dict]:
        return self.registry.index(ready_only)

    def _check_control(self, what: str, name: str) -> None:
        if self.model_control_mode != "explicit":
            raise Unsupported(f"failed to {what} '{name}': explicit model load / unload is not allowed "
                              f"(start gt-serve with --model-control-mode explicit)")

    async def load_model(self, name: str, parameters: dict | None = None) -> None:
        self._check_control("load", name)
        parameters = parameters or {}
        config = parameters.get("config")
        if config is not None and not isinstance(config, str):
            if isinstance(config, (bytes, bytearray)):
                config = bytes(config).decode("utf-8", "replace")
            else:
                raise InvalidArgument(f"failed to load '{name}': parameter 'config' must be a JSON string")
        await self.registry.load(name, config, decode_load_files(parameters))

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self._check_control("unload", name)
        await self.registry.unload(name)

    # -- shared memory --------------------------------------------------------------------------
    def shm_register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.shm.register(name, key, offset, byte_size)

    def shm_unregister(self, name: str = "") -> None:
        self.shm.unregister(name)

    def shm_status(self, name: str = "") -> list[dict]:
        return self.shm.status(name)

    def cuda_shm_register(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        self.cuda_shm.register(name, raw_handle, device_id, byte_size)

    def cuda_shm_unregister(self, name: str = "") -> None:
        self.cuda_shm.unregister(name)

    def cuda_shm_status(self, name: str = "") -> list[dict]:
        return self.cuda_shm.status(name)


def _forwardable(request: InferRequest) -> bool:
    """Requests that touch this node's shared memory must be served here."""
    if any(t.data is None for t in request.inputs):
        return False
    return not any(o.parameters.get("shared_memory_region") for o in (request.outputs or ()))


def _check_utf8(tensor: str, model: str, data: np.ndarray) -> None:
    """onnxruntime string tensors hold UTF-8 text: refuse other bytes instead of changing them."""
    for i, item in enumerate(data.reshape(-1)):
        if isinstance(item, (bytes, bytearray)):
            try:
                bytes(item).decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidArgument(f"input '{tensor}' element {i} is not valid UTF-8: model '{model}' takes "
                                      "BYTES as onnxruntime string tensors, which carry UTF-8 text only") from None


def classify(array: np.ndarray, k: int, batched: bool, labels: list[str] | None) -> np.ndarray:
    """Top-k per batch row as BYTES 'value:index[:label]' (Triton's classification extension)."""
    rows = array.reshape(array.shape[0], -1) if batched else array.reshape(1, -1)
    k = min(k, rows.shape[1])
    out = np.empty((rows.shape[0], k), dtype=object)
    for r, row in enumerate(rows):
        idx = np.argsort(-row, kind="stable")[:k]
        for j, i in enumerate(idx):
            value = row[i]
            text = f"{float(value):f}" if row.dtype.kind == "f" else str(value.item())
            label = labels[i] if labels and i < len(labels) else None
            out[r, j] = (f"{text}:{i}:{label}" if label else f"{text}:{i}").encode()
    return out if batched else out.reshape(k)
