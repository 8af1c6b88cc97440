"""python -m gt_serve.tools.sim [--scenario FILE] [--seed N] [--policy P ...]: one JSON line per policy.

python -m gt_serve.tools.sim --placement static|loop|both [--scenario placement.yaml]: a day of demand
shifting across sites, hand placement vs the placement loop (one JSON line per mode).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from gt_serve.tools.sim.engine import run_scenario
from gt_serve.tools.sim.placement import (MODES, is_placement_scenario, load_placement_scenario,
                                          run_placement, with_seed)
from gt_serve.tools.sim.scenarios import load_scenario


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gt_serve.tools.sim", description=__doc__)
    parser.add_argument("--scenario", help="scenario YAML (default: the bundled heterogeneous fleet)")
    parser.add_argument("--seed", type=int, help="override the scenario's seed")
    parser.add_argument("--policy", action="append", help="run only these policies (repeatable)")
    parser.add_argument("--eps", type=float, help="override the balanced policy's eps")
    parser.add_argument("--placement", choices=("static", "loop", "both"),
                        help="run the placement scenario (default file: the bundled placement.yaml)")
    args = parser.parse_args(argv)
    if args.placement or is_placement_scenario(args.scenario):
        return _placement(args)
    scenario = load_scenario(args.scenario)
    if args.seed is not None:
        scenario = dataclasses.replace(scenario, seed=args.seed)
    if args.eps is not None:
        scenario = dataclasses.replace(scenario, eps=args.eps)
    started_s = time.perf_counter()
    for result in run_scenario(scenario, tuple(args.policy) if args.policy else None):
        print(json.dumps({"scenario": scenario.name, **result.to_json()}), flush=True)
    print(json.dumps({"scenario": scenario.name, "wall_s": round(time.perf_counter() - started_s, 2)}), file=sys.stderr)
    return 0


def _placement(args: argparse.Namespace) -> int:
    scenario = load_placement_scenario(args.scenario)
    if args.seed is not None:
        scenario = with_seed(scenario, args.seed)
    modes = MODES if args.placement in (None, "both") else (args.placement,)
    started_s = time.perf_counter()
    results = run_placement(scenario, modes)
    for result in results:
        print(json.dumps({"scenario": scenario.name, **result.to_json()}), flush=True)
    if len(results) == 2:
        static, loop = results
        print(json.dumps({"scenario": scenario.name,
                          "j_per_inference_ratio": round(loop.joules_per_inference / static.joules_per_inference, 4),
                          "slo_miss_ratio": round(static.missed / max(loop.missed, 1.0), 2)}), flush=True)
    print(json.dumps({"scenario": scenario.name, "wall_s": round(time.perf_counter() - started_s, 2)}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
