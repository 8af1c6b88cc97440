"""Composition root: builds every object from the config, wires them, owns start -> drain -> stop."""
from __future__ import annotations

import asyncio
import logging
import shutil
import signal
import tempfile
import time
from pathlib import Path

from .backends.device_memory import device_used_bytes
from .config import Config, metrics_bearer_token, write_port_file
from .core.dataplane import DataPlane
from .core.fleet_link import FleetLink
from .core.forward_batcher import forwarding_peers
from .core.latency_summary import summary_settings
from .core.memory_budget import MemoryBook, MemoryGovernor
from .core.model_control import ModelControl, Readiness
from .core.model_host import LocalModelHost
from .core.registry import ModelRegistry
from .core.response_cache import ResponseCache
from .core.repository_poller import RepositoryPoller
from .core.rate_limiter import RateLimiter
from .core.stream_scheduler import StreamScheduler
from .edge.remote_repository import RepositoryMirrors
from .errors import GtServeError
from .protocol.metrics import memory_metric_provider
from .protocol.worker_link import WorkerLink, WorkerSpec
from .tls import listener_files, metrics_files
from .execution.job_factory import JobFactory
from .execution.lane_plan import start_lanes
from .execution.lanes import Lane
from .execution.process_tuning import array_backend, loop_factory, raise_open_file_limit, tune_gc, tune_malloc

log = logging.getLogger("gt_serve")


