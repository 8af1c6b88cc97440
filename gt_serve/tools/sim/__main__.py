"""python -m gt_serve.tools.sim [--scenario FILE] [--seed N] [--policy P ...]: one JSON line per policy."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from gt_serve.tools.sim.engine import run_scenario
from gt_serve.tools.sim.scenarios import load_scenario


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gt_serve.tools.sim", description=__doc__)
    parser.add_argument("--scenario", help="scenario YAML (default: the bundled heterogeneous fleet)")
    parser.add_argument("--seed", type=int, help="override the scenario's seed")
    parser.add_argument("--policy", action="append", help="run only these policies (repeatable)")
    parser.add_argument("--eps", type=float, help="override the balanced policy's eps")
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
