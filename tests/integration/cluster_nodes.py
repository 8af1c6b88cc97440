"""Small edge clusters for integration tests: a real mosquitto and gt-serve child processes.

    with EdgeCluster(tmp_path, "c1") as cluster:
        a, b = cluster.start({"a": ["simple"], "b": ["classifier"]})
        cluster.wait_peers(a, live={"b"})

Each node gets its own model repository (built with gt_serve.testing.model_builders), its own node YAML
(short telemetry period, 1 s keepalive: failures are detected in about a second; a cluster key, so
telemetry is signed, unless the cluster is made with key=None) and its own work folder. Nodes start in parallel; every wait polls with a deadline and names what it waited for.
"""
from __future__ import annotations

import json
import secrets
import signal
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, TypeVar

import numpy as np

from gt_serve.testing import model_builders as mb
from gt_serve.testing.launcher import ServerProcess, launch
from gt_serve.testing.mosquitto import Mosquitto

PERIOD_S = 0.5
KEEPALIVE_S = 1
POLL_S = 0.05
T = TypeVar("T")



def classifier_expected(x: np.ndarray) -> np.ndarray:
    """What every node's `classifier` (model_builders.classifier, seed 0) answers for `x`."""
    w = np.random.default_rng(0).standard_normal((8, 5)).astype(np.float32)
    logits = x @ w
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def build_model(repo: Path, model: str) -> None:
    """Write one model of the shared test zoo into `repo`."""
    if model == "simple":
        mb.simple_add_sub(repo / "simple" / "1" / "model.onnx")
        (repo / "simple" / "config.pbtxt").write_text(mb.SIMPLE_CONFIG)
    elif model == "classifier":
        mb.classifier(repo / "classifier" / "1" / "model.onnx")
        (repo / "classifier" / "config.pbtxt").write_text(
            'name: "classifier"\nmax_batch_size: 8\ndynamic_batching { }\n')
    elif model == "scale":
        mb.scale(repo / "scale" / "1" / "model.onnx", factor=2.0, width=4)
        (repo / "scale" / "config.pbtxt").write_text('name: "scale"\nmax_batch_size: 8\n')
    else:
        raise ValueError(f"unknown test model {model!r}")


def wait_for(probe: Callable[[], T], timeout_s: float, what: str, poll_s: float = POLL_S) -> T:
    """Call `probe` until it returns something truthy; AssertionError naming `what` at the deadline."""
    deadline_s = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            value = probe()
        except OSError as exc:  # a node between states: ask again
            value, last = None, exc
        if value:
            return value
        if value is not None:
            last = value
        if time.monotonic() >= deadline_s:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})")
        threading.Event().wait(poll_s)  # polling another process, re-checked each turn


def status(node: ServerProcess) -> dict:
    with urllib.request.urlopen(f"http://{node.metrics_url}/status.json", timeout=5) as r:
        return json.loads(r.read())


def peer_states(node: ServerProcess) -> dict[str, str]:
    return {p["node"]: p["state"] for p in status(node).get("peers", [])}


_GENERATE = "generate"


