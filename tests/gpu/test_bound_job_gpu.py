"""The GPU lanes' data path: pinned host staging, the device buffer pool with its cap, and
onnxruntime IO binding to pooled device buffers on the lane's stream (BoundBatchJob + CupyBackend).

Its CPU twin is tests/unit/test_bound_job.py. The session part needs an onnxruntime with the CUDA
provider; where it has none, the test checks that the fallback is reported honestly (the session
says CPU, the job factory keeps such a lane on the plain host path) and says what it could not run.
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from gt_serve.testing import model_builders as mb
from gt_serve.execution.batch_job import BatchJob
from gt_serve.execution.bound_job import BoundBatchJob
from gt_serve.execution.job_factory import JobFactory
from gt_serve.execution.memory_pool import HostBufferPool

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def mlp_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gpu_models") / "mlp" / "model.onnx"
    mb.mlp(path, sizes=(256, 1024, 1024, 10))
    return path


def lane_backend(cp, limit_bytes: int | None = None):  # noqa: ANN001, ANN201
    from gt_serve.backends.cupy_backend import CupyBackend

    pool = cp.cuda.MemoryPool()
    return CupyBackend(stream=cp.cuda.Stream(non_blocking=True), memory_pool=pool,
                       memory_limit_bytes=limit_bytes), pool


def test_device_pool_cap_is_enforced_and_reported(cp):
    backend, pool = lane_backend(cp, limit_bytes=64 << 20)
    assert backend.memory_statistics()["device_limit_bytes"] == 64 << 20
    kept = backend.empty((8 << 20,), np.float32)  # 32 MiB: fits
    with pytest.raises(cp.cuda.memory.OutOfMemoryError):
        backend.empty((16 << 20,), np.float32)  # 64 MiB more: over the cap
    assert pool.used_bytes() >= 32 << 20
    del kept
    assert pool.used_bytes() == 0 and pool.total_bytes() >= 32 << 20  # cached for reuse, not freed


def test_staging_round_trip_steady_state_allocates_nothing(cp):
    """Pinned host pack -> device -> host, as a GPU lane does per batch: after the first batches
    neither the pinned host pool nor the device pool grows."""
    backend, pool = lane_backend(cp)
    host_pool = HostBufferPool(backend.alloc_host)
    rng = np.random.default_rng(0)
    totals = []
    for step in range(30):
        arrays = [rng.standard_normal((n, 3, 64, 64)).astype(np.float32) for n in (1, 4, 2, 7)]
        with host_pool.acquire(shape=(14, 3, 64, 64), dtype=np.float32) as loan:
            packed = np.concatenate(arrays, out=loan.array((14, 3, 64, 64), np.float32))
            device = backend.from_host(packed)
            doubled = device * 2
            host = backend.alloc_host(doubled.nbytes).view(np.float32).reshape(doubled.shape)
            back = backend.to_host(doubled, out=host)
            backend.synchronize()
        np.testing.assert_array_equal(back, np.concatenate(arrays) * 2)
        del device, doubled
        totals.append((pool.total_bytes(), host_pool.statistics()["allocations"]))
    assert len(set(totals[3:])) == 1, totals  # steady state: same device bytes held, no new host buffers


def _ort_has_cuda() -> bool:
    import onnxruntime as ort

    return "CUDAExecutionProvider" in ort.get_available_providers()


def test_bound_batch_job_on_a_cuda_session(cp, mlp_path):
    from gt_serve.backends.onnx_runner import OnnxRunner

    backend, pool = lane_backend(cp, limit_bytes=1 << 30)
    runner = OnnxRunner(str(mlp_path), device="gpu", device_id=0, cuda_stream_ptr=backend.stream.ptr)
    lane = SimpleNamespace(lane_id="gpu0.0")
    batch = SimpleNamespace(entries=[SimpleNamespace(feeds={"INPUT": np.zeros((1, 256), np.float32)}, batch_size=1)])
    spec = SimpleNamespace(input_order=["INPUT"], output_order=["OUTPUT"])
    job = JobFactory(SimpleNamespace(name="numpy"), lane_backends={"gpu0.0": backend})(runner, batch, spec, lane)
    if not _ort_has_cuda():
        # the lent machine's onnxruntime may be CPU-only: the fallback must be visible and safe
        assert runner.provider == "CPUExecutionProvider" and not runner.on_gpu
        assert type(job) is BatchJob  # a CPU session never gets device pointers
        pytest.skip("onnxruntime here has no CUDAExecutionProvider: IO binding on the device not run "
                    f"(providers: {__import__('onnxruntime').get_available_providers()})")
    assert runner.on_gpu and type(job) is BoundBatchJob
    cpu = OnnxRunner(str(mlp_path))
    host_pool = HostBufferPool(backend.alloc_host)
    rng = np.random.default_rng(1)
    counts = [1, 5, 2, 8]
    held = []
    for step in range(12):
        feeds_list = [{"INPUT": rng.standard_normal((n, 256)).astype(np.float32)} for n in counts]
        per_request, timings = BoundBatchJob(runner, backend, feeds_list, counts, ["INPUT"], ["OUTPUT"],
                                                 host_pool)()
        for feeds, (out,) in zip(feeds_list, per_request):
            assert isinstance(out, np.ndarray) and out.shape == (feeds["INPUT"].shape[0], 10)
            np.testing.assert_allclose(out, cpu.run(feeds)[0], rtol=2e-3, atol=2e-3)  # TF32 may differ
        held.append((pool.total_bytes(), host_pool.statistics()["allocations"]))
        assert all(t >= 0 for t in timings)
    assert len(set(held[4:])) == 1, held  # steady state: the pools stop growing
    assert pool.used_bytes() == 0  # every device buffer went back
