"""Triton ensembles: `platform: "ensemble"` models whose `ensemble_scheduling` steps form a DAG of models.

Three parts, each usable alone:
  plan_from_config / complete_ensemble_config   the config read into an EnsemblePlan (checked fields)
  validate_plan                                  the DAG checked at load against the step models' specs:
                                                 every tensor produced once, every input and output
                                                 connected, no cycle, datatypes and shapes compatible
  run_dag                                        the step engine: a step starts as soon as its inputs exist,
                                                 steps whose inputs are ready run concurrently; a failure
                                                 cancels the steps still running. Pipelines (core/pipeline.py)
                                                 run on it too, as linear DAGs.
  run_ensemble                                   one ensemble request: each step is a request sent back through
                                                 the data plane's `infer` (batching, lanes, the fleet router)

Errors are InvalidArgument naming the ensemble, the step (index and model) and the tensor.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from tritonclient.grpc import model_config_pb2 as mc

from ..errors import ConfigError, GtServeError, InvalidArgument
from ..types import InferRequest, InferResponse, RequestedOutput, Tensor
from .model_config import v2_from_config_type
from .model_config_fields import check_ensemble_fields
from .repository_paths import shown

ENSEMBLE_PLATFORM = "ensemble"


@dataclass(frozen=True, slots=True)
class Step:
    """One ensemble step: `input_map` (step-model input, ensemble tensor), `output_map` (step-model
    output, ensemble tensor); `version` "" = the step model's latest."""

    index: int
    model: str
    version: str
    input_map: tuple[tuple[str, str], ...]
    output_map: tuple[tuple[str, str], ...]

    @property
    def needs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t for _, t in self.input_map))

    @property
    def gives(self) -> tuple[str, ...]:
        return tuple(t for _, t in self.output_map)

    @property
    def label(self) -> str:
        return f"step {self.index} ('{self.model}')"


