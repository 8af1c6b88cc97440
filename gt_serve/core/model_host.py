"""Hosts loaded models on the shared lanes: builds each model's runners and batcher, registers the
batcher with the stream scheduler, resolves request futures when a batch completes, and drains on unload.

Runners and batch jobs come from injected factories, so this module never touches onnxruntime.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Mapping

from tritonclient.grpc import model_config_pb2 as mc

from ..errors import Internal, Unavailable
from .batch_policy import BatchConfig
from .batcher import Batch, Batcher, QueuePolicy
from .registry import LoadedModel
from .stream_scheduler import StreamScheduler

log = logging.getLogger(__name__)
_now_ns = time.monotonic_ns

# runner_factory(model_path, device, lane) -> runner with .run(feeds, output_names) and .close()
RunnerFactory = Callable[[str, str, Any], Any]
# job_factory(runner, batch, spec, lane) -> zero-argument callable run in the lane thread
JobFactory = Callable[[Any, Batch, Any, Any], Callable[[], Any]]


def batching_from_config(cfg: mc.ModelConfig, knobs: Mapping[str, Any]) -> tuple[BatchConfig, QueuePolicy, int, int]:
    """Triton's dynamic_batching block (+ our YAML knobs) -> batch config, queue policy, priority levels."""
    db = cfg.dynamic_batching
    has_db = cfg.HasField("dynamic_batching")
    mbs = int(cfg.max_batch_size)
    delay_s = db.max_queue_delay_microseconds / 1e6 if has_db else 0.0
    preferred = tuple(int(p) for p in db.preferred_batch_size) if has_db else ()
    if "max_queue_delay_us" in knobs:
        delay_s = float(knobs["max_queue_delay_us"]) / 1e6
    # like Triton, requests are merged only with a dynamic_batching block (or the YAML knob saying so)
    mbs_eff = mbs if knobs.get("dynamic_batching", has_db) else 0
    qp = db.default_queue_policy
    policy = QueuePolicy(
        max_queue_size=int(knobs.get("max_queue_size", qp.max_queue_size)),
        default_timeout_s=qp.default_timeout_microseconds / 1e6,
        allow_timeout_override=bool(qp.allow_timeout_override) or not qp.default_timeout_microseconds,
        reject_on_timeout=qp.timeout_action != mc.ModelQueuePolicy.DELAY,
    )
    return (BatchConfig(mbs_eff, preferred, delay_s), policy, int(db.priority_levels), int(db.default_priority_level))


