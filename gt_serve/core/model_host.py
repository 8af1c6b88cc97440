"""Hosts loaded models on the shared lanes: per model version, builds its runners and one ModelExecutor
(batcher + job factory + completion handling), registers it with the stream scheduler, and closes it on unload.

Runners and batch jobs come from injected factories, so this module never touches onnxruntime. A model
that does not fit on its GPU may load on the CPU lanes instead (the spill path, core/spill.py).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from ..errors import ConfigError, DeviceOutOfMemory
from .answer_order import AnswerOrder
from .batch_completion import BatchCompletion, EnergyObserver
from .batch_policy import BatchConfig
from .batcher import Batcher, QueuePolicy
from .memory_budget import LoadMeasure, MemoryBook
from .model_executor import JobFactory, ModelExecutor
from .rate_limiter import model_needs
from .registry import LoadedModel, Opened
from .response_cache import check_cache_available
from .sequence_config import batching as sequence_batching
from .session_settings import SessionSettings
from .spill import Spill, may_spill, over_device_budget, slo_miss
from .stream_scheduler import StreamScheduler
from .tiny_models import is_tiny
from .warmup import run_warmup

log = logging.getLogger(__name__)

# runner_factory(model_path, device, lane[, settings]) -> runner with .run(feeds, output_names) and .close();
# `settings` (core/session_settings.SessionSettings) is passed only for a model whose config asks for any
RunnerFactory = Callable[[str, str, Any], Any]


def batching_from_config(cfg: mc.ModelConfig, knobs: Mapping[str, Any]) -> tuple[BatchConfig, QueuePolicy, int, int,
                                                                                  dict[int, QueuePolicy]]:
    """Triton's dynamic_batching block (+ our YAML knobs) -> batch config, the default queue policy, priority levels,
    the default level, and the levels' own queue policies (priority_queue_policy)."""
    db = cfg.dynamic_batching
    has_db = cfg.HasField("dynamic_batching")
    mbs = int(cfg.max_batch_size)
    delay_s = db.max_queue_delay_microseconds / 1e6 if has_db else 0.0
    preferred = tuple(int(p) for p in db.preferred_batch_size) if has_db else ()
    in_order = bool(db.preserve_ordering)
    sequences = sequence_batching(cfg)  # a sequence model's requests of different sequences batch together
    if sequences is not None:
        has_db, (delay_s, preferred, in_order) = True, sequences
    if "max_queue_delay_us" in knobs:
        delay_s = float(knobs["max_queue_delay_us"]) / 1e6
    in_order = bool(knobs.get("preserve_ordering", in_order))
    # like Triton, requests are merged only with a dynamic_batching block (or the YAML knob saying so)
    mbs_eff = mbs if knobs.get("dynamic_batching", has_db) else 0
    policy = _queue_policy(db.default_queue_policy, knobs.get("max_queue_size"))
    levels = {int(level): _queue_policy(qp) for level, qp in db.priority_queue_policy.items()}
    return (BatchConfig(mbs_eff, preferred, delay_s, in_order), policy, int(db.priority_levels),
            int(db.default_priority_level), levels)


def _queue_policy(qp: mc.ModelQueuePolicy, max_queue_size: Any = None) -> QueuePolicy:
    """One of Triton's queue policies (`max_queue_size`: the node YAML's knob, for the default policy)."""
    return QueuePolicy(
        max_queue_size=int(qp.max_queue_size if max_queue_size is None else max_queue_size),
        default_timeout_s=qp.default_timeout_microseconds / 1e6,
        allow_timeout_override=bool(qp.allow_timeout_override) or not qp.default_timeout_microseconds,
        reject_on_timeout=qp.timeout_action != mc.ModelQueuePolicy.DELAY,
    )


@dataclass
class _Placed:
    """A model's sessions on its lanes, as one load made them: where, what they took, the warm-up (runs, ns)."""

    lanes: list
    runners: dict  # lane -> runner
    footprint: dict[str, int]  # device -> bytes
    warmup: tuple[int, int] | None
    tiny: bool = False  # core/tiny_models.py: its largest batch runs in microseconds (on CPU lanes)

    def close(self) -> None:
        for runner in dict.fromkeys(self.runners.values()):
            runner.close()


