"""Batches between nodes (issue #18 item 3): the forwarding side's requests/s and CPU per forwarded request,
one-by-one forwarding (today) vs the forward batcher (core/forward_batcher.py), in the same run.

The peer is a real gt-serve process on loopback holding a small batchable model; the forwarding node is
this process: its real PeerClient (the V2 stub over grpc.aio) alone, then behind a ForwardBatcher, driven by
`--concurrency` closed-loop callers for `--seconds` each. CPU is this process's (the forwarding node's)
user+system time over the run, per forwarded request; the peer's CPU is read from /proc for it.
Not measured here: a full two-node cluster with telemetry (the router's choice is not part of this cost).
Each line of output is one JSON object.

    python bench/forward_batching.py [--seconds 3] [--concurrency 32] [--window-us 500] [--max-batch 32]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import emit

from gt_serve.core.forward_batcher import ForwardBatcher
from gt_serve.edge.peer_client import PeerClient
from gt_serve.testing import model_builders as mb
from gt_serve.testing.launcher import launch
from gt_serve.types import InferRequest, Tensor


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _run(forward, endpoint: str, seconds: float, concurrency: int, width: int) -> int:
    x = np.ones((1, width), np.float32)
    deadline = time.monotonic() + seconds
    done = 0

    async def caller(k: int) -> None:
        nonlocal done
        i = 0
        while time.monotonic() < deadline:
            request = InferRequest("mlp", id=f"{k}-{i}", inputs=[Tensor("INPUT", "FP32", x.shape, x)])
            await forward("peer", endpoint, request, time.monotonic() + 10.0)
            done += 1
            i += 1

    await asyncio.gather(*(caller(k) for k in range(concurrency)))
    return done


async def _measure(label: str, forward, endpoint: str, args, peer_pid: int) -> dict:
    await _run(forward, endpoint, 0.5, args.concurrency, args.width)  # warm-up: channels, arenas
    cpu0, peer0, t0 = time.process_time(), _proc_cpu_s(peer_pid), time.perf_counter()
    n = await _run(forward, endpoint, args.seconds, args.concurrency, args.width)
    wall_s, cpu_s, peer_s = time.perf_counter() - t0, time.process_time() - cpu0, _proc_cpu_s(peer_pid) - peer0
    return {"mode": label, "requests": n, "req_per_s": round(n / wall_s, 1),
            "forwarder_cpu_us_per_req": round(cpu_s / n * 1e6, 1), "peer_cpu_us_per_req": round(peer_s / n * 1e6, 1)}


async def main_async(args) -> None:
    with tempfile.TemporaryDirectory(prefix="gt_fwd_bench_") as tmp:
        repo = Path(tmp) / "repo"
        mb.mlp(repo / "mlp" / "1" / "model.onnx", sizes=(args.width, 64, 10))
        (repo / "mlp" / "config.pbtxt").write_text(
            f'name: "mlp"\nmax_batch_size: {args.max_batch}\ndynamic_batching {{ }}\n')
        srv = launch(["--model-repository", str(repo)], workdir=Path(tmp), repo=repo)
        try:
            client = PeerClient(timeout_s=30)
            off = await _measure("one_by_one", client.forward, srv.grpc_url, args, srv.pid)
            emit(off)
            batcher = ForwardBatcher(client.forward, window_s=args.window_us / 1e6, max_batch=args.max_batch,
                                     max_batch_for=lambda m: args.max_batch)
            on = await _measure("batched", batcher.forward, srv.grpc_url, args, srv.pid)
            on["rpcs"], on["mean_batch"] = batcher.rpcs, round(batcher.merged / max(batcher.rpcs, 1), 2)
            emit(on)
            emit({"ratio_req_per_s": round(on["req_per_s"] / off["req_per_s"], 2),
                  "ratio_forwarder_cpu_per_req": round(on["forwarder_cpu_us_per_req"] / off["forwarder_cpu_us_per_req"], 2),
                  "window_us": args.window_us, "concurrency": args.concurrency})
        finally:
            srv.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--window-us", type=int, default=500)
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--width", type=int, default=16)
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
