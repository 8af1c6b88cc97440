"""MQTT telemetry at cluster scale: N simulated nodes publish 1 Hz telemetry through one
mosquitto; one TelemetryAgent (the real subscriber path: decode + NodeView) listens.

Reports JSON lines: the view's staleness (p50/p99 age of each node's latest message,
sampled), end-to-end latency (receive time minus the message's ts), and the subscriber's
CPU time per message. Publishers run in a child process so they do not pollute the
subscriber's CPU figure. Starts its own mosquitto on a free 127.0.0.1 port.

    python bench/mqtt_scale.py --nodes 200 --duration-s 10 --clients 8
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import aiomqtt  # noqa: E402

from gt_serve.core.node_view import Health  # noqa: E402
from gt_serve.edge import messages  # noqa: E402
from gt_serve.edge.mqtt_link import BrokerSettings  # noqa: E402
from gt_serve.edge.telemetry import TelemetryAgent  # noqa: E402
from gt_serve.testing.mosquitto import Mosquitto  # noqa: E402

MAX_DURATION_S = 120.0
MAX_NODES = 5000


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ---------------------------------------------------------------- publisher (child process)

def node_telemetry(node: str, epoch: int, seq: int) -> bytes:
    return messages.encode(messages.telemetry_from_snapshot(node, epoch, seq, time.time(), {
        "queue_depth": seq % 7, "free_memory_bytes": 2**33,
        "lanes": [{"id": "gpu0/s0", "utilization": 0.5, "queue": 1}],
        "latency_ms": {"resnet50": 4.0}, "energy_j_per_inference": {"resnet50": 0.3},
        "power_w": 150.0}))


async def publish_for(port: int, cluster: str, nodes: list[tuple[int, str]], total: int,
                      period_s: float, ready: asyncio.Barrier, start_s: list[float],
                      stop: asyncio.Event) -> int:
    """One connection publishing for ``nodes`` (global index, name), each once a period at
    its own phase (index / total of the period), after every connection has announced."""
    epoch = time.time_ns()
    sent = 0
    async with aiomqtt.Client("127.0.0.1", port, max_queued_outgoing_messages=0) as client:
        for _, node in nodes:
            status = messages.Status(node=node, epoch=epoch, state="ready", ts_s=time.time())
            await client.publish(messages.topic(cluster, node, "status"),
                                 messages.encode(status), qos=1, retain=True)
        if await ready.wait() == 0:
            start_s.append(time.monotonic() + 0.1)
        await ready.wait()
        t0_s = start_s[0]
        tick = 0
        while not stop.is_set() and tick * period_s < MAX_DURATION_S + 60:
            for index, node in nodes:
                delay_s = t0_s + (tick + index / total) * period_s - time.monotonic()
                if delay_s > 0:
                    await asyncio.sleep(delay_s)
                if stop.is_set():
                    break
                await client.publish(messages.topic(cluster, node, "telemetry"),
                                     node_telemetry(node, epoch, tick + 1), qos=0)
                sent += 1
            tick += 1
        for _, node in nodes:  # leave no retained state behind
            await client.publish(messages.topic(cluster, node, "status"), b"",
                                 qos=1, retain=True)
    return sent


async def run_publishers(args: argparse.Namespace) -> None:
    """Publish until the parent writes a line (or closes stdin), at most the hard bound."""
    names = list(enumerate(f"sim{i:05d}" for i in range(args.nodes)))
    clients = args.nodes if args.clients <= 0 else min(args.clients, args.nodes)
    groups = [names[c::clients] for c in range(clients)]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    watcher = loop.run_in_executor(None, sys.stdin.readline)
    watcher.add_done_callback(lambda _: loop.call_soon_threadsafe(stop.set))
    ready = asyncio.Barrier(clients)
    start_s: list[float] = []
    cpu0_s = time.process_time()
    sent = await asyncio.gather(*(
        publish_for(args.port, args.cluster, group, args.nodes, args.period_s, ready,
                    start_s, stop)
        for group in groups))
    print(json.dumps({"role": "publisher", "messages": sum(sent), "clients": clients,
                      "cpu_s": round(time.process_time() - cpu0_s, 3)}), flush=True)


# ---------------------------------------------------------------- subscriber (this process)

async def warm_up(agent: TelemetryAgent, nodes: int, timeout_s: float) -> None:
    """Until every node is live and heard on telemetry. Polled every 100 ms: a predicate
    over all peers re-run on every message would cost O(nodes) per message."""
    async with asyncio.timeout(timeout_s):
        while sum(p.telemetry is not None
                  for p in agent.view.live_peers(time.monotonic())) < nodes:
            await asyncio.sleep(0.1)


async def run_subscriber(args: argparse.Namespace, broker: Mosquitto) -> dict:
    agent = TelemetryAgent(BrokerSettings(port=broker.port, keepalive_s=5),
                           cluster=args.cluster, node="observer", snapshot=lambda: {},
                           period_s=args.period_s)
    latencies_ms: list[float] = []
    handle = agent.handle
    handle_s = [0.0]

    def timed_handle(topic_name: str, payload: object) -> None:
        start_s = time.perf_counter()
        handle(topic_name, payload)
        handle_s[0] += time.perf_counter() - start_s
        if topic_name.endswith("/telemetry"):
            peer = agent.view.peer(topic_name.split("/")[4], time.monotonic())
            if peer is not None and peer.telemetry is not None:
                latencies_ms.append((time.time() - peer.telemetry.ts_s) * 1e3)

    agent.handle = timed_handle  # type: ignore[method-assign]
    await agent.start()
    await agent.wait_connected(10)
    child = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--role", "publish", "--port", str(broker.port),
        "--nodes", str(args.nodes), "--clients", str(args.clients),
        "--duration-s", str(args.duration_s), "--period-s", str(args.period_s),
        "--cluster", args.cluster, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, cwd=str(REPO_ROOT))
    try:
        await warm_up(agent, args.nodes, 30 + 2 * args.period_s)
        warm_s = time.monotonic()
        received0, cpu0_s = agent.stats.received, time.process_time()
        latencies_ms.clear()
        handle_s[0] = 0.0
        ages_ms: list[float] = []
        live_min = args.nodes
        end_s = warm_s + args.duration_s
        while (now_s := time.monotonic()) < end_s:  # sample the view's staleness
            peers = agent.view.peers(now_s)
            ages_ms.extend(p.age_s * 1e3 for p in peers)
            live_min = min(live_min, sum(p.health is Health.LIVE for p in peers))
            await asyncio.sleep(args.period_s / 2)
        cpu_s = time.process_time() - cpu0_s
        received = agent.stats.received - received0
        window_s = time.monotonic() - warm_s
        out, _ = await asyncio.wait_for(child.communicate(b"stop\n"), 30)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
        await agent.stop()
    publisher = json.loads(out.decode().strip().splitlines()[-1]) if out.strip() else {}
    return {
        "bench": "mqtt_scale", "nodes": args.nodes, "publisher_clients": publisher.get("clients"),
        "period_s": args.period_s, "window_s": round(window_s, 2),
        "messages": received, "rate_msg_s": round(received / window_s, 1),
        "staleness_p50_ms": round(percentile(ages_ms, 0.5), 1),
        "staleness_p99_ms": round(percentile(ages_ms, 0.99), 1),
        "staleness_max_ms": round(max(ages_ms, default=float("nan")), 1),
        "e2e_latency_p50_ms": round(percentile(latencies_ms, 0.5), 2),
        "e2e_latency_p99_ms": round(percentile(latencies_ms, 0.99), 2),
        "subscriber_cpu_us_per_msg": round(cpu_s / max(received, 1) * 1e6, 1),
        "subscriber_cpu_fraction": round(cpu_s / window_s, 4),
        "decode_and_update_us_per_msg": round(handle_s[0] / max(received, 1) * 1e6, 1),
        "live_peers_min": live_min, "dropped": agent.stats.dropped,
        "publisher_cpu_s": publisher.get("cpu_s"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--period-s", type=float, default=1.0)
    parser.add_argument("--clients", type=int, default=8,
                        help="publisher connections (0: one per node)")
    parser.add_argument("--cluster", default="bench")
    parser.add_argument("--role", choices=("main", "publish"), default="main")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    args.duration_s = min(max(args.duration_s, 1.0), MAX_DURATION_S)
    args.nodes = min(max(args.nodes, 1), MAX_NODES)
    if args.role == "publish":
        asyncio.run(run_publishers(args))
        return
    with tempfile.TemporaryDirectory(prefix="gt-mqtt-bench-") as workdir:
        with Mosquitto(Path(workdir)) as broker:
            print(json.dumps({"bench": "mqtt_scale", "event": "config", "nodes": args.nodes,
                              "duration_s": args.duration_s, "clients": args.clients,
                              "broker_port": broker.port, "cpus": os.cpu_count()}), flush=True)
            result = asyncio.run(run_subscriber(args, broker))
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