class EdgeCluster:
    def __init__(self, root: Path, cluster: str, *, key: str | None = _GENERATE,
                 telemetry: dict[str, object] | None = None, cluster_opts: dict[str, object] | None = None,
                 broker: Mosquitto | None = None, node_args: list[str] | None = None,
                 per_node: dict[str, dict[str, object]] | None = None) -> None:
        self.root = Path(root)
        self.cluster = cluster
        self.key = secrets.token_hex(16) if key == _GENERATE else key
        self.telemetry_opts = dict(telemetry or {})
        self.cluster_opts = {"forward_timeout_s": 5.0, **(cluster_opts or {})}
        if self.key:
            self.cluster_opts["key"] = self.key
        self.broker = broker or Mosquitto(self.root / "broker")
        self.broker_host = self.broker.host
        self.node_args = list(node_args or [])  # extra gt-serve flags for every node (e.g. --host 0.0.0.0)
        self.per_node = dict(per_node or {})  # node -> cluster-section overrides (e.g. advertise_host)
        self.nodes: dict[str, ServerProcess] = {}

    def __enter__(self) -> "EdgeCluster":
        self.broker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with ThreadPoolExecutor(max(1, len(self.nodes))) as pool:
            list(pool.map(lambda n: n.stop(signal.SIGTERM, timeout_s=15), self.nodes.values()))
        self.broker.stop()

    def node_yaml(self, name: str, extra: str = "") -> str:
        telemetry = {"enabled": True, "broker_host": self.broker_host, "broker_port": self.broker.port,
                     "period_s": PERIOD_S, "keepalive_s": KEEPALIVE_S, **self.telemetry_opts}
        return (f"node: {{name: {name}, cluster: {self.cluster}}}\n"
                f"telemetry: {json.dumps(telemetry)}\n"
                f"cluster: {json.dumps({**self.cluster_opts, **self.per_node.get(name, {})})}\n"
                "lanes: {cpu_lanes: 1, intra_op_threads: 1}\n" + extra)

    def start(self, layout: dict[str, Iterable[str]], extra: dict[str, str] | None = None,
              repos: dict[str, Path] | None = None) -> list[ServerProcess]:
        """Start one node per entry of `layout` (node -> model names), in parallel."""
        extra = extra or {}

        def one(name: str) -> ServerProcess:
            work = self.root / name
            work.mkdir(parents=True, exist_ok=True)
            repo = (repos or {}).get(name)
            if repo is None:
                repo = work / "repo"
                repo.mkdir(exist_ok=True)
                for model in layout[name]:
                    build_model(repo, model)
            cfg = work / "node.yaml"
            cfg.write_text(self.node_yaml(name, extra.get(name, "")))
            return launch(["--model-repository", str(repo), "--config", str(cfg), *self.node_args], workdir=work,
                          timeout_s=60, repo=repo)

        names = list(layout)
        with ThreadPoolExecutor(len(names)) as pool:
            futures = [pool.submit(one, n) for n in names]
            started = []
            for name, future in zip(names, futures):
                try:
                    node = future.result()
                except Exception:
                    for f in futures:  # stop whatever did start before failing the test
                        if f.done() and f.exception() is None:
                            f.result().stop(signal.SIGKILL)
                    raise
                self.nodes[name] = node
                started.append(node)
        return started

    def wait_peers(self, node: ServerProcess, *, live: set[str], timeout_s: float = 10.0) -> dict[str, str]:
        """Until `node` reports every peer in `live` as live and routable; returns its peer states."""
        def probe():
            peers = status(node).get("peers", [])
            ok = {p["node"] for p in peers if p["state"] == "live" and p.get("grpc")}
            return {p["node"]: p["state"] for p in peers} if live <= ok else None
        return wait_for(probe, timeout_s, f"peers {sorted(live)} live and routable on {node.metrics_url}")

    def wait_mesh(self, timeout_s: float = 10.0) -> None:
        """Until every node sees every other node as live."""
        for name, node in self.nodes.items():
            if node.proc.poll() is None:
                others = {n for n, p in self.nodes.items() if n != name and p.proc.poll() is None}
                self.wait_peers(node, live=others, timeout_s=timeout_s)


def simple_inputs(client_mod, value: int) -> list:
    """`simple`'s two INT32 [1, 16] inputs (INPUT0 = value, INPUT1 = 1) for a tritonclient module
    (tritonclient.http or tritonclient.grpc): OUTPUT0 is then value + 1 everywhere."""
    inputs = []
    for name, data in (("INPUT0", np.full((1, 16), value, np.int32)), ("INPUT1", np.ones((1, 16), np.int32))):
        inp = client_mod.InferInput(name, [1, 16], "INT32")
        inp.set_data_from_numpy(data)
        inputs.append(inp)
    return inputs