@dataclass(frozen=True, slots=True)
class EnsemblePlan:
    name: str
    steps: tuple[Step, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    # its requests may run their steps together (core/ensemble_groups.py): not where a step model, or a nested
    # ensemble's, has ragged batching, whose batch inputs count a group as one request (core/ragged.py)
    groups: bool = True


def is_ensemble(cfg: mc.ModelConfig) -> bool:
    return cfg.platform == ENSEMBLE_PLATFORM or cfg.backend == ENSEMBLE_PLATFORM


def complete_ensemble_config(cfg: mc.ModelConfig, name: str) -> mc.ModelConfig:
    """The ensemble's config checked and filled the Triton way (no graph: types and dims must be stated)."""
    check_ensemble_fields(cfg, name)
    cfg.name = cfg.name or name
    if cfg.name != name:
        raise ConfigError(f"model '{name}': config name '{cfg.name}' does not match the directory name")
    cfg.platform, cfg.backend = ENSEMBLE_PLATFORM, ""
    for what, tensors in (("input", cfg.input), ("output", cfg.output)):
        if not tensors:
            raise ConfigError(f"ensemble '{name}': the config declares no {what}")
        for t in tensors:
            if t.data_type == mc.TYPE_INVALID or not t.dims:
                raise ConfigError(f"ensemble '{name}': {what} '{t.name}' needs data_type and dims "
                                  "(an ensemble has no model file to complete them from)")
    if not cfg.HasField("version_policy"):
        cfg.version_policy.latest.num_versions = 1
    return cfg


def plan_from_config(cfg: mc.ModelConfig) -> EnsemblePlan:
    name = cfg.name
    steps = []
    for i, s in enumerate(cfg.ensemble_scheduling.step):
        if not s.model_name:
            raise InvalidArgument(f"ensemble '{name}': step {i} has no model_name")
        if s.model_version < -1 or s.model_version == 0:
            raise InvalidArgument(f"ensemble '{name}': step {i} ('{s.model_name}') model_version {s.model_version}: "
                                  "-1 (latest) or a version > 0")
        steps.append(Step(i, s.model_name, "" if s.model_version == -1 else str(s.model_version),
                          tuple(sorted(s.input_map.items())), tuple(sorted(s.output_map.items()))))
    if not steps:
        raise InvalidArgument(f"ensemble '{name}': ensemble_scheduling has no step")
    return EnsemblePlan(name, tuple(steps), tuple(t.name for t in cfg.input), tuple(t.name for t in cfg.output))


# -- validation ---------------------------------------------------------------------------------------
# the step model's spec (core/model_config.ModelSpec: max_batch_size, inputs/outputs of TensorSpec) or an error
StepSpec = Callable[[Step], object]


@dataclass(frozen=True, slots=True)
class _Known:
    """What is known of an ensemble tensor: datatype and full shape (batch dim included), who made it."""

    datatype: str
    shape: tuple[int, ...]
    source: str


def validate_plan(plan: EnsemblePlan, cfg: mc.ModelConfig, step_spec: StepSpec) -> None:
    """The DAG checked against the step models: raises InvalidArgument naming the step and the tensor."""
    name, batch = plan.name, [-1] if cfg.max_batch_size > 0 else []
    known = {t.name: _Known(v2_from_config_type(t.data_type), tuple(batch + list(t.dims)), "ensemble input")
             for t in cfg.input}
    specs = []
    for step in plan.steps:
        if step.model == name:
            raise InvalidArgument(f"ensemble '{name}': {step.label} is the ensemble itself")
        specs.append(step_spec(step))
        _check_step(plan, cfg, step, specs[-1], known)
    for step, spec in zip(plan.steps, specs):
        sb = [-1] if spec.max_batch_size > 0 else []
        for key, tensor in step.input_map:
            have = known.get(tensor)
            if have is None:
                raise InvalidArgument(f"ensemble '{name}': {step.label} reads tensor '{tensor}', which neither an "
                                      "ensemble input nor a step produces")
            want = spec.inputs[key]
            _compatible(name, f"{step.label} input '{key}'", tensor, have, want.datatype, tuple(sb + list(want.dims)))
    _check_outputs(plan, cfg, known, batch)
    _check_acyclic(plan)


def _check_step(plan: EnsemblePlan, cfg: mc.ModelConfig, step: Step, spec, known: dict) -> None:
    """One step against its model's spec: batching and its maps; records in `known` what it produces."""
    name = plan.name
    sb = [-1] if spec.max_batch_size > 0 else []
    if cfg.max_batch_size > spec.max_batch_size > 0 or (cfg.max_batch_size > 0 and spec.max_batch_size == 0):
        raise InvalidArgument(f"ensemble '{name}': {step.label} has max_batch_size {spec.max_batch_size}, less "
                              f"than the ensemble's {cfg.max_batch_size}")
    for key, _ in step.input_map:
        if key not in spec.inputs:
            raise InvalidArgument(f"ensemble '{name}': {step.label} maps input '{key}', which model "
                                  f"'{step.model}' does not have (inputs: {', '.join(spec.input_order)})")
    mapped = {k for k, _ in step.input_map}
    unmapped = [n for n in spec.input_order if n not in mapped and not spec.inputs[n].optional]
    if unmapped:
        raise InvalidArgument(f"ensemble '{name}': {step.label} leaves input '{unmapped[0]}' of model "
                              f"'{step.model}' unmapped")
    for key, tensor in step.output_map:
        out = spec.outputs.get(key)
        if out is None:
            raise InvalidArgument(f"ensemble '{name}': {step.label} maps output '{key}', which model "
                                  f"'{step.model}' does not have (outputs: {', '.join(spec.output_order)})")
        if tensor in known:
            raise InvalidArgument(f"ensemble '{name}': tensor '{tensor}' is produced twice ({known[tensor].source} "
                                  f"and {step.label})")
        known[tensor] = _Known(out.datatype, tuple(sb + list(out.dims)), step.label)


def _check_outputs(plan: EnsemblePlan, cfg: mc.ModelConfig, known: dict, batch: list) -> None:
    consumed = {t for s in plan.steps for t in s.needs}
    for t in cfg.input:
        if t.name not in consumed:
            raise InvalidArgument(f"ensemble '{plan.name}': input '{t.name}' is not read by any step")
    for t in cfg.output:
        have = known.get(t.name)
        if have is None or have.source == "ensemble input":
            raise InvalidArgument(f"ensemble '{plan.name}': output '{t.name}' is not produced by any step")
        _compatible(plan.name, f"output '{t.name}'", t.name, have, v2_from_config_type(t.data_type),
                    tuple(batch + list(t.dims)))


def _compatible(name: str, where: str, tensor: str, have: _Known, datatype: str, shape: tuple[int, ...]) -> None:
    if have.datatype != datatype:
        raise InvalidArgument(f"ensemble '{name}': {where} takes {datatype} but tensor '{tensor}' ({have.source}) "
                              f"is {have.datatype}")
    fits = len(have.shape) == len(shape) and all(a == -1 or b == -1 or a == b for a, b in zip(have.shape, shape))
    if not fits:
        raise InvalidArgument(f"ensemble '{name}': {where} has shape {list(shape)} but tensor '{tensor}' "
                              f"({have.source}) has shape {list(have.shape)}")


def _check_acyclic(plan: EnsemblePlan) -> None:
    """Kahn's order over the steps: a step that never gets its inputs sits on a cycle."""
    available = set(plan.inputs)
    left = list(plan.steps)
    for _ in range(len(plan.steps)):
        ready = [s for s in left if all(t in available for t in s.needs)]
        if not ready:
            break
        for s in ready:
            available.update(s.gives)
        left = [s for s in left if s not in ready]
    if left:
        raise InvalidArgument(f"ensemble '{plan.name}': the steps form a cycle: "
                              + ", ".join(s.label for s in left) + " wait on each other")


# -- execution ----------------------------------------------------------------------------------------
class StepNeedsInputs(InvalidArgument):
    """A step whose inputs no earlier step or the request provides (pipelines find this at run time)."""

    def __init__(self, step: int, missing: list[str]) -> None:
        super().__init__(f"step {step} needs input(s) {missing}")
        self.step, self.missing = step, missing


# (step index, the pool of tensors so far) -> the tensors it produces, by pool name
RunStep = Callable[[int, Mapping[str, Tensor]], Awaitable[Mapping[str, Tensor]]]


async def run_dag(needs: Sequence[Sequence[str]], pool: dict[str, Tensor], run_step: RunStep) -> dict[str, Tensor]:
    """Run every step once, each as soon as every tensor it `needs` is in `pool`; returns the pool.

    One ready step and nothing running: awaited directly (a linear chain creates no task). Several:
    tasks, and the loop resumes at the first that finishes. Bounded: each round finishes a step."""
    waiting = list(range(len(needs)))
    running: dict[asyncio.Task, int] = {}
    for _ in range(len(needs) + 1):
        ready = [i for i in waiting if all(n in pool for n in needs[i])]
        waiting = [i for i in waiting if i not in ready]
        if not running and len(ready) == 1:
            pool.update(await run_step(ready[0], pool))
            continue
        for i in ready:
            running[asyncio.ensure_future(run_step(i, dict(pool)))] = i
        if not running:
            if waiting:
                raise StepNeedsInputs(waiting[0], [n for n in needs[waiting[0]] if n not in pool])
            return pool
        await _finish_one(running, pool)
    while running:  # unreachable unless a step is listed twice; drain instead of leaking tasks
        await _finish_one(running, pool)
    return pool


async def _finish_one(running: dict[asyncio.Task, int], pool: dict[str, Tensor]) -> None:
    try:
        done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        await _cancel(running)
        raise
    for task in done:
        running.pop(task)
        if task.exception() is not None:
            await _cancel(running)
            raise task.exception()
        pool.update(task.result())


async def _cancel(running: dict[asyncio.Task, int]) -> None:
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)
    running.clear()


