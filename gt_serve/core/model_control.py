"""The repository side of the data plane: readiness, model metadata and config, statistics, and the
model repository extension (index, load, unload) over the ModelRegistry.

Readiness is its own object because App drives it (ready after the start-up loads, draining on
SIGTERM) while the transports only read it; strict readiness keeps the server NOT READY until the
start-up models that failed (`waiting_for`) are READY, however they get loaded later.
"""
from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import GtServeError, InvalidArgument, ModelNotFound, PathNotAllowed, Unsupported
from .memory_budget import MemoryGovernor
from .model_config import parse_json_override, shown_config
from .pipeline import StageInfo
from .registry import READY, ModelRegistry
from .repository_paths import check_request_libraries


class Readiness:
    def __init__(self, registry: ModelRegistry) -> None:
        self._registry = registry
        self._ready = False
        self._waiting_for: tuple[str, ...] = ()
        self.draining = False

    def ready(self) -> bool:
        if self._waiting_for and all(self._registry.ready(name) for name in self._waiting_for):
            self._waiting_for = ()  # strict readiness: the start-up models that failed have been loaded since
        return self._ready and not self._waiting_for and not self.draining

    def set_ready(self, ready: bool, waiting_for: tuple[str, ...] = ()) -> None:
        """`waiting_for`: models that must be READY before the server is (strict readiness after a
        failed start-up load: loading them later through the repository API makes the server ready)."""
        self._ready = ready
        self._waiting_for = tuple(waiting_for)

    def set_draining(self) -> None:
        self.draining = True


class ModelControl:
    """`mode`: the model control mode ("explicit" allows load / unload over the protocol);
    `energy_totals`: () -> {"models", "devices", "total"} added to the statistics (NodeEnergy.totals)."""

    def __init__(self, registry: ModelRegistry, mode: str = "none",
                 energy_totals: Callable[[], dict] | None = None, memory: MemoryGovernor | None = None,
                 op_libraries: tuple[str, ...] = (), refresh: Callable[[], Awaitable[None]] | None = None) -> None:
        """`memory`: the model-memory budget (core/memory_budget.py): a load past it evicts idle models;
        `op_libraries`: the custom-operator libraries a load request's config may name (server.op_libraries);
        `refresh`: brings the repositories' local copies up to date before a load (edge/remote_repository.py)."""
        self._registry = registry
        self._refresh = refresh
        self._op_libraries = frozenset(op_libraries)
        self._memory = memory
        self._mode = mode
        self._energy_totals = energy_totals
        self._stage_infos: dict[str, tuple[Any, StageInfo]] = {}
        self._shown: dict[tuple[str, str], tuple[Any, Any]] = {}  # (name, version) -> (config, as shown)

    # -- metadata ---------------------------------------------------------------------------------
    def metadata(self, name: str, version: str = "") -> dict:
        model = self._registry.get(name, version)
        spec = model.spec
        batch = [-1] if spec.max_batch_size > 0 else []
        versions = [version] if version else sorted(
            (m.version for m in self._registry.loaded() if m.name == name), key=int)
        return {
            "name": name,
            "versions": versions,
            "platform": model.config.platform or "onnxruntime_onnx",
            "inputs": [{"name": n, "datatype": spec.inputs[n].datatype, "shape": batch + list(spec.inputs[n].dims)}
                       for n in spec.input_order],
            "outputs": [{"name": n, "datatype": spec.outputs[n].datatype, "shape": batch + list(spec.outputs[n].dims)}
                        for n in spec.output_order],
        }

    def config(self, name: str, version: str = ""):
        """As Triton shows it (model_config.shown_config), made once a loaded version: raw binary requests read it."""
        model = self._registry.get(name, version)
        cached = self._shown.get((model.name, model.version))  # keyed on the kept config: a reload makes it anew
        if cached is None or cached[0] is not model.config:
            shown = shown_config(model.config, model.providers)
            cached = self._shown[(model.name, model.version)] = (model.config, shown)
        return cached[1]

    def stage_info(self, name: str) -> StageInfo | None:
        """A ready local model's metadata and config (what a pipeline stage needs), kept per loaded version."""
        try:
            model = self._registry.get(name)
        except GtServeError:
            return None
        if model.state != READY:
            return None
        cached = self._stage_infos.get(name)
        if cached is None or cached[0] is not model:
            cached = self._stage_infos[name] = (model, StageInfo(self.metadata(name), model.config))
        return cached[1]

    # -- statistics ---------------------------------------------------------------------------------
    def statistics(self, name: str = "", version: str = "") -> dict:
        registry = self._registry
        if not name:
            models = registry.loaded()
        else:
            if name not in registry.names():
                raise ModelNotFound(f"Request for unknown model: '{name}' is not found")
            models = [m for m in registry.loaded() if m.name == name and (not version or m.version == version)]
            if version and not models:
                raise ModelNotFound(f"Request for unknown model: '{name}' version {version} is not found")
        out = {"model_stats": [m.stats.as_dict() for m in sorted(models, key=lambda m: (m.name, int(m.version)))]}
        if self._energy_totals is not None:  # gt_serve extension: J/inference per model and device, totals
            out["energy"] = self._energy_totals()
        if self._memory is not None:  # gt_serve extension: per-device use and budget, evictions, reloads
            out["memory_budget"] = self._memory.stats()
        return out

    # -- repository ---------------------------------------------------------------------------------
    def index(self, ready_only: bool = False) -> list[dict]:
        return self._registry.index(ready_only)

    def _check_control(self, what: str, name: str) -> None:
        if self._mode != "explicit":
            raise Unsupported(f"failed to {what} '{name}': explicit model load / unload is not allowed "
                              f"(start gt-serve with --model-control-mode explicit)")

    async def load(self, name: str, parameters: dict | None = None) -> None:
        """parameters: "config" (JSON str), "file:<path>" (bytes)."""
        self._check_control("load", name)
        parameters = parameters or {}
        config = parameters.get("config")
        if config is not None and not isinstance(config, str):
            if isinstance(config, (bytes, bytearray)):
                config = bytes(config).decode("utf-8", "replace")
            else:
                raise InvalidArgument(f"failed to load '{name}': parameter 'config' must be a JSON string")
        if config is not None:
            _check_libraries(name, config, self._op_libraries)
        files = decode_load_files(parameters)
        verify_checksums(name, parameters.get(CHECKSUM_PARAMETER), files)
        if self._refresh is not None and not files:
            await self._refresh()
        await self._registry.load(name, config, files)
        if self._memory is not None:
            self._memory.forget(name)
            await self._memory.enforce(keep=name)

    async def unload(self, name: str, unload_dependents: bool = False) -> None:
        self._check_control("unload", name)
        if self._memory is not None:
            self._memory.forget(name)
        await self._registry.unload(name, unload_dependents)


