"""Prometheus metrics (and the live status page) on --metrics-port.

Nothing is counted per request for metrics but Triton's latency summaries, when asked for (--metrics-config
summary_latencies=true, core/latency_summary.py): a collector reads the per-batch statistics, lanes, energy accounting
and peer view at scrape time. Triton's metric names where they exist
(nv_inference_*, nv_gpu_*, nv_energy_consumption), gt_* for ours.

Auth (server.metrics_auth, see config.metrics_bearer_token): when the port has a token, every route
(/metrics, /status.json, the status page) needs `Authorization: Bearer TOKEN` (Prometheus:
`authorization: {credentials_file: ...}`) or HTTP Basic with TOKEN as the password (any user name),
so a browser can open the status page: its HTML routes challenge with Basic, the others with Bearer.
Probes use the HTTP port's /v2/health/*, which stays open.
"""
from __future__ import annotations

import base64
import binascii
import hmac
import time
from typing import Any

import orjson
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from ..tls import TlsFiles, server_context
from .http_messages import Request, Response, json_error
from .http_server import HttpServer
from .status_page import STATUS_HTML


def _tag_labels(model: Any) -> dict[str, str]:
    """The model config's metric_tags as labels `_KEY`, as Triton adds them."""
    return {f"_{k}": v for k, v in sorted(model.config.metric_tags.items())}


def _tagged(fam, model: Any) -> None:
    """The sample just added for `model` with its metric_tags' labels."""
    if model.config.metric_tags:
        last = fam.samples[-1]
        fam.samples[-1] = last._replace(labels={**last.labels, **_tag_labels(model)})


# (metric name part = latency summary family, what it measures, the statistics' duration key)
_LATENCIES = (("request", "request duration", "success"), ("queue", "time requests wait in the queue", "queue"),
              ("compute_input", "input preparation time", "compute_input"),
              ("compute_infer", "model execution time", "compute_infer"),
              ("compute_output", "output handling time", "compute_output"))


def _summaries(models: list):
    """Triton's latency summaries (--metrics-config summary_latencies=true, core/latency_summary.py): for each model
    version keeping them, the quantiles of the last minute, and the count and sum of every observation."""
    kept = [m for m in models if m.stats.summaries is not None]
    if not kept:
        return
    for name, doc, _ in _LATENCIES:
        fam = Metric(f"nv_inference_{name}_summary_us", f"Summary of {doc} in microseconds", "summary")
        for m in kept:
            summaries, labels = m.stats.summaries, {"model": m.name, "version": m.version, **_tag_labels(m)}
            fam.add_sample(fam.name + "_count", labels, summaries.count[name])
            fam.add_sample(fam.name + "_sum", labels, summaries.sum_us[name])
            for q, value in zip(summaries.quantiles, summaries.quantile_values(name)):
                fam.add_sample(fam.name, {**labels, "quantile": floatToGoString(q)}, value)
        yield fam