class App:
    def __init__(self, cfg: Config, worker: WorkerSpec | None = None) -> None:
        """`worker`: which of the server's worker processes this is (server.workers > 1, gt_serve/supervisor.py);
        None: the server is this one process."""
        self.cfg = cfg
        self.worker = worker
        self.link: WorkerLink | None = None  # to the other workers
        self.lanes: list[Lane] = []
        self.dataplane: DataPlane | None = None
        self.response_cache: ResponseCache | None = None  # server.response_cache_bytes > 0
        self.readiness: Readiness | None = None  # App drives it: ready after the start-up loads, draining on stop
        self.fleet_link: FleetLink | None = None  # with telemetry on: connected once the cluster starts
        self.registry: ModelRegistry | None = None
        self.memory_book: MemoryBook | None = None  # lanes.model_memory_budget*: footprints measured at load
        self.memory: MemoryGovernor | None = None  # evicts past the budget, reloads on demand
        self.poller: RepositoryPoller | None = None  # model control mode "poll"
        self._poll_task: asyncio.Task | None = None
        self.scheduler: StreamScheduler | None = None
        self.http = None
        self.grpc = None
        self.metrics = None
        self.ports: dict[str, int] = {}
        self._demo_dir: Path | None = None
        self.mirrors = RepositoryMirrors(())  # s3:// and gs:// repositories' local copies (edge/remote_repository)
        self.host_pool = None
        self.lane_backends: dict = {}  # GPU lane id -> CupyBackend on the lane's stream
        self.device_pools: dict = {}  # "gpu:N" -> cupy MemoryPool shared by that GPU's lanes
        self.energy = None
        self.metric_providers: list = []
        self.cluster = None  # edge.cluster_node.ClusterNode, with telemetry on
        self.tracer = None  # protocol/tracing.RequestTracer: the trace settings and span export both front ends share
        self.status_providers: list = []
        self.power_profile = _device_profile(cfg)  # validated before anything starts
        self._stop_event: asyncio.Event | None = None

    # -- wiring -------------------------------------------------------------------------------
    def _runner_factory(self, model_path: str, device: str, lane: Lane, settings=None):
        """`settings`: the model config's session settings (core/session_settings), when it has any."""
        from .backends.onnx_runner import OnnxRunner

        if device.startswith("gpu"):
            stream = lane.stream
            return OnnxRunner(model_path, device="gpu", device_id=int(device.split(":")[1]),
                              cuda_stream_ptr=stream.ptr if stream is not None else None, settings=settings)
        return OnnxRunner(model_path, device="cpu", intra_op_threads=self._intra_op,
                          spin_us=self.cfg.lanes.spin_us if self._intra_op > 1 else 0, settings=settings)

    def _repositories(self) -> list[Path]:
        locations = [r for r in (self.cfg.server.model_repository, *self.cfg.server.model_repositories) if r]
        self.mirrors = RepositoryMirrors(locations)  # filled before the start-up loads: the listeners open first
        for repo, location in zip(given := self.mirrors.local_paths(locations), locations):
            if not repo.is_dir():
                raise SystemExit(f"gt-serve: model repository '{location}' is not a directory")
        if given:
            return given
        from .testing.model_builders import demo_repository

        self._demo_dir = Path(tempfile.mkdtemp(prefix="gt_serve_demo_"))
        log.info("no --model-repository given: serving the bundled demo repository")
        return [demo_repository(self._demo_dir)]

    def _build_execution(self, loop: asyncio.AbstractEventLoop) -> LocalModelHost:
        """Lanes and pools (execution.lane_plan), scheduler, energy books, and the host of the models' executors."""
        backend = array_backend()
        plan = start_lanes(self.cfg.lanes, loop, backend, self.cfg.server.workers if self.worker is not None else 1)
        self.lanes, self._intra_op, self.host_pool = plan.lanes, plan.intra_op_threads, plan.host_pool
        self.lane_backends, self.device_pools = plan.lane_backends, plan.device_pools
        s = self.cfg.server  # Triton's --rate-limit: off by default, and then no limiter at all (core/rate_limiter.py)
        limiter = RateLimiter(s.rate_limit_resources) if s.rate_limit == "execution_count" else None
        self.scheduler = StreamScheduler(loop, self.lanes, limiter=limiter)
        self._build_energy()
        jobs = JobFactory(backend, self.host_pool, self.lane_backends, self.cfg.lanes.io_binding)
        cache_bytes = self.cfg.server.response_cache_bytes
        self.response_cache = ResponseCache(cache_bytes) if cache_bytes > 0 else None
        book = MemoryBook(self.cfg.lanes.model_memory_budget_bytes, self.cfg.lanes.model_memory_budgets, device_bytes=device_used_bytes)
        self.memory_book = book if book.enabled else None
        return LocalModelHost(loop, self.scheduler, self.lanes, self._runner_factory, jobs, self.cfg.models,
                              energy_observer=self.energy.on_batch, response_cache=self.response_cache is not None,
                              memory=self.memory_book, slo_s={m: ms / 1e3 for m, ms in self.cfg.router.slo_ms.items()},
                              inline_max_ns=self.cfg.lanes.inline_max_us * 1000,
                              tiny_run_ns=self.cfg.lanes.tiny_run_us * 1000,
                              launch=self.cfg.lanes.launch)

    async def start(self) -> None:
        from .backends.onnx_runner import describe_model

        s = self.cfg.server
        host = self._build_execution(asyncio.get_running_loop())
        self.registry = ModelRegistry(self._repositories(), describe_model, host, drain_timeout_s=s.drain_timeout_s,
                                      response_cache=self.response_cache is not None, summaries=summary_settings(s),
                                      config_name=s.model_config_name)
        if self.worker is not None:
            self.link = WorkerLink(self.worker)
        self.dataplane = self._build_dataplane()
        await self._start_link()
        # listeners first: /v2/health/live answers while models load, /v2/health/ready says 400 until they are
        await self._start_front_ends()
        write_port_file(self.cfg.server.port_file, self.ports)
        log.info("gt-serve live: HTTP %s, gRPC %s, metrics %s; loading models", self.ports.get("http"),
                 self.ports.get("grpc"), self.ports.get("metrics"))
        try:
            failed = await self._unless_stopped(self._load_initial_models())
        except GtServeError as exc:  # an s3:// or gs:// repository that cannot be read
            raise SystemExit(f"gt-serve: {exc}") from None
        if failed is None:
            log.info("stop requested while loading models: not becoming ready")
            return
        if failed and s.exit_on_error:
            raise SystemExit(f"gt-serve: exiting: model(s) {', '.join(failed)} failed to load at start-up "
                             "(--exit-on-error=false keeps serving the others)")
        await self._start_cluster()
        if self.poller is not None:
            self._poll_task = asyncio.ensure_future(self.poller.run())
            log.info("polling the model repository every %g s", self.poller.interval_s)
        if self.link is not None and not await self._unless_stopped(self.link.all_ready()):
            return  # stopped first (a worker that dies makes the supervisor stop the others)
        ready = not (failed and s.strict_readiness)
        self.readiness.set_ready(True, waiting_for=tuple(failed) if s.strict_readiness else ())
        if ready:
            log.info("gt-serve ready: lanes %s", ", ".join(l.lane_id for l in self.lanes))
        else:
            log.error("gt-serve stays NOT READY: model(s) %s failed to load at start-up (strict readiness; "
                      "--strict-readiness=false reports ready with the models that loaded)", ", ".join(failed))

    def _build_dataplane(self) -> DataPlane:
        """The data plane and its collaborators, complete: the fleet link stays empty until _start_cluster."""
        cfg, s = self.cfg, self.cfg.server
        self.readiness = Readiness(self.registry)
        if self.memory_book is not None:
            self.memory = MemoryGovernor(self.memory_book, self.registry, reload_wait_s=s.reload_wait_s,
                                         replica_elsewhere=lambda m: bool(self.fleet_link and self.fleet_link.targets_for(m)))
            self.metric_providers.append(memory_metric_provider(self.memory))
        refresh = self.mirrors.refresh if self.mirrors else None  # object-store repositories: synced before a load
        control = ModelControl(self.registry, s.model_control_mode, energy_totals=self.energy.totals,
                               memory=self.memory, op_libraries=s.op_libraries, refresh=refresh)
        self.fleet_link = FleetLink(cfg.cluster.max_hops) if cfg.telemetry.enabled else None
        try:
            return DataPlane(self.registry, control, self.readiness, fleet=self.fleet_link,
                             pipelines=cfg.pipelines, node=cfg.node_name, server_name=s.server_name,
                             default_timeout_s=s.request_timeout_s, max_batch_size=s.max_batch_size,
                             response_cache=self.response_cache, memory=self.memory, peers=self.link)
        except (GtServeError, ValueError) as exc:  # a bad pipeline
            raise SystemExit(f"gt-serve: {exc}") from None

    async def _start_link(self) -> None:
        """With server.workers > 1: what the other workers may ask of this one, then its socket."""
        if self.link is None:
            return
        from .protocol.metrics import app_metric_families

        for op, fn in {**self.dataplane.peer_calls(), "metric_families": lambda: app_metric_families(self),
                       "trace_setting": lambda model, doc: self.tracer.settings.update(model, doc),
                       "log_settings": lambda doc: self.http.apply_logging(doc) if self.http else None}.items():
            self.link.handle(op, fn)
        await self.link.start()

    def _build_energy(self) -> None:
        from .core.node_energy import build_node_energy
        from .backends.host_usage import HostUsage
        from .protocol.resource_metrics import (device_pool_metric_provider, device_pool_statistics,
                                               energy_metric_provider, energy_status_provider, host_metric_provider,
                                               pool_metric_provider)

        self.energy = build_node_energy(sorted({lane.device for lane in self.lanes}), self.power_profile)
        if self.host_pool is not None:
            self.metric_providers.append(pool_metric_provider(self.host_pool))
            self.status_providers.append(lambda: {"host_pool": self.host_pool.statistics()})
        if self.device_pools:
            self.metric_providers.append(device_pool_metric_provider(self.device_pools))
            self.status_providers.append(lambda: {"device_pools": device_pool_statistics(self.device_pools)})
        self.metric_providers.append(energy_metric_provider(self.energy))
        if self.worker is None or self.worker.index == 0:  # the machine's figures, said once by a server of workers
            self.metric_providers.append(host_metric_provider(HostUsage()))  # Triton's nv_cpu_* metrics
        self.status_providers.append(energy_status_provider(self.energy))
        log.info("energy: profile %s, meters %s", self.power_profile.name, ", ".join(sorted({m.name for m in self.energy.meters.values()})))

    async def _load_initial_models(self) -> list[str]:
        """Load the start-up models; return the names that failed (each logged once)."""
        s = self.cfg.server
        await self.mirrors.refresh()  # the object-store repositories' files, before the scan (Unavailable: start stops)
        names = self.registry.scan()
        if s.model_control_mode == "explicit":
            names = names if "*" in s.load_models else list(s.load_models)
        elif s.model_control_mode == "poll":  # what these loads see is the baseline later polls compare with
            refresh = self.mirrors.refresh if self.mirrors else None  # and before each poll
            self.poller = RepositoryPoller(self.registry, s.repository_poll_s, refresh)
            await self.poller.baseline()
        failed = []
        for name in names:
            if self.registry.is_loaded(name):  # an ensemble loaded earlier loaded its step models with it
                continue
            try:
                await self.registry.load(name)
            except Exception as exc:  # one broken model must not keep the others from serving
                log.error("%s", exc)
                failed.append(name)
        if self.memory is not None:  # the start-up loads past the budget: the longest idle evicted
            await self.memory.enforce()
        return failed

    async def _unless_stopped(self, work):
        """`work`'s result, or None when SIGTERM comes first (then `work` is cancelled): a pod told to stop while
        it loads models must not spend its grace period loading them."""
        running = asyncio.ensure_future(work)
        if self._stop_event is None:
            return await running
        stopping = asyncio.ensure_future(self._stop_event.wait())
        try:
            await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if running.done():
            return running.result()
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        return None

    async def _start_front_ends(self) -> None:
        from .protocol.tracing import build_tracer

        s = self.cfg.server
        self.tracer = build_tracer(self.cfg.tracing, self.cfg.node_name)  # OTel missing for an endpoint: ConfigError
        if s.allow_http:
            from .protocol.http import start_http

            self.http = await start_http(self.dataplane, s.host, s.http_port, max_body_bytes=s.max_body_bytes,
                                         max_connections=s.max_connections, auth_token=s.auth_token,
                                         idle_timeout_s=s.idle_timeout_s, header_timeout_s=s.header_timeout_s,
                                         body_timeout_s=s.body_timeout_s, tls=listener_files(s, "http"),
                                         tracer=self.tracer, express=s.express, reuse_port=self.link is not None)
            self.ports["http"] = self.http.port
        if s.allow_grpc:
            grpc_kwargs = {"auth_token": s.auth_token, "peer_token": self.cfg.cluster.peer_token,
                           "max_message_bytes": s.max_body_bytes, "tls": listener_files(s, "grpc"),
                           "tracer": self.tracer, "reuse_port": self.link is not None}
            if s.grpc_transport == "native":
                from .protocol.grpc_native_server import start_grpc_native as start_grpc

                grpc_kwargs.update(max_connections=s.max_connections, idle_timeout_s=s.idle_timeout_s,
                                   express=s.express)
            else:
                from .protocol.grpc import start_grpc

            self.grpc = await start_grpc(self.dataplane, s.host, s.grpc_port, **grpc_kwargs)
            self.ports["grpc"] = self.grpc.port
        if s.allow_metrics and (self.worker is None or self.worker.index == 0):  # one worker shows them all
            try:
                from .protocol.metrics import start_metrics
            except ImportError:
                start_metrics = None
            if start_metrics is not None:
                token = metrics_bearer_token(s)
                if token is None and s.auth_token:
                    log.warning("the metrics port is open (server.metrics_auth: none) although the API needs a token")
                self.metrics = await start_metrics(self, s.host, s.metrics_port, auth_token=token, peers=self.link,
                                                   tls=metrics_files(s))  # bad files: ConfigError (exit 2)
                self.ports["metrics"] = self.metrics.port

    async def _start_cluster(self) -> None:
        """With telemetry on: this node joins the fleet (edge/cluster_node.py); the DataPlane routes through it."""
        if not self.cfg.telemetry.enabled:
            return
        from .core.fleet import local_row_factory, local_snapshot
        from .edge.cluster_node import node_caps, start_cluster_node
        from .protocol.metrics import placement_metric_provider
        from .protocol.resource_metrics import fleet_metric_provider

        try:
            self.cluster = await start_cluster_node(
                self.cfg, caps=node_caps(self.cfg, self.ports, [lane.device for lane in self.lanes],
                                         [m.name for m in self.registry.loaded()], self.power_profile),
                registry=self.registry, energy=self.energy,
                snapshot=lambda: local_snapshot(self.registry.loaded(), self.lanes, self.energy),
                local_row=local_row_factory(self.registry, self.energy))
        except GtServeError as exc:
            raise SystemExit(f"gt-serve: {exc}") from None
        self.fleet_link.connect(self.cluster.fleet, forwarding_peers(self.cluster.peer_client, self.cfg.cluster))
        self.status_providers.append(self.cluster.status)
        self.metric_providers.append(fleet_metric_provider(self.cluster.fleet, self.cluster.telemetry.view,
                                                           time.monotonic))
        if self.cluster.placement is not None:
            self.metric_providers.append(placement_metric_provider(self.cluster.placement.counts,
                                                                     self.cluster.placement.load_ratios))

    # -- lifecycle ----------------------------------------------------------------------------
    async def _close_models(self, budget_s: float) -> None:
        """Unload every model, within what is left of the drain budget (at least 1 s): the whole drain stays
        inside Kubernetes' grace period however many models there are."""
        try:
            await asyncio.wait_for(self.registry.close_all(), max(budget_s, 1.0))
        except asyncio.TimeoutError:
            log.warning("drain budget spent: exiting with model queues not yet empty")

    async def stop(self) -> None:
        drain_s = self.cfg.server.drain_timeout_s
        deadline_s = time.monotonic() + drain_s
        if self.readiness is not None:
            self.readiness.set_draining()
        if self._poll_task is not None:  # no loads or unloads while draining
            self._poll_task.cancel()
            await asyncio.gather(self._poll_task, return_exceptions=True)
        if self.cluster is not None:
            await self.cluster.begin_drain()
        # both front ends stop accepting at once, then drain their in-flight requests together
        closing = [self.http.close(drain_s)] if self.http is not None else []
        if self.grpc is not None:
            closing.append(self.grpc.stop(drain_s))
        await asyncio.gather(*closing)
        if self.dataplane is not None:
            self.dataplane.close()
        if self.metrics is not None:
            await self.metrics.close(1.0)
        if self.cluster is not None:
            await self.cluster.close()
        if self.link is not None:
            await self.link.close()
        if self.tracer is not None:  # the spans still queued go to the collector (bounded by its timeout)
            await asyncio.to_thread(self.tracer.close)
        if self.registry is not None:
            await self._close_models(deadline_s - time.monotonic())
        if self.scheduler is not None:
            self.scheduler.stop()
        for lane in self.lanes:
            lane.stop()
        if self._demo_dir is not None:
            shutil.rmtree(self._demo_dir, ignore_errors=True)
        self.mirrors.close()

    def request_stop(self) -> None:
        if self._stop_event is not None:
            self._stop_event.set()

    async def serve(self) -> None:
        """Start, run until SIGTERM/SIGINT, then drain in-flight work and stop."""
        self._stop_event = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        try:
            await self.start()
            tune_gc()
            tune_malloc()
            await self._stop_event.wait()
            log.info("shutting down: draining in-flight requests")
        finally:
            await self.stop()


def _device_profile(cfg: Config):
    from .core.energy import DeviceProfile
    from .core.power_profiles import resolve_profile

    raw = resolve_profile(dict(cfg.power_profile))
    return DeviceProfile.from_dict(raw, name=str(raw.get("name", "node")))


def run(cfg: Config, worker: WorkerSpec | None = None) -> None:
    raise_open_file_limit(2 * cfg.server.max_connections + 256)  # HTTP + gRPC, + models, lanes, logs, the broker
    app = App(cfg, worker)
    runner = asyncio.Runner(loop_factory=loop_factory(cfg.server.event_loop))
    with runner:
        runner.run(app.serve())