def step_request(request: InferRequest, model: str, version: str, inputs: list[Tensor],
                 outputs: list[RequestedOutput] | None) -> InferRequest:
    """A step's own request: the ensemble request's id, parameters, deadline, priority and hops; its form (checked
    once per step model: core/request_checks.py) where its inputs are plain arrays in memory and its outputs plain:
    not BYTES (whose UTF-8 is checked each time), nothing in shared memory, no `classification` (a pipeline's last
    stage is asked for the client's outputs, whose regions differ from one request to the next)."""
    plain = all(t.data is not None and not t.parameters and t.datatype != "BYTES" for t in inputs) and \
        (outputs is None or not any(o.parameters for o in outputs))
    form = None if not plain else (
        "ensemble step", tuple((t.name, t.datatype, tuple(t.shape)) for t in inputs),
        None if outputs is None else tuple(o.name for o in outputs))
    return InferRequest(model, version, request.id, inputs, outputs, dict(request.parameters), request.deadline_s,
                        request.priority, request.hops, form)


Infer = Callable[[InferRequest], Awaitable[InferResponse]]


async def run_ensemble(plan: EnsemblePlan, request: InferRequest, inputs: Mapping[str, Tensor],
                       infer: Infer) -> dict[str, Tensor]:
    """The ensemble outputs (by name) for a request whose inputs were checked against the ensemble."""

    async def run_step(i: int, pool: Mapping[str, Tensor]) -> dict[str, Tensor]:
        step = plan.steps[i]
        feeds = [_renamed(pool[tensor], key) for key, tensor in step.input_map]
        wanted = [RequestedOutput(key) for key, _ in step.output_map]
        try:
            response = await infer(step_request(request, step.model, step.version, feeds, wanted))
        except GtServeError as exc:
            exc.message = f"ensemble '{plan.name}' {step.label}: {exc.message}"
            raise
        by_name = {t.name: t for t in response.outputs}
        return {tensor: _renamed(by_name[key], tensor) for key, tensor in step.output_map}

    pool = await run_dag([s.needs for s in plan.steps], dict(inputs), run_step)
    return {n: pool[n] for n in plan.outputs}