class ServerCollector:
    """Reads the app's live objects; registered on a per-app CollectorRegistry."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def collect(self):
        app = self.app
        models = app.registry.loaded() if app.registry is not None else []
        labels = ["model", "version"]

        def counter(name, doc, pick):
            fam = CounterMetricFamily(name, doc, labels=labels)
            for m in models:
                fam.add_metric([m.name, m.version], pick(m.stats))
                _tagged(fam, m)
            return fam

        d = lambda key, field: (lambda s: getattr(s.durations[key], field))  # noqa: E731
        yield counter("nv_inference_request_success", "Number of successful inference requests", d("success", "count"))
        failure = CounterMetricFamily("nv_inference_request_failure", "Number of failed inference requests, by "
                                      "Triton's reason (REJECTED, BACKEND, OTHER)", labels=[*labels, "reason"])
        for m in models:
            for reason, count in m.stats.failures.items():
                failure.add_metric([m.name, m.version, reason], count)
                _tagged(failure, m)
        yield failure
        yield counter("nv_inference_count", "Number of inferences performed (batch sizes summed)", lambda s: s.inference_count)
        yield counter("nv_inference_exec_count", "Number of model executions (batches)", lambda s: s.execution_count)
        if app.cfg.server.metrics_counter_latencies:  # Triton's --metrics-config counter_latencies (default true)
            for name, doc, key in _LATENCIES:
                yield counter(f"nv_inference_{name}_duration_us", f"Cumulative {doc} (microseconds)",
                              lambda s, key=key: s.durations[key].ns / 1e3)
        yield from _summaries(models)

        batches = CounterMetricFamily("gt_batch_executions", "Model executions by batch size",
                                      labels=["model", "version", "batch_size"])
        ways = CounterMetricFamily("gt_batch_runs", "A model's batches by where they ran: at_once (a lone request run "
                                   "as it was read), loop (the event loop's thread), lane (the lane's thread), "
                                   "launched (onnxruntime's pool)", labels=["model", "version", "way"])
        queue = GaugeMetricFamily("gt_queue_depth", "Requests waiting in the model's queue", labels=labels)
        for m in models:
            for size, b in sorted(m.stats.batches.items()):
                batches.add_metric([m.name, m.version, str(size)], b.compute_infer.count)
            ex = m.executor
            for way, count in getattr(ex, "ran", {}).items():
                ways.add_metric([m.name, m.version, way], count)
            queue.add_metric([m.name, m.version], getattr(ex, "pending", 0))
            _tagged(queue, m)
        yield batches
        yield ways
        yield queue
        pending = GaugeMetricFamily("nv_inference_pending_request_count",
                                    "Requests queued for the model and not yet running (Triton's name)", labels=labels)
        for sample in queue.samples:
            pending.samples.append(sample._replace(name=pending.name))
        yield pending

        busy = CounterMetricFamily("gt_lane_busy_seconds", "Time each lane spent running batches", labels=["lane", "device"])
        runs = CounterMetricFamily("gt_lane_batches", "Batches run by each lane", labels=["lane", "device"])
        launched = CounterMetricFamily("gt_lane_batches_launched", "Of a lane's batches, those launched into "
                                       "onnxruntime's pool from the event loop (lanes.launch)",
                                       labels=["lane", "device"])
        inflight = GaugeMetricFamily("gt_lane_busy", "1 while the lane runs a batch", labels=["lane", "device"])
        for lane in app.lanes:
            busy.add_metric([lane.lane_id, lane.device], lane.busy_ns / 1e9)
            runs.add_metric([lane.lane_id, lane.device], lane.batches_run)
            launched.add_metric([lane.lane_id, lane.device], lane.launched)
            inflight.add_metric([lane.lane_id, lane.device], 1.0 if lane.busy else 0.0)
        yield busy
        yield runs
        yield launched
        yield inflight
        yield from self._cache(app, models)
        yield from self._extra(app)

    @staticmethod
    def _cache(app: Any, models: list):
        """Triton's response cache metrics (per model with the cache on), and the cache's fill."""
        cache = getattr(app, "response_cache", None)
        if cache is None:
            return
        cached = [m for m in models if m.config.response_cache.enable]
        for name, doc, key, field in (
                ("nv_cache_num_hits_per_model", "Number of cache hits per model", "cache_hit", "count"),
                ("nv_cache_num_misses_per_model", "Number of cache misses per model", "cache_miss", "count"),
                ("nv_cache_hit_duration_per_model", "Total cache hit duration per model (microseconds)",
                 "cache_hit", "ns"),
                ("nv_cache_miss_duration_per_model", "Total cache miss (lookup + insertion) duration per model (us)",
                 "cache_miss", "ns")):
            fam = CounterMetricFamily(name, doc, labels=["model", "version"])
            for m in cached:
                value = getattr(m.stats.durations[key], field)
                fam.add_metric([m.name, m.version], value / 1e3 if field == "ns" else value)
                _tagged(fam, m)
            yield fam
        yield GaugeMetricFamily("gt_response_cache_bytes", "Bytes held by the response cache", value=cache.used_bytes)
        yield GaugeMetricFamily("gt_response_cache_capacity_bytes", "Response cache capacity",
                                value=cache.capacity_bytes)
        yield GaugeMetricFamily("gt_response_cache_entries", "Responses held by the response cache", value=len(cache))
        yield CounterMetricFamily("gt_response_cache_evictions", "Responses evicted to make room", value=cache.evictions)

    def _extra(self, app: Any):
        """Energy, router and peers: present once those parts are wired into the app."""
        for provider in getattr(app, "metric_providers", ()):
            yield from provider()
        telemetry = getattr(getattr(app, "cluster", None), "telemetry", None)  # edge.cluster_node.ClusterNode
        stats = getattr(telemetry, "stats", None)
        if stats is not None:  # the fleet's telemetry: messages dropped (unsigned, bad MAC, replayed, ...)
            rejected = CounterMetricFamily("gt_telemetry_rejected", "Peer telemetry messages dropped, by reason",
                                           labels=["reason"])
            for reason, count in sorted(stats.rejected.items()):
                rejected.add_metric([reason], count)
            yield rejected


_METRICS_HEADERS = {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
_TYPES = {"counter": "counter", "gauge": "gauge", "histogram": "histogram", "summary": "summary"}


def placement_metric_provider(counts: dict, load_ratios: dict):
    """gt_placement_decisions_total{action,reason} and gt_placement_load_ratio{model} from the placement
    loop (issue #18): its decisions, and the demand it last measured against high_water."""
    def collect():
        fam = CounterMetricFamily("gt_placement_decisions_total",
                                  "Placement decisions by action (load, unload, none, load_failed) and reason",
                                  labels=["action", "reason"])
        for (action, reason), n in sorted(counts.items()):
            fam.add_metric([action, reason], n)
        yield fam
        ratio = GaugeMetricFamily("gt_placement_load_ratio",
                                  "Demand of a local model at the last placement check: occupancy of its slots"
                                  " (compared with placement.high_water)", labels=["model"])
        for model, value in sorted(load_ratios.items()):
            ratio.add_metric([model], value)
        yield ratio
    return collect


def memory_metric_provider(memory: Any):
    """gt_model_evictions_total{model}, gt_model_reloads_total{model}, gt_model_spills_total{model} and each
    device's model-memory use and budget, from the MemoryGovernor (core/memory_budget.py)."""
    def collect():
        for name, doc, counts in (("gt_model_evictions", "Models evicted for the model-memory budget", memory.evictions),
                                  ("gt_model_reloads", "Evicted models reloaded on demand", memory.reloads),
                                  ("gt_model_spills", "Loads moved from a GPU to the CPU lanes (the spill path)",
                                   memory.book.spills)):
            fam = CounterMetricFamily(name, doc, labels=["model"])
            for model, n in sorted(counts.items()):
                fam.add_metric([model], n)
            yield fam
        used = GaugeMetricFamily("gt_model_memory_bytes", "Measured footprint of the loaded models", labels=["device"])
        budget = GaugeMetricFamily("gt_model_memory_budget_bytes", "Model-memory budget (0 = unlimited)",
                                   labels=["device"])
        for device, row in memory.book.as_dict().items():
            used.add_metric([device], row["used_bytes"])
            budget.add_metric([device], row["budget_bytes"])
        yield used
        yield budget
    return collect


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def metric_families(registry: CollectorRegistry) -> list[list]:
    """[name, type, help, [[sample name, labels, value], ...]] per family, as exposition writes them: Triton's
    nv_* counters keep Triton's names (no `_total` suffix), so dashboards and alerts written for Triton work
    unchanged; our gt_* counters follow the Prometheus `_total` convention."""
    out: list[list] = []
    for metric in registry.collect():
        name, kind = metric.name, _TYPES.get(metric.type, "untyped")
        samples = [s for s in metric.samples if not s.name.endswith("_created")]
        if kind == "counter":
            if name.startswith("nv_"):
                samples = [s._replace(name=name) if s.name == name + "_total" else s for s in samples]
            else:
                name += "_total"
        out.append([name, kind, metric.documentation, [[s.name, dict(s.labels), s.value] for s in samples]])
    return out


def render(families: list[list]) -> bytes:
    """Prometheus text format 0.0.4, as prometheus_client.generate_latest writes it."""
    out: list[str] = []
    for name, kind, doc, samples in families:
        doc = doc.replace("\\", "\\\\").replace("\n", "\\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")
        for sample_name, labels, value in samples:
            value = floatToGoString(float("nan") if value is None else value)  # NaN comes back from JSON as null
            text = ",".join(f'{k}="{_escape_label(str(v))}"' for k, v in sorted(labels.items()))
            out.append(f"{sample_name}{{{text}}} {value}\n" if text else f"{sample_name} {value}\n")
    return "".join(out).encode("utf-8")


def exposition(registry: CollectorRegistry) -> bytes:
    return render(metric_families(registry))


def app_metric_families(app: Any) -> list[list]:
    """This process's families (another worker of the server asks for them: protocol/worker_link.py)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServerCollector(app))
    return metric_families(registry)


def label_workers(per_worker: list[list[list]]) -> list[list]:
    """The families of every worker (in worker order) as one exposition: each sample labelled with its
    worker="N", each family written once (`sum by (model)` gives the server's figure)."""
    merged: dict[str, list] = {}
    for index, families in enumerate(per_worker):
        for name, kind, doc, samples in families:
            entry = merged.setdefault(name, [name, kind, doc, []])
            entry[3].extend([s, {**labels, "worker": str(index)}, v] for s, labels, v in samples)
    return list(merged.values())


def status_snapshot(app: Any) -> dict:
    """What the status page shows: devices/lanes, models with queues and counts, energy, peers."""
    models = app.registry.loaded() if app.registry is not None else []
    out = {
        "node": app.cfg.node_name,
        "server": app.cfg.server.server_name,
        "time_s": time.time(),
        "ports": app.ports,
        # server.workers > 1: this page is worker 0's (its lanes and models); the statistics add up every worker
        "worker": {"index": app.worker.index, "count": app.worker.count} if getattr(app, "worker", None) else None,
        "lanes": [{"id": l.lane_id, "device": l.device, "busy": l.busy, "batches": l.batches_run,
                   "launched": l.launched, "busy_s": round(l.busy_ns / 1e9, 3)} for l in app.lanes],
        "models": [{"name": m.name, "version": m.version, "state": m.state,
                    "queue": getattr(m.executor, "pending", 0), "inferences": m.stats.inference_count,
                    "executions": m.stats.execution_count, "success": m.stats.durations["success"].count,
                    "fail": m.stats.durations["fail"].count,
                    "providers": getattr(m, "providers", [])} for m in models],
    }
    for extra in getattr(app, "status_providers", ()):
        out.update(extra())
    return out


_REALM = 'realm="gt_serve metrics"'
_HTML_ROUTES = frozenset({"/", "/status"})


class TokenCheck:
    """Bearer TOKEN or Basic (any user, TOKEN as password), compared in constant time."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()

    def allows(self, authorization: str) -> bool:
        scheme, _, credentials = authorization.strip().partition(" ")
        got = credentials.strip().encode("latin-1", "replace")
        if scheme.lower() == "basic":
            try:
                got = base64.b64decode(got, validate=True).partition(b":")[2]
            except (binascii.Error, ValueError):
                return False
        elif scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(got, self._token)


def _unauthorized(path: str) -> Response:
    scheme = "Basic" if path in _HTML_ROUTES else "Bearer"
    return json_error(401, "missing or invalid credentials for the metrics port",
                      {"WWW-Authenticate": f"{scheme} {_REALM}"})


class MetricsFrontEnd:
    def __init__(self, app: Any, auth_token: str | None = None, peers: Any = None) -> None:
        """`peers`: the server's other worker processes (protocol/worker_link.WorkerLink): /metrics then shows
        every worker's samples, labelled worker="N"."""
        self.app = app
        self._peers = peers
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ServerCollector(app))
        self._auth = TokenCheck(auth_token) if auth_token else None
        self.server = HttpServer(self._handle, max_body_bytes=64 * 1024, max_connections=64)

    @property
    def port(self) -> int:
        return self.server.port

    async def _handle(self, req: Request) -> Response:
        if self._auth is not None and not self._auth.allows(req.headers.get("authorization", "")):
            return _unauthorized(req.path)
        if req.method not in ("GET", "HEAD"):
            return json_error(405, f"method {req.method} is not allowed on {req.path}")
        if req.path == "/metrics":
            if self._peers is None:
                return Response(200, exposition(self.registry), _METRICS_HEADERS)
            every = await self._peers.everyone(metric_families(self.registry), "metric_families")
            return Response(200, render(label_workers(every)), _METRICS_HEADERS)
        if req.path in ("/", "/status"):
            return Response(200, STATUS_HTML, {"Content-Type": "text/html; charset=utf-8"})
        if req.path == "/status.json":
            body = orjson.dumps(status_snapshot(self.app), option=orjson.OPT_NON_STR_KEYS)  # e.g. pool size classes
            return Response(200, body, {"Content-Type": "application/json"})
        return json_error(404, f"no route for {req.path}")

    async def close(self, drain_timeout_s: float) -> None:
        await self.server.close(drain_timeout_s)


async def start_metrics(app: Any, host: str, port: int, auth_token: str | None = None,
                        tls: TlsFiles | None = None, peers: Any = None) -> MetricsFrontEnd:
    """Serve /metrics, /status.json and the status page; with `auth_token`, every route needs it; HTTPS with
    `tls` (no client certificates asked)."""
    front = MetricsFrontEnd(app, auth_token, peers)
    await front.server.start(host, port, server_context(tls, ("http/1.1",)) if tls is not None else None)
    return front
