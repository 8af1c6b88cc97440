"""Routing decision cost: Router.choose on random resource tensors. Prints one JSON line per case.

    python bench/bench_router.py [--rows 64 10000] [--policy balanced ...] [--seconds 0.5]

Targets (issue): <= 20 us per decision with 64 candidates, <= 1 ms with 10,000.
"""
from __future__ import annotations

import argparse
import json
import random
import time

import numpy as np

from gt_serve.core.resource_tensor import ResourceTensor
from gt_serve.core.router import POLICIES, RequestDemand, Router

TARGET_US = {64: 20.0, 10_000: 1000.0}


def random_tensor(rows: int, seed: int = 0) -> ResourceTensor:
    rng = np.random.default_rng(seed)
    tensor = ResourceTensor(rows)
    for i in range(rows):
        tensor.add_row(
            f"c{i}",
            healthy=bool(rng.random() > 0.05),
            parked=bool(rng.random() < 0.2),
            free_mem_bytes=float(rng.uniform(0, 16e9)),
            queue_depth=float(rng.integers(0, 64)),
            queue_limit=64.0,
            ready_at_s=float(rng.uniform(0, 0.05)),
            service_s=float(rng.uniform(0.001, 0.05)),
            marginal_j=float(rng.uniform(0.01, 5.0)),
            link_s=float(rng.choice([0.0, 0.002])),
            wake_s=0.01,
            wake_j=20.0,
            free_compute=float(rng.random()),
        )
    return tensor


def bench(rows: int, policy: str, seconds: float) -> dict[str, object]:
    tensor = random_tensor(rows)
    router = Router(policy, 0.5, random.Random(0))
    demand = RequestDemand(model="m", mem_bytes=1e9, slo_s=0.1)
    snap = tensor.snapshot()
    for _ in range(100):  # warm-up
        router.choose(snap, demand, 0.0)
    # CPU time, best of several rounds: the machine may be shared, and a decision is CPU work
    rounds, per_round = 7, max(int(seconds * 1e6 / 7 / (20 if rows <= 256 else 500)), 50)
    best_us, wall_us, n = float("inf"), float("inf"), 0
    now_s = 0.0
    for _ in range(rounds):
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(per_round):
            now_s += 1e-4
            router.choose(snap, demand, now_s)
        best_us = min(best_us, (time.process_time() - cpu0) / per_round * 1e6)
        wall_us = min(wall_us, (time.perf_counter() - wall0) / per_round * 1e6)
        n += per_round
    per_us = best_us
    target = TARGET_US.get(rows)
    return {
        "bench": "router_choose",
        "policy": policy,
        "rows": rows,
        "decisions": n,
        "us_per_decision": round(per_us, 2),  # CPU time, best round
        "wall_us_per_decision": round(wall_us, 2),
        "target_us": target,
        "meets_target": None if target is None else per_us <= target,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 10_000])
    parser.add_argument("--policy", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--seconds", type=float, default=0.5)
    args = parser.parse_args()
    for rows in args.rows:
        for policy in args.policy:
            print(json.dumps(bench(rows, policy, args.seconds)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