def _renamed(t: Tensor, name: str) -> Tensor:
    return t if t.name == name else Tensor(name, t.datatype, t.shape, t.data)


def prepare_ensemble(cfg: mc.ModelConfig, name: str, step_spec: StepSpec,
                     plan_of: Callable[[str], EnsemblePlan | None]) -> EnsemblePlan:
    """Load time: the config completed, its plan validated against the steps, and no cycle through the
    ensembles already loaded (`plan_of`: a loaded model's plan, None for a plain model)."""
    complete_ensemble_config(cfg, name)
    plan = plan_from_config(cfg)
    validate_plan(plan, cfg, step_spec)
    seen: set[str] = set()
    stack = [(s.model, s.label) for s in plan.steps]
    groups = not any(getattr(step_spec(s), "ragged", None) is not None for s in plan.steps)
    while stack:  # bounded: each loaded model is expanded once
        model, label = stack.pop()
        if model == name:
            raise InvalidArgument(f"ensemble '{name}': {label} leads back to '{name}' through nested ensembles")
        inner = plan_of(model) if model not in seen else None
        seen.add(model)
        if inner is not None:
            stack.extend((s.model, label) for s in inner.steps)
            groups = groups and inner.groups
    return plan if groups else replace(plan, groups=False)


def record_ensemble_success(stats, batch_size: int, request_ns: int) -> None:
    """An ensemble request in its statistics (Triton: counted like a model's, its steps count their own)."""
    stats.record_success(request_ns, 0)
    stats.inference_count += batch_size
    stats.execution_count += 1
    stats.last_inference_ms = time.time_ns() // 1_000_000


async def load_step_models(cfg: mc.ModelConfig, chain: tuple[str, ...], *, is_loaded: Callable[[str], bool],
                           in_repository: Callable[[str], bool],
                           load: Callable[..., Awaitable[None]]) -> tuple[str, ...]:
    """The step models not loaded yet, loaded before the ensemble (Triton loads an ensemble's composing
    models with it); returns their names. `chain`: the ensembles being loaded, this one last."""
    name, along = chain[-1], []
    for i, step in enumerate(cfg.ensemble_scheduling.step):
        model = step.model_name
        if model in chain:
            raise InvalidArgument(f"ensemble '{name}': step {i} ('{model}') leads back to '{model}' "
                                  "through nested ensembles")
        if is_loaded(model) or model in along:
            continue
        if not in_repository(model):
            raise InvalidArgument(f"ensemble '{name}': step {i} ('{shown(model)}') is not a model of the repository")
        try:
            await load(model, _chain=chain)
        except GtServeError as exc:
            raise InvalidArgument(f"ensemble '{name}': step {i} ('{model}'): {exc.message}") from None
        along.append(model)
    return tuple(along)