def _check_libraries(name: str, config: str, allowed: frozenset[str]) -> None:
    """A load request's config names no custom-operator library but those the operator allowed."""
    try:
        cfg = parse_json_override(config, name)
    except GtServeError:
        return  # the registry's load answers a config it cannot read, as it answers any other
    try:
        check_request_libraries(cfg, name, allowed)
    except PathNotAllowed as exc:
        raise PathNotAllowed(f"failed to load '{name}': {exc.message}") from None


def decode_load_files(parameters: dict[str, Any]) -> dict[str, bytes]:
    """HTTP sends file overrides base64-encoded, gRPC as bytes: normalise to bytes."""
    files = {}
    for key, value in parameters.items():
        if not key.startswith("file:"):
            continue
        if isinstance(value, (bytes, bytearray)):
            files[key] = bytes(value)
        else:
            try:
                files[key] = base64.b64decode(str(value), validate=True)
            except ValueError:
                raise InvalidArgument(f"load parameter '{key}' is not valid base64") from None
    return files


CHECKSUM_PARAMETER = "gt_file_sha256"  # gt_serve extension of the load request: {"file:<path>": sha256 hex}


def verify_checksums(name: str, checksums: object, files: dict[str, bytes]) -> None:
    """With `gt_file_sha256` (a JSON object, or a dict), every streamed file must be named in it and match
    its SHA-256: a replica streamed by a peer (edge/placement_loop.py) is loaded as sent or not at all."""
    if checksums is None:
        return
    if isinstance(checksums, (bytes, bytearray)):
        checksums = bytes(checksums).decode("utf-8", "replace")
    try:
        expected = json.loads(checksums) if isinstance(checksums, str) else checksums
    except ValueError:
        expected = None
    if not isinstance(expected, dict) or not all(isinstance(v, str) for v in expected.values()):
        raise InvalidArgument(f"failed to load '{name}': parameter '{CHECKSUM_PARAMETER}' must be a JSON object "
                              "of file parameter -> SHA-256 hex digest")
    for key in sorted(set(expected) | set(files)):
        if key not in files:
            raise InvalidArgument(f"failed to load '{name}': '{CHECKSUM_PARAMETER}' names '{key}', which was not sent")
        if key not in expected:
            raise InvalidArgument(f"failed to load '{name}': '{key}' has no checksum in '{CHECKSUM_PARAMETER}'")
        digest = hashlib.sha256(files[key]).hexdigest()
        if digest != expected[key].lower():
            raise InvalidArgument(f"failed to load '{name}': '{key}' does not match its checksum (SHA-256 {digest}, "
                                  f"expected {expected[key][:64]}): the file was changed or cut in transfer")
