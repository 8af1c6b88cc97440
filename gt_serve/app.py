"""Composition root: builds every object from the config, wires them, owns start -> drain -> stop."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

from .config import Config, metrics_bearer_token
from .core.dataplane import DataPlane
from .core.model_host import LocalModelHost
from .core.registry import ModelRegistry
from .core.stream_scheduler import StreamScheduler
from .errors import GtServeError
from .execution.batch_job import SimpleArrayBackend
from .execution.job_factory import JobFactory
from .execution.lane_plan import start_lanes
from .execution.lanes import Lane

log = logging.getLogger("gt_serve")


class App:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.lanes: list[Lane] = []
        self.dataplane: DataPlane | None = None
        self.registry: ModelRegistry | None = None
        self.scheduler: StreamScheduler | None = None
        self.http = None
        self.grpc = None
        self.metrics = None
        self.ports: dict[str, int] = {}
        self._demo_dir: Path | None = None
        self.host_pool = None
        self.lane_backends: dict = {}  # GPU lane id -> CupyBackend on the lane's stream
        self.device_pools: dict = {}  # "gpu:N" -> cupy MemoryPool shared by that GPU's lanes
        self.energy = None
        self.metric_providers: list = []
        self.telemetry = None
        self.fleet = None
        self.peer_client = None
        self.status_providers: list = []
        self.power_profile = _device_profile(cfg)  # validated before anything starts
        self._stop_event: asyncio.Event | None = None

    # -- wiring -------------------------------------------------------------------------------
    def _runner_factory(self, model_path: str, device: str, lane: Lane):
        from .backends.onnx_runner import OnnxRunner

        if device.startswith("gpu"):
            stream = lane.stream
            return OnnxRunner(model_path, device="gpu", device_id=int(device.split(":")[1]),
                              cuda_stream_ptr=stream.ptr if stream is not None else None)
        return OnnxRunner(model_path, device="cpu", intra_op_threads=self._intra_op,
                          spin_us=self.cfg.lanes.spin_us if self._intra_op > 1 else 0)

    def _repository(self) -> Path:
        if self.cfg.server.model_repository:
            return Path(self.cfg.server.model_repository)
        from .model_builders import demo_repository

        self._demo_dir = Path(tempfile.mkdtemp(prefix="gt_serve_demo_"))
        log.info("no --model-repository given: serving the bundled demo repository")
        return demo_repository(self._demo_dir)

    def _build_execution(self, loop: asyncio.AbstractEventLoop) -> LocalModelHost:
        """Lanes and pools (execution.lane_plan), the scheduler, the energy books, and the host that puts
        one ModelExecutor per loaded model on those lanes."""
        backend = _array_backend()
        plan = start_lanes(self.cfg.lanes, loop, backend)
        self.lanes, self._intra_op, self.host_pool = plan.lanes, plan.intra_op_threads, plan.host_pool
        self.lane_backends, self.device_pools = plan.lane_backends, plan.device_pools
        self.scheduler = StreamScheduler(loop, self.lanes)
        self._build_energy()
        jobs = JobFactory(backend, self.host_pool, self.lane_backends, self.cfg.lanes.io_binding)
        return LocalModelHost(loop, self.scheduler, self.lanes, self._runner_factory, jobs, self.cfg.models,
                              energy_observer=self.energy.on_batch)

    async def start(self) -> None:
        from .backends.onnx_runner import describe_model

        cfg, s = self.cfg, self.cfg.server
        host = self._build_execution(asyncio.get_running_loop())
        repo = self._repository()
        if not repo.is_dir():
            raise SystemExit(f"gt-serve: model repository '{repo}' is not a directory")
        self.registry = ModelRegistry(repo, describe_model, host, drain_timeout_s=s.drain_timeout_s)
        self.dataplane = DataPlane(self.registry, server_name=s.server_name, model_control_mode=s.model_control_mode,
                                   default_timeout_s=s.request_timeout_s, max_batch_size=s.max_batch_size)
        if cfg.pipelines:
            try:
                self.dataplane.set_pipelines(dict(cfg.pipelines), node=cfg.node_name)
            except (GtServeError, ValueError) as exc:
                raise SystemExit(f"gt-serve: {exc}") from None
        self.dataplane.energy_totals = self.energy.totals
        # listeners first: /v2/health/live answers while models load, /v2/health/ready says 400 until they are
        await self._start_front_ends()
        self._write_port_file()
        log.info("gt-serve live: HTTP %s, gRPC %s, metrics %s; loading models", self.ports.get("http"),
                 self.ports.get("grpc"), self.ports.get("metrics"))
        failed = await self._load_unless_stopped()
        if failed is None:
            log.info("stop requested while loading models: not becoming ready")
            return
        if failed and s.exit_on_error:
            raise SystemExit(f"gt-serve: exiting: model(s) {', '.join(failed)} failed to load at start-up "
                             "(--exit-on-error=false keeps serving the others)")
        await self._start_cluster()
        ready = not (failed and s.strict_readiness)
        self.dataplane.set_ready(True, waiting_for=tuple(failed) if s.strict_readiness else ())
        if ready:
            log.info("gt-serve ready: lanes %s", ", ".join(l.lane_id for l in self.lanes))
        else:
            log.error("gt-serve stays NOT READY: model(s) %s failed to load at start-up (strict readiness; "
                      "--strict-readiness=false reports ready with the models that loaded)", ", ".join(failed))

    def _build_energy(self) -> None:
        from .backends.power import StaticProfileMeter, detect_meters
        from .core.energy import EnergyModel
        from .core.node_energy import NodeEnergy
        from .protocol.resource_metrics import (device_pool_metric_provider, device_pool_statistics,
                                               energy_metric_provider, energy_status_provider, pool_metric_provider)

        model = EnergyModel()
        devices = sorted({lane.device for lane in self.lanes})
        for device in devices:
            model.add_device(device, self.power_profile)
        found = detect_meters(idle_w=None)
        gpu_meters = [m for m in found if m.name.startswith("nvml")]
        node_meter = next((m for m in found if not m.name.startswith("nvml")), None)
        if node_meter is None:
            node_meter = StaticProfileMeter(self.power_profile.idle_w, name=f"static:{self.power_profile.name}")
        meters = {}
        for device in devices:
            if device.startswith("gpu:") and int(device[4:]) < len(gpu_meters):
                meters[device] = gpu_meters[int(device[4:])]
            else:
                meters[device] = node_meter
        self.energy = NodeEnergy(model, meters)
        if self.host_pool is not None:
            self.metric_providers.append(pool_metric_provider(self.host_pool))
            self.status_providers.append(lambda: {"host_pool": self.host_pool.statistics()})
        if self.device_pools:
            self.metric_providers.append(device_pool_metric_provider(self.device_pools))
            self.status_providers.append(lambda: {"device_pools": device_pool_statistics(self.device_pools)})
        self.metric_providers.append(energy_metric_provider(self.energy))
        self.status_providers.append(energy_status_provider(self.energy))
        log.info("energy: profile %s, meters %s", self.power_profile.name,
                 ", ".join(sorted({m.name for m in meters.values()})))

    async def _load_initial_models(self) -> list[str]:
        """Load the start-up models; return the names that failed (each logged once)."""
        s = self.cfg.server
        names = self.registry.scan()
        if s.model_control_mode == "explicit":
            names = names if "*" in s.load_models else list(s.load_models)
        elif s.model_control_mode == "poll":
            log.warning("model control mode 'poll': the repository is loaded at start-up but not polled (as 'none')")
        failed = []
        for name in names:
            try:
                await self.registry.load(name)
            except Exception as exc:  # one broken model must not keep the others from serving
                log.error("%s", exc)
                failed.append(name)
        return failed

    async def _load_unless_stopped(self) -> list[str] | None:
        """_load_initial_models, given up when SIGTERM comes first (None): a pod told to stop while it loads
        must not spend its grace period loading models."""
        loading = asyncio.ensure_future(self._load_initial_models())
        if self._stop_event is None:
            return await loading
        stopping = asyncio.ensure_future(self._stop_event.wait())
        try:
            await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if loading.done():
            return loading.result()
        loading.cancel()
        await asyncio.gather(loading, return_exceptions=True)
        return None

    async def _start_front_ends(self) -> None:
        s = self.cfg.server
        if s.allow_http:
            from .protocol.http import start_http

            self.http = await start_http(self.dataplane, s.host, s.http_port, max_body_bytes=s.max_body_bytes,
                                         max_connections=s.max_connections, auth_token=s.auth_token,
                                         idle_timeout_s=s.idle_timeout_s, header_timeout_s=s.header_timeout_s,
                                         body_timeout_s=s.body_timeout_s)
            self.ports["http"] = self.http.port
        if s.allow_grpc:
            grpc_kwargs = {"auth_token": s.auth_token, "peer_token": self.cfg.cluster.peer_token,
                           "max_message_bytes": s.max_body_bytes}
            if s.grpc_transport == "native":
                from .protocol.grpc_native import start_grpc_native as start_grpc

                grpc_kwargs.update(max_connections=s.max_connections, idle_timeout_s=s.idle_timeout_s)
            else:
                from .protocol.grpc import start_grpc

            self.grpc = await start_grpc(self.dataplane, s.host, s.grpc_port, **grpc_kwargs)
            self.ports["grpc"] = self.grpc.port
        if s.allow_metrics:
            try:
                from .protocol.metrics import start_metrics
            except ImportError:
                start_metrics = None
            if start_metrics is not None:
                token = metrics_bearer_token(s)
                if token is None and s.auth_token:
                    log.warning("the metrics port is open (server.metrics_auth: none) although the API needs a token")
                self.metrics = await start_metrics(self, s.host, s.metrics_port, auth_token=token)
                self.ports["metrics"] = self.metrics.port

    async def _start_cluster(self) -> None:
        """With telemetry on: publish this node over MQTT, watch the peers, route and forward to them."""
        t, c = self.cfg.telemetry, self.cfg.cluster
        if not t.enabled:
            return
        from .core.fleet import FleetRouter, local_row_factory, local_snapshot
        from .core.router import Router, RouterSet
        from .edge.fleet_setup import build_agent, build_outliers
        from .edge.peer_client import PeerClient

        caps = {"endpoints": {"grpc": f"{c.advertise_host}:{self.ports.get('grpc', 0)}",
                              "http": f"{c.advertise_host}:{self.ports.get('http', 0)}"},
                "devices": [{"id": d, "kind": "gpu" if d.startswith("gpu") else "cpu", "memory_bytes": 0}
                            for d in sorted({lane.device for lane in self.lanes})],
                "models": sorted({m.name for m in self.registry.loaded()}),
                "power_profile": {"name": self.power_profile.name, "idle_w": self.power_profile.idle_w,
                                  "busy_w": self.power_profile.busy_w}}
        snapshot = lambda: local_snapshot(self.registry.loaded(), self.lanes, self.energy)  # noqa: E731
        try:
            self.telemetry = build_agent(self.cfg, caps=caps, snapshot=snapshot)  # signed telemetry (cluster key)
        except GtServeError as exc:
            raise SystemExit(f"gt-serve: {exc}") from None
        await self.telemetry.start()
        r = self.cfg.router
        router = RouterSet(Router(r.policy, r.epsilon),
                           {model: Router(policy, r.epsilon) for model, policy in r.model_policies.items()})
        slo = {m: ms / 1e3 for m, ms in r.slo_ms.items()}
        self.fleet = FleetRouter(self.cfg.node_name, self.telemetry.view, router,
                                 local_row=local_row_factory(self.registry, self.energy),
                                 slo_s=lambda model: slo.get(model, float("inf")), outliers=build_outliers(self.cfg),
                                 budget_s=c.forward_timeout_s)
        self.peer_client = PeerClient(token=c.peer_token or self.cfg.server.auth_token, timeout_s=c.forward_timeout_s)
        self.dataplane.fleet = self.fleet
        self.dataplane.forward = lambda target, request, deadline_s=None, visited=frozenset(): self.peer_client.forward(
            target.node, target.endpoint, request, deadline_s, visited, target.verified)  # token: verified peers only
        self.dataplane.describe_peer = lambda target, model: self.peer_client.describe(target.node, target.endpoint,
                                                                                      model, target.verified)
        self.dataplane.max_hops = c.max_hops
        self.status_providers.append(self._peers_status)
        from .protocol.resource_metrics import fleet_metric_provider

        self.metric_providers.append(fleet_metric_provider(self.fleet, self.telemetry.view, time.monotonic))
        log.info("cluster '%s': node '%s' publishing to mqtt://%s:%d", c.name, self.cfg.node_name,
                 t.broker_host, t.broker_port)

    def _peers_status(self) -> dict:
        now = time.monotonic()
        return {"peers": [{"node": p.node, "state": p.health.value, "age_s": p.age_s,
                           # from the peer's caps: empty until they arrive (the peer is not routable before)
                           "grpc": (getattr(p.caps, "endpoints", None) or {}).get("grpc", ""),
                           "models": list(getattr(p.caps, "models", ()))}
                          for p in self.telemetry.view.peers(now)],
                "routes": dict(self.fleet.decisions), "rerouted": dict(self.fleet.rerouted),
                "broker_link": "down" if self.telemetry.view.link_is_down else "up",
                "telemetry_rejected": dict(self.telemetry.stats.rejected)}

    def _write_port_file(self) -> None:
        path = self.cfg.server.port_file
        if path:
            tmp = f"{path}.tmp"
            with open(tmp, "w") as fh:
                json.dump(self.ports, fh)
            os.replace(tmp, path)

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
        if self.dataplane is not None:
            self.dataplane.set_draining()
        if self.telemetry is not None:
            await self.telemetry.set_state("draining")
        # both front ends stop accepting at once, then drain their in-flight requests together
        closing = [self.http.close(drain_s)] if self.http is not None else []
        if self.grpc is not None:
            closing.append(self.grpc.stop(drain_s))
        await asyncio.gather(*closing)
        if self.metrics is not None:
            await self.metrics.close(1.0)
        if self.telemetry is not None:
            await self.telemetry.stop()  # publishes 'offline', so peers see no last will
        if self.peer_client is not None:
            await self.peer_client.close()
        if self.registry is not None:
            await self._close_models(deadline_s - time.monotonic())
        if self.scheduler is not None:
            self.scheduler.stop()
        for lane in self.lanes:
            lane.stop()
        if self._demo_dir is not None:
            shutil.rmtree(self._demo_dir, ignore_errors=True)

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
            await self._stop_event.wait()
            log.info("shutting down: draining in-flight requests")
        finally:
            await self.stop()


def _device_profile(cfg: Config):
    from .core.energy import DeviceProfile
    from .core.power_profiles import resolve_profile

    raw = resolve_profile(dict(cfg.power_profile))
    return DeviceProfile.from_dict(raw, name=str(raw.get("name", "node")))


def _loop_factory(choice: str):
    """uvloop when present (server.event_loop "asyncio", or GT_EVENT_LOOP=asyncio, forces the standard loop)."""
    if choice != "asyncio":
        try:
            import uvloop

            return uvloop.new_event_loop
        except ImportError:
            pass
    return asyncio.new_event_loop


def _array_backend():
    try:
        from .backends.numpy_backend import NumpyBackend

        return NumpyBackend()
    except ImportError:
        return SimpleArrayBackend()


def _raise_open_file_limit(wanted: int) -> None:
    """Every connection is a file descriptor: lift the soft limit towards the hard one if needed."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError):  # not on this platform, or not allowed: keep going
        pass


def run(cfg: Config) -> None:
    _raise_open_file_limit(2 * cfg.server.max_connections + 256)  # HTTP + gRPC, + models, lanes, logs, the broker
    app = App(cfg)
    runner = asyncio.Runner(loop_factory=_loop_factory(cfg.server.event_loop))
    with runner:
        runner.run(app.serve())
