"""execution.lane_plan.start_lanes: the node's lanes and pools from the config, on this machine's CPUs.

GPU lanes (streams, device pools, CupyBackends) are covered on GPU machines by tests/gpu and
bench/gpu_check.sh; here `lanes.gpus` names a GPU no machine has, so every machine gets a CPU-only plan."""
from __future__ import annotations

import asyncio

from gt_serve.backends.numpy_backend import NumpyBackend
from gt_serve.config import LanesConfig
from gt_serve.execution.batch_job import SimpleArrayBackend
from gt_serve.execution.lane_plan import start_lanes

WAIT_S = 10.0


def run_plan(lanes_cfg, backend):
    async def main():
        plan = start_lanes(lanes_cfg, asyncio.get_running_loop(), backend)
        try:
            replies: asyncio.Queue = asyncio.Queue()
            for lane in plan.lanes:  # every lane's thread is running
                lane.submit(lambda: "ran", lambda tag, lane_, result, exc, ns, _: replies.put_nowait((tag, result)),
                            lane.lane_id)
            done = [await asyncio.wait_for(replies.get(), WAIT_S) for _ in plan.lanes]
            assert sorted(done) == sorted((lane.lane_id, "ran") for lane in plan.lanes)
        finally:
            for lane in plan.lanes:
                lane.stop()
        return plan
    return asyncio.run(main())


def test_cpu_lanes_as_configured_and_running_with_a_host_pool():
    plan = run_plan(LanesConfig(cpu_lanes=2, intra_op_threads=1, gpus=(99,)), NumpyBackend())
    assert [(lane.lane_id, lane.device, lane.on_gpu) for lane in plan.lanes] == [("cpu.0", "cpu", False),
                                                                                  ("cpu.1", "cpu", False)]
    assert plan.intra_op_threads == 1
    assert plan.lane_backends == {} and plan.device_pools == {}
    assert plan.host_pool is not None and plan.host_pool.statistics()["allocations"] == 0


def test_a_backend_without_host_allocation_gets_no_host_pool():
    plan = run_plan(LanesConfig(cpu_lanes=1, intra_op_threads=1, gpus=(99,)), SimpleArrayBackend())
    assert len(plan.lanes) == 1 and plan.host_pool is None
