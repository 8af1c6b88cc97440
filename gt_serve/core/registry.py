"""Model repository: discovery, config (+ completion from the ONNX graph), versions, load/unload states.

Triton layout: NAME/config.pbtxt (optional), NAME/VERSION/model.onnx. Loading is done off the event loop (sessions
take time to build); the executors themselves come from an injected ModelHost.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from tritonclient.grpc import model_config_pb2 as mc

from ..errors import (Code, GtServeError, Internal, InvalidArgument, InvalidModelFile, ModelNotFound, PathNotAllowed,
                      Unavailable)
from .ensemble import EnsemblePlan, Step, is_ensemble, load_step_models, prepare_ensemble
from .latency_summary import SummarySettings
from .model_config import Describe, ModelSpec, complete_config, spec_from_config
from .model_dir import (MODEL_FILE_IN_DIRECTORY, read_config, run_repository_agents, version_dirs,
                        version_model_files, versions_to_load)
from .response_cache import check_cache_available
from .repository_paths import NAME_RULE, UploadArea, check_config_paths, confine, is_plain_name, shown
from .statistics import ModelStats

log = logging.getLogger(__name__)

READY, UNAVAILABLE, LOADING, UNLOADING = "READY", "UNAVAILABLE", "LOADING", "UNLOADING"


@dataclass(eq=False)
class LoadedModel:
    """One loaded version of a model."""

    name: str
    version: str
    path: Path
    config: mc.ModelConfig
    spec: ModelSpec
    stats: ModelStats
    executor: Any = None  # from ModelHost.open: has `async submit(...)` and `async close(...)`; None for an ensemble
    providers: list = field(default_factory=list)  # execution providers its sessions really got
    state: str = LOADING
    reason: str = ""
    ensemble: EnsemblePlan | None = None  # an ensemble (core/ensemble.py): no executor, its steps run
    # request forms (InferRequest.form) this version has accepted: {form: (batch size, shape key, outputs)}; not
    # copied by dataclasses.replace, so a new version or a reload starts empty (core/request_checks.check_request)
    checked_forms: dict = field(default_factory=dict, init=False, repr=False)
    # made by the data plane at the first request and, like checked_forms, new for a new version or a reload:
    groups: Any = field(default=None, init=False, repr=False)  # an ensemble's requests run together: ensemble_groups
    sequences: Any = field(default=None, init=False, repr=False)  # a sequence model's live sequences: sequences.py


@dataclass(frozen=True)
class Opened:
    """What a ModelHost built for one model version."""

    executor: Any
    providers: list = field(default_factory=list)


class ModelHost(Protocol):
    def open(self, model: LoadedModel) -> Opened:
        """Build sessions and the executor for `model` (blocking; called in a worker thread); the registry
        keeps the result in the LoadedModel it makes from `model` (which is not changed)."""

    async def close(self, model: LoadedModel, drain_timeout_s: float) -> None:
        """Stop taking work, drain or fail what is queued, release sessions."""


@dataclass
class ModelEntry:
    name: str
    state: str = UNAVAILABLE
    reason: str = "unloaded"
    versions: dict[str, LoadedModel] = field(default_factory=dict)
    latest: LoadedModel | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    uploaded: bool = False  # its versions came from files uploaded with the load request
    loaded_along: tuple[str, ...] = ()  # an ensemble's step models its load loaded (unload_dependents)


class ModelRegistry:
    def __init__(self, repository: Path | Sequence[Path], describe: Describe, host: ModelHost, *,
                 drain_timeout_s: float = 30.0, uploads: UploadArea | None = None, response_cache: bool = False,
                 summaries: SummarySettings | None = None, config_name: str = "") -> None:
        """`repository`: one or several (Triton's --model-repository, repeated; a name in two is no model until one
        is gone); `summaries`: Triton's latency summaries; `config_name`: Triton's --model-config-name (model_dir)."""
        self.repositories = (Path(repository),) if isinstance(repository, (str, Path)) else tuple(map(Path, repository))
        self._describe, self._host, self._config_name = describe, host, config_name
        self._drain_timeout_s = drain_timeout_s
        self._response_cache, self._summaries = response_cache, summaries  # response_cache: an ensemble may ask for it
        self._entries: dict[str, ModelEntry] = {}
        self._uploads = uploads if uploads is not None else UploadArea()
        self._uploads.sweep_stale()

    # -- lookups (hot path) -------------------------------------------------------------------
    def get(self, name: str, version: str = "") -> LoadedModel:
        entry = self._entries.get(name)
        if entry is None or entry.latest is None:
            if entry is None or not self._on_disk(name):
                raise ModelNotFound(f"Request for unknown model: '{name}' is not found")
            raise Unavailable(f"Request for unknown model: '{name}' has no available versions "
                              f"(state {entry.state}{': ' + entry.reason if entry.reason else ''})")
        if not version:
            return entry.latest
        model = entry.versions.get(version)
        if model is None:
            check_version(version)
            raise ModelNotFound(f"Request for unknown model: '{name}' version {version} is not found")
        return model

    def ready(self, name: str, version: str = "") -> bool:
        """READY; an ensemble also needs each step model ready (acyclic: checked when it loaded)."""
        try:
            model = self.get(name, version)
        except GtServeError:
            return False
        return model.state == READY and (model.ensemble is None or self._step_not_ready(model.ensemble) is None)

    def _step_not_ready(self, plan: EnsemblePlan) -> Step | None:
        return next((s for s in plan.steps if not self.ready(s.model, s.version)), None)

    def ensemble_of(self, name: str, version: str = "") -> LoadedModel | None:
        """The loaded ensemble `name` (hot path: one lookup), None for anything else; never raises."""
        entry = self._entries.get(name)
        if entry is None or entry.latest is None or entry.latest.ensemble is None:
            return None
        return entry.versions.get(version) if version else entry.latest

    def loaded(self) -> list[LoadedModel]:
        return [m for e in self._entries.values() for m in e.versions.values()]

    def names(self) -> list[str]:
        return sorted(set(self._entries) | set(self.scan()))

    def repository_models(self) -> list[str]:
        """Models with loaded versions that came from the repository (not from uploaded files)."""
        return [name for name, e in self._entries.items() if e.versions and not e.uploaded]

    def is_loaded(self, name: str) -> bool:
        entry = self._entries.get(name)
        return entry is not None and bool(entry.versions)

    # -- repository -----------------------------------------------------------------------------
    def scan(self) -> list[str]:
        return sorted({p.name for root in self.repositories if root.is_dir()
                       for p in root.iterdir() if is_plain_name(p.name) and p.is_dir()})

    def model_dirs(self, name: str) -> list[Path]:
        """The directories named `name` in the repositories: one where the model is unique, none for a name that is
        not plain (only ever a direct child is looked at)."""
        if not is_plain_name(name):
            return []
        return [root / name for root in self.repositories if (root / name).is_dir()]

    def _model_dir(self, name: str) -> Path:
        dirs = self.model_dirs(name)
        if not dirs:  # gone since the load began
            raise InvalidArgument("its model directory is gone")
        if len(dirs) > 1:  # Triton's words; the paths go to the log only
            log.error("model '%s' is in %d model repositories: %s", name, len(dirs), ", ".join(map(str, dirs)))
            raise InvalidArgument(f"not unique across all model repositories (in {len(dirs)} of them)")
        return dirs[0]

    def _on_disk(self, name: str) -> bool:
        """A model directory in a repository, or uploaded files: only ever a plain name, a direct child."""
        return bool(self.model_dirs(name)) or (name in self._entries and self._entries[name].uploaded)

    def index(self, ready_only: bool = False) -> list[dict]:
        rows = []
        for name in self.names():
            entry = self._entries.get(name)
            if entry is None or not entry.versions:
                if ready_only:
                    continue
                state, reason = (entry.state, entry.reason) if entry else (UNAVAILABLE, "unloaded")
                rows.append({"name": name, "version": "", "state": state, "reason": reason})
                continue
            for version, model in sorted(entry.versions.items(), key=lambda kv: int(kv[0])):
                state, reason = model.state, model.reason
                step = self._step_not_ready(model.ensemble) if model.ensemble and state == READY else None
                if step is not None:
                    state, reason = UNAVAILABLE, f"{step.label} is not ready"
                if ready_only and state != READY:
                    continue
                rows.append({"name": name, "version": version, "state": state, "reason": reason})
        return rows

    # -- load / unload --------------------------------------------------------------------------
    async def load(self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None, *,
                   _chain: tuple[str, ...] = ()) -> None:
        if not is_plain_name(name):
            if files:
                raise PathNotAllowed(f"failed to load '{shown(name)}': invalid model name ({NAME_RULE})")
            raise _no_model_dir(name)  # the answer for any unknown name: nothing outside is looked at
        if files and config_json is None:
            raise InvalidArgument(f"failed to load '{name}': file overrides need a 'config' parameter")
        entry = self._entries.setdefault(name, ModelEntry(name))
        async with entry.lock:
            upload_dir = None
            if not files and not self.model_dirs(name):
                if not entry.versions and self._entries.get(name) is entry:
                    self._entries.pop(name)
                raise _no_model_dir(name)
            try:
                model_dir, upload_dir = await self._model_source(name, files)
                entry.state, entry.reason = LOADING, ""
                along = await self._load_steps(name, model_dir, config_json, _chain + (name,))
                new_versions = await asyncio.to_thread(self._open_versions, name, model_dir, config_json)
            except BaseException as exc:
                error = _load_error(name, exc)
                entry.state, entry.reason = (READY, "") if entry.versions else (UNAVAILABLE, str(error or "cancelled"))
                if error is None:
                    raise
                raise error from None
            finally:
                if upload_dir is not None:  # sessions hold what they need: uploaded bytes never outlive the load
                    self._uploads.remove(upload_dir)
            old = list(entry.versions.values())
            entry.versions = new_versions
            entry.latest, entry.loaded_along = new_versions[max(new_versions, key=int)], tuple({**dict.fromkeys(
                entry.loaded_along), **dict.fromkeys(along)})
            entry.state, entry.reason, entry.uploaded = READY, "", upload_dir is not None
            for model in new_versions.values():
                model.state = READY
            for model in old:
                await self._close(model, "unloaded (replaced by a reload)")
        log.info("loaded model %s versions %s", name, ",".join(sorted(new_versions, key=int)))

    async def _model_source(self, name: str, files: dict[str, bytes] | None) -> tuple[Path, Path | None]:
        """Where a load reads the model from, and the upload area it wrote there (None: a repository's model)."""
        if files:
            upload_dir = await asyncio.to_thread(self._uploads.write, name, files)
            return upload_dir, upload_dir
        return self._model_dir(name), None

    async def _load_steps(self, name: str, model_dir: Path, config_json: str | None,
                          chain: tuple[str, ...]) -> tuple[str, ...]:
        """An ensemble's step models not loaded yet, loaded first (as Triton does); () for a plain model.
        `chain`: the ensembles whose loads led here, this one last (load's `_chain`: a cycle is refused)."""
        base, _ = read_config(name, model_dir, config_json, self._config_name)
        if not is_ensemble(base):
            return ()
        return await load_step_models(base, chain, is_loaded=self.is_loaded, load=self.load,
                                      in_repository=lambda m: bool(self.model_dirs(m)))

    def _open_versions(self, name: str, model_dir: Path, config_json: str | None) -> dict[str, LoadedModel]:
        base, explicit = read_config(name, model_dir, config_json, self._config_name)
        check_config_paths(base, name)
        run_repository_agents(base, model_dir, name)
        if is_ensemble(base):
            return self._open_ensemble(name, model_dir, base)
        filename = base.default_model_filename or "model.onnx"
        files = version_model_files(model_dir, filename)
        if not files:
            raise InvalidArgument(f"no version directory with '{shown(filename)}' in the model directory (a file, "
                                  f"or a directory holding {MODEL_FILE_IN_DIRECTORY})")
        chosen = versions_to_load(base, sorted(files, reverse=True))
        paths = {v: confine(model_dir, files[v], model=name, what="default_model_filename") for v in chosen}
        graph_in, graph_out = self._describe_file(name, model_dir, paths[chosen[0]], base)
        opened: dict[str, LoadedModel] = {}
        try:
            for version in chosen:
                cfg = mc.ModelConfig()
                cfg.CopyFrom(base)
                path = paths[version]
                if version != chosen[0]:
                    graph_in, graph_out = self._describe_file(name, model_dir, path, base)
                complete_config(cfg, name, graph_in, graph_out, explicit)
                spec = spec_from_config(cfg, model_dir)
                stats = ModelStats(name, str(version), self._summaries)
                draft = LoadedModel(name, str(version), path, cfg, spec, stats)
                built = self._host.open(draft)
                opened[str(version)] = replace(draft, executor=built.executor, providers=list(built.providers))
        except Exception as exc:
            for model in opened.values():
                _close_quietly(self._host, model)
            if isinstance(exc, GtServeError):
                raise
            raise InvalidArgument(f"{type(exc).__name__}: {_without_dir(str(exc), model_dir)}") from None
        return opened

    def _open_ensemble(self, name: str, model_dir: Path, cfg: mc.ModelConfig) -> dict[str, LoadedModel]:
        """Triton's layout: an empty version directory; the plan checked against the loaded step models."""
        def step_spec(step: Step):
            try:
                return self.get(step.model, step.version).spec
            except GtServeError as exc:
                raise InvalidArgument(f"ensemble '{name}': {step.label}: {exc.message}") from None

        def plan_of(model: str) -> EnsemblePlan | None:
            entry = self._entries.get(model)
            return entry.latest.ensemble if entry is not None and entry.latest is not None else None

        plan = prepare_ensemble(cfg, name, step_spec, plan_of)
        check_cache_available(cfg, name, self._response_cache)
        available = sorted((int(p.name) for p in version_dirs(model_dir)), reverse=True)
        if not available:
            raise InvalidArgument(f"ensemble '{name}': no version directory (Triton's layout: an empty '{name}/1/')")
        spec = spec_from_config(cfg, model_dir)
        return {str(v): LoadedModel(name, str(v), model_dir / str(v), cfg, spec,
                                    ModelStats(name, str(v), self._summaries), ensemble=plan)
                for v in versions_to_load(cfg, available)}

    def _describe_file(self, name: str, model_dir: Path, path: Path, cfg: mc.ModelConfig) -> tuple[list, list]:
        """The graph's inputs and outputs; a file the backend cannot parse is the client's error, not ours."""
        try:
            return self._describe(str(path), tuple(cfg.model_operations.op_library_filename))
        except GtServeError:
            raise
        except Exception as exc:
            relative = _without_dir(str(path), model_dir)
            raise InvalidModelFile(f"model '{name}': '{relative}' is not a valid ONNX model "
                                   f"({_without_dir(str(exc), model_dir)})") from None

    async def unload(self, name: str, unload_dependents: bool = False, reason: str = "unloaded") -> None:
        """`unload_dependents`: also the step models an ensemble's load loaded, unless another ensemble uses them;
        `reason`: what the index shows (e.g. "evicted (memory budget)")."""
        entry = self._entries.get(name) if is_plain_name(name) else None
        if entry is None:
            if not self._on_disk(name):
                raise InvalidArgument(f"failed to unload '{shown(name)}': unknown model")
            return
        async with entry.lock:
            models = list(entry.versions.values())
            entry.versions, entry.latest = {}, None
            entry.state, entry.reason = UNLOADING, ""
            for model in models:
                await self._close(model, reason)
            entry.state, entry.reason, entry.uploaded = UNAVAILABLE, reason, False
            along, entry.loaded_along = entry.loaded_along, ()
            if not self._on_disk(name) and self._entries.get(name) is entry:
                self._entries.pop(name)  # its directory is gone (poll mode): no longer in the index either
        log.info("unloaded model %s", name)
        used = {s.model for m in self.loaded() if m.ensemble is not None for s in m.ensemble.steps}
        for model in (along if unload_dependents else ()):
            if model not in used:
                await self.unload(model, unload_dependents=True)

    async def _close(self, model: LoadedModel, reason: str) -> None:
        model.state, model.reason = UNLOADING, ""
        try:
            await self._host.close(model, self._drain_timeout_s)
        finally:
            model.state, model.reason = UNAVAILABLE, reason

    async def close_all(self) -> None:
        try:
            for name in list(self._entries):
                await self.unload(name)
        finally:
            self._uploads.close()


def check_version(version: str) -> None:
    """A version string that is not a number is refused in Triton's words (its GetModelVersionFromString)."""
    text = version.strip()
    digits = text[1:] if text[:1] in "+-" else text
    if not (digits.isascii() and digits.isdigit()):
        raise InvalidArgument(f"failed to get model version from specified version string '{version}' "
                              "(details: stol), version should be an integral value > 0")
    if text.startswith("-"):
        raise InvalidArgument(f"invalid model version specified '{version}' , version should be an integral "
                              "value > 0")


def _no_model_dir(name: str) -> InvalidArgument:
    return InvalidArgument(f"failed to load '{shown(name)}': no model directory '{shown(name)}' in the repository")


def _load_error(name: str, exc: BaseException) -> GtServeError | None:
    """What a failed load answers: the cause's kind, its message after "failed to load 'NAME': "
    (once); None for a cancellation, which goes on as it is."""
    if not isinstance(exc, Exception):
        return None
    if not isinstance(exc, GtServeError):
        log.error("loading model %s failed", name, exc_info=(type(exc), exc, exc.__traceback__))
        return Internal(f"failed to load '{name}': internal error ({type(exc).__name__}), see the server log")
    message = f"failed to load '{name}': {exc.message}"
    if isinstance(exc, (InvalidModelFile, PathNotAllowed)):
        return type(exc)(message)
    if exc.code is Code.INVALID_ARGUMENT:
        return InvalidArgument(message)
    return GtServeError(message, code=exc.code)


def _without_dir(text: str, directory: Path) -> str:
    """A backend's message with the model directory's server-side path taken out."""
    for form in {str(directory), str(Path(directory).resolve())}:
        text = text.replace(form + "/", "").replace(form, "<model directory>")
    return text


def _close_quietly(host: ModelHost, model: LoadedModel) -> None:
    closer = getattr(host, "close_now", None)
    if closer is not None:
        closer(model)