class LocalModelHost:
    def __init__(self, loop: asyncio.AbstractEventLoop, scheduler: StreamScheduler, lanes: list,
                 runner_factory: RunnerFactory, job_factory: JobFactory,
                 model_knobs: Mapping[str, Mapping[str, Any]] | None = None, *,
                 energy_observer: EnergyObserver | None = None, response_cache: bool = False,
                 memory: MemoryBook | None = None, slo_s: Mapping[str, float] | None = None,
                 inline_max_ns: int = 0, launch: str = "never", tiny_run_ns: int = 0) -> None:
        """`slo_s`: latency SLO per model name (router.slo_ms), for the spill path's check (core/spill.py);
        `inline_max_ns`: one-row batches shorter than this run on the loop thread (ModelExecutor._runs_inline);
        `launch`: lanes.launch, whether batches are launched into onnxruntime's pool from the loop
        (core/launch_choice.py)."""
        self.loop = loop
        self.scheduler = scheduler
        self.lanes = lanes
        self._runner_factory = runner_factory
        self._job_factory = job_factory
        self._knobs = model_knobs or {}
        self._energy_observer = energy_observer  # e.g. NodeEnergy.on_batch
        self._response_cache = response_cache  # the server has a response cache (server.response_cache_bytes > 0)
        self._memory = memory  # model-memory budget book: footprints measured here (core/memory_budget.py)
        self._slo_s = dict(slo_s or {})
        self._inline_max_ns = inline_max_ns
        self._tiny_run_ns = tiny_run_ns  # core/tiny_models.py's bound; 0 = no model is tiny
        self._launch = launch

    def _lanes_for(self, cfg: mc.ModelConfig, cpu_only: bool = False) -> list:
        """instance_group -> the shared lanes this model may use: per group, `count` lanes of its kind
        (KIND_GPU on the listed GPUs; KIND_AUTO: the GPU when there is one, else the CPU; `cpu_only`, for a
        spill: KIND_AUTO on the CPU)."""
        cpu_lanes = [lane for lane in self.lanes if not lane.on_gpu]
        chosen: list = []
        for group in cfg.instance_group:
            gpus = {int(d) for d in group.gpus}
            gpu_lanes = [lane for lane in self.lanes
                         if lane.on_gpu and (not gpus or int(lane.device.split(":")[1]) in gpus)]
            if group.kind == mc.ModelInstanceGroup.KIND_CPU:
                pool = cpu_lanes
            elif group.kind == mc.ModelInstanceGroup.KIND_GPU and not gpu_lanes:
                raise ConfigError(f"model '{cfg.name}': instance_group kind KIND_GPU{' gpus ' + str(sorted(gpus)) if gpus else ''}"
                                  " but this server has no such GPU lane (use KIND_AUTO or KIND_CPU)")
            else:  # KIND_GPU, or KIND_AUTO: the GPU when there is one (not when spilling), else the CPU
                pool = cpu_lanes if cpu_only else (gpu_lanes or cpu_lanes)
            if group.count <= 0:  # unspecified: every lane of that kind (shown in /config as the count)
                group.count = len(pool)
            for lane in pool[:group.count]:
                if lane not in chosen:
                    chosen.append(lane)
        return chosen or cpu_lanes or list(self.lanes)

    def _open_runners(self, model: LoadedModel, lanes: list, measure: LoadMeasure,
                      settings: SessionSettings | None = None) -> dict:
        """lane -> runner: one session per GPU lane (bound to its stream), one per device for CPU lanes;
        `measure` sees each session's creation (core/memory_budget.LoadMeasure). `settings`: the model's, unless
        given."""
        runners: dict[str, Any] = {}
        per_lane: dict = {}
        settings = settings or model.spec.session
        extra = (settings,) if settings is not None else ()
        try:
            for lane in lanes:
                key = lane.lane_id if lane.on_gpu else lane.device
                if key not in runners:
                    before = measure.before_session(lane.device)
                    runners[key] = self._runner_factory(str(model.path), lane.device, lane, *extra)
                    measure.after_session(lane.device, before)
                per_lane[lane] = runners[key]
        except Exception:
            for r in runners.values():
                r.close()
            raise
        return per_lane

    def _open_measured(self, model: LoadedModel, lanes: list) -> _Placed:
        """The model's runners on `lanes`, warmed up (before the executor exists: nothing can reach the model
        yet), with the footprint they took per device."""
        measure = LoadMeasure(self._memory)
        placed = _Placed(lanes, self._open_runners(model, lanes, measure), {}, None)
        if self._tiny_run_ns and self._inline_max_ns and not any(lane.on_gpu for lane in lanes):
            placed, measure = self._if_tiny(model, placed, measure)
        if model.spec.warmup:
            measure.before_warmup()
            try:
                placed.warmup = run_warmup(model.name, model.version, model.spec.warmup, placed.runners,
                                           list(model.spec.output_order), model.spec.ragged)
            except Exception:
                placed.close()
                raise
            measure.after_warmup()
        placed.footprint = measure.finish()
        return placed

    def _if_tiny(self, model: LoadedModel, placed: _Placed, measure: LoadMeasure) -> tuple[_Placed, LoadMeasure]:
        """A tiny model (core/tiny_models.py) reopened with one intra-op thread, unless its config sets the count
        (a second thread's wake-up is most of such a run), and marked so that its executor runs its batches on the
        loop; anything else as it was."""
        if not is_tiny(next(iter(placed.runners.values())), model.spec, self._tiny_run_ns):  # never raises
            return placed, measure
        log.info("model %s v%s is tiny (its largest batch runs in microseconds): every batch runs on the event loop",
                 model.name, model.version)
        settings = model.spec.session
        if settings is not None and settings.intra_op_threads is not None:
            placed.tiny = True
            return placed, measure
        placed.close()
        measure = LoadMeasure(self._memory)  # the footprint of the sessions it keeps
        one_thread = replace(settings or SessionSettings(), intra_op_threads=1)
        return _Placed(placed.lanes, self._open_runners(model, placed.lanes, measure, one_thread), {}, None,
                       tiny=True), measure

    def _place(self, model: LoadedModel, lanes: list, knobs: Mapping[str, Any], counts: list[int]) -> _Placed:
        """Open the model on the lanes chosen; on the CPU lanes instead when its GPU cannot hold it and the
        spill rule allows (core/spill.py). `counts`: its instance groups' counts as configured."""
        settings = model.spec.session
        accelerators = bool(settings is not None and settings.gpu_accelerators)
        spillable = may_spill(model.config, lanes, self.lanes, knobs, accelerators)
        try:
            placed = self._open_measured(model, lanes)
        except DeviceOutOfMemory as exc:
            if not spillable:
                raise
            return self._spill(model, counts, Spill(exc.device, exc.detail or "out of device memory"))
        spill = over_device_budget(self._memory, placed.footprint) if spillable else None
        if spill is None:
            return placed
        placed.close()  # the GPU sessions go before the CPU ones are made
        return self._spill(model, counts, spill)

    def _spill(self, model: LoadedModel, counts: list[int], spill: Spill) -> _Placed:
        """The model on the CPU lanes instead of `spill.device`; DeviceOutOfMemory when they would miss its SLO."""
        for group, count in zip(model.config.instance_group, counts):
            group.count = count  # a default count is filled in again, for the CPU lanes
        placed = self._open_measured(model, self._lanes_for(model.config, cpu_only=True))
        miss = slo_miss(placed.warmup, self._slo_s.get(model.name))
        if miss:
            placed.close()
            raise DeviceOutOfMemory(spill.device, model.name, f"{spill.reason}; not spilled to the CPU lanes: {miss}")
        log.warning("model %s v%s spills from %s to the CPU lanes %s: %s", model.name, model.version, spill.device,
                    ",".join(lane.lane_id for lane in placed.lanes), spill.reason)
        model.stats.spilled = spill.as_dict()
        if self._memory is not None:
            self._memory.record_spill(model.name)
        return placed

    def open(self, model: LoadedModel) -> Opened:
        """Runs in a worker thread: builds the runners and the model's executor, and registers it."""
        knobs = dict(self._knobs.get(model.name, {}))
        counts = [int(group.count) for group in model.config.instance_group]  # before _lanes_for fills defaults in
        lanes = self._lanes_for(model.config)
        self._check_features(model, lanes)
        placed = self._place(model, lanes, knobs, counts)
        lanes, runners = placed.lanes, placed.runners
        if placed.warmup is not None:
            model.stats.record_warmup(*placed.warmup)
        self._record_footprint(model, placed.footprint)
        batch_cfg, policy, levels, default_level, level_policies = batching_from_config(model.config, knobs)
        batcher = Batcher(model.name, batch_cfg, policy, wake=self.scheduler.notify, priority_levels=levels,
                          default_priority=default_level, level_policies=level_policies, loop=self.loop)
        needs, priority = self._rate_needs(model, lanes)
        executor = ModelExecutor(batcher, runners, self._job_factory,
                                 BatchCompletion(model.name, model.stats, self._energy_observer,
                                                 AnswerOrder() if batch_cfg.preserve_ordering else None),
                                 self.scheduler, model.spec, version=model.version,
                                 weight=float(knobs.get("weight", 1.0)) / priority, inline_max_ns=self._inline_max_ns,
                                 launch=self._launch, tiny=placed.tiny)
        executor.rate_needs = needs  # the rate limiter's, read when the scheduler registers it
        providers = sorted({getattr(r, "provider", "?") for r in executor.runners})
        self.loop.call_soon_threadsafe(self.scheduler.register, executor)
        log.info("model %s v%s on lanes %s (%s), batching %s", model.name, model.version,
                 ",".join(l.lane_id for l in lanes), ",".join(providers), batch_cfg)
        for runner in executor.runners:
            if getattr(runner, "effective", None):
                log.info("model %s v%s session: %s", model.name, model.version,
                         ", ".join(f"{k}={v}" for k, v in runner.effective.items()))
        return Opened(executor, providers)

    def _rate_needs(self, model: LoadedModel, lanes: list) -> tuple[dict, int]:
        """With the rate limiter on (core/rate_limiter.py): what the model's batches hold by lane kind, checked
        against --rate-limit-resource, and its priority (its fair share divided by it); off, nothing and 1."""
        limiter = getattr(self.scheduler, "limiter", None)
        needs = model_needs(model.config) if limiter is not None else {}
        if not needs:
            return {}, 1
        limiter.check(needs, tuple({lane.device for lane in lanes}))
        return needs, limiter.priority(needs)

    def _check_features(self, model: LoadedModel, lanes: list) -> None:
        """Config features this server cannot give the model: a load error naming them, not a silent ignore."""
        settings = model.spec.session
        if settings is not None and settings.gpu_accelerators and not any(lane.on_gpu for lane in lanes):
            raise ConfigError(f"model '{model.name}': optimization.execution_accelerators.gpu_execution_accelerator "
                              f"'{settings.gpu_accelerators[0].name}' needs a GPU lane; the model runs on CPU lanes only")
        check_cache_available(model.config, model.name, self._response_cache)

    def _record_footprint(self, model: LoadedModel, footprint: dict[str, int]) -> None:
        if self._memory is None:
            return
        self._memory.record(model.name, model.version, footprint)
        model.stats.memory_usage = [{"type": d.split(":")[0].upper(), "id": int(d.split(":")[1]) if ":" in d else 0,
                                     "byte_size": max(0, b)} for d, b in sorted(footprint.items())]

    def close_now(self, model: LoadedModel) -> None:
        """Release a model opened by a load that failed later (worker thread): sessions now, scheduler after."""
        executor: ModelExecutor | None = model.executor
        if self._memory is not None:
            self._memory.forget(model.name, model.version)
        if executor is not None:
            executor.release()
            self.loop.call_soon_threadsafe(self.scheduler.unregister, executor)

    async def close(self, model: LoadedModel, drain_timeout_s: float) -> None:
        executor: ModelExecutor | None = model.executor
        if self._memory is not None:
            self._memory.forget(model.name, model.version)
        if executor is not None:
            await executor.close(drain_timeout_s)