class LocalModelHost:
    def __init__(self, loop: asyncio.AbstractEventLoop, scheduler: StreamScheduler, lanes: list,
                 runner_factory: RunnerFactory, job_factory: JobFactory,
                 model_knobs: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.loop = loop
        self.scheduler = scheduler
        self.lanes = lanes
        self._runner_factory = runner_factory
        self._job_factory = job_factory
        self._knobs = model_knobs or {}
        self._runners: dict[int, list] = {}
        self._drained: dict[int, asyncio.Event] = {}
        # batch_observer(model, device, batch_size, latency_s) -> energy per request (J); e.g. NodeEnergy.on_batch
        self.batch_observer: Callable[[str, str, int, float], float] | None = None
        scheduler.on_batch_done = self._on_batch_done

    def _lanes_for(self, cfg: mc.ModelConfig) -> list:
        """instance_group -> the shared lanes this model may use: per group, `count` lanes of its kind
        (KIND_GPU on the listed GPUs; KIND_AUTO: the GPU when there is one, else the CPU)."""
        cpu_lanes = [lane for lane in self.lanes if not lane.on_gpu]
        chosen: list = []
        for group in cfg.instance_group:
            gpus = {int(d) for d in group.gpus}
            gpu_lanes = [lane for lane in self.lanes
                         if lane.on_gpu and (not gpus or int(lane.device.split(":")[1]) in gpus)]
            if group.kind == mc.ModelInstanceGroup.KIND_CPU:
                pool = cpu_lanes
            else:  # KIND_GPU or KIND_AUTO (a GPU group on a machine without one runs on the CPU)
                pool = gpu_lanes or cpu_lanes
            if group.count <= 0:  # unspecified: every lane of that kind (shown in /config as the count)
                group.count = len(pool)
            for lane in pool[:group.count]:
                if lane not in chosen:
                    chosen.append(lane)
        return chosen or cpu_lanes or list(self.lanes)

    def open(self, model: LoadedModel) -> None:
        """Runs in a worker thread: builds one runner per device (CPU lanes share one session)."""
        knobs = dict(self._knobs.get(model.name, {}))
        lanes = self._lanes_for(model.config)
        runners: dict[str, Any] = {}
        per_lane: dict[str, Any] = {}
        try:
            for lane in lanes:
                key = lane.lane_id if lane.on_gpu else lane.device
                if key not in runners:
                    runners[key] = self._runner_factory(str(model.path), lane.device, lane)
                per_lane[lane.lane_id] = runners[key]
        except Exception:
            for r in runners.values():
                r.close()
            raise
        batch_cfg, policy, levels, default_level = batching_from_config(model.config, knobs)
        batcher = Batcher(f"{model.name}", batch_cfg, policy, priority_levels=levels, default_priority=default_level,
                          weight=float(knobs.get("weight", 1.0)), lanes=tuple(lanes), loop=self.loop)
        batcher.stats = model.stats
        batcher.model = model
        spec = model.spec
        job = self._job_factory
        by_id = {lane.lane_id: lane for lane in lanes}
        batcher.runner_for_lane = {lane_id: (lambda batch, r=r, lane=by_id[lane_id]: job(r, batch, spec, lane))
                                   for lane_id, r in per_lane.items()}
        model.executor = batcher
        model.providers = sorted({getattr(r, "provider", "?") for r in runners.values()})
        self._runners[id(model)] = list(runners.values())
        self.loop.call_soon_threadsafe(self.scheduler.register, batcher)
        log.info("model %s v%s on lanes %s (%s), batching %s", model.name, model.version,
                 ",".join(l.lane_id for l in lanes), ",".join(model.providers), batch_cfg)

    def close_now(self, model: LoadedModel) -> None:
        for r in self._runners.pop(id(model), []):
            r.close()

    async def close(self, model: LoadedModel, drain_timeout_s: float) -> None:
        batcher: Batcher | None = model.executor
        if batcher is None:
            return
        batcher.closed = f"model '{model.name}' version {model.version} is unloading"
        batcher.purge_done()  # requests that already timed out or went away need no draining
        if batcher.pending or batcher.in_flight:
            event = self._drained[id(batcher)] = asyncio.Event()
            try:
                await asyncio.wait_for(event.wait(), drain_timeout_s)
            except asyncio.TimeoutError:
                pass
            finally:
                self._drained.pop(id(batcher), None)
        failed = batcher.fail_all(Unavailable(f"model '{model.name}' was unloaded before the request ran"))
        if failed:
            log.warning("model %s: %d queued requests failed at unload", model.name, failed)
        self.scheduler.unregister(batcher)
        if batcher.in_flight == 0:
            self.close_now(model)
        else:  # a batch still running past the deadline: release its sessions when it returns
            batcher.close_when_idle = lambda: self.close_now(model)

    def _on_batch_done(self, batch: Batch, lane, result, exc) -> None:
        batcher = batch.batcher
        stats = batcher.stats
        now = _now_ns()
        entries = batch.entries
        if exc is not None:
            error = _run_failed(batcher.name, lane, exc)
            for e in entries:
                if not e.future.done():
                    e.future.set_exception(error)
        else:
            per_request, (input_ns, infer_ns, output_ns) = result
            # requests re-run alone after a failed batch run (BatchJob._one_by_one) may hold an exception
            failed = [isinstance(o, BaseException) for o in per_request]
            ok_size = batch.size - sum(e.batch_size for e, f in zip(entries, failed) if f)
            if ok_size:
                stats.record_batch(ok_size, input_ns, infer_ns, output_ns, len(entries) - sum(failed))
            if self.batch_observer is not None:
                per_sample_j = self.batch_observer(batcher.name, lane.device, batch.size, infer_ns / 1e9)
                stats.energy_j += per_sample_j * batch.size
            for e, outputs in zip(entries, per_request):
                if e.future.done():
                    continue
                if isinstance(outputs, BaseException):
                    e.future.set_exception(_run_failed(batcher.name, lane, outputs))
                else:
                    e.future.set_result(outputs)
                    stats.record_success(now - e.arrival_ns, e.dispatch_ns - e.arrival_ns)
        if batcher.closed is not None and not batcher.pending and not batcher.in_flight:
            event = self._drained.get(id(batcher))
            if event is not None:
                event.set()
            if batcher.close_when_idle is not None:
                batcher.close_when_idle()
                batcher.close_when_idle = None


def _run_failed(model: str, lane, exc: BaseException) -> Internal:
    return Internal(f"model '{model}': inference failed on lane {lane.lane_id}: {type(exc).__name__}: {exc}")
