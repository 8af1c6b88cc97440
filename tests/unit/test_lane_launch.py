"""Lane.launch with real onnxruntime sessions: a batch packed on the loop and run in onnxruntime's pool gives
what the lane thread's run gives, replies on the loop, returns its pooled buffers, and a batch that fails is re-run
one request at a time on the lane's thread (issue #17). A lane takes a second launched job beside the first, and
counts their time once."""
from __future__ import annotations

import asyncio
import queue
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from gt_serve.backends import thread_state
from gt_serve.backends.numpy_backend import NumpyBackend
from gt_serve.backends.onnx_runner import OnnxRunner
from gt_serve.execution import batch_job
from gt_serve.execution.batch_job import BatchJob
from gt_serve.execution.bound_job import BoundBatchJob
from gt_serve.execution.lanes import Lane
from gt_serve.execution.memory_pool import HostBufferPool
from gt_serve.testing import model_builders as mb

WAIT_S = 10.0


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("launch_models")
    paths = {"mlp": root / "mlp" / "model.onnx", "gather": root / "gather" / "model.onnx"}
    mb.mlp(paths["mlp"], sizes=(16, 32, 8))
    mb.gather(paths["gather"], np.arange(40, dtype=np.float32).reshape(10, 4))
    return paths


def rows(n: int, seed: int) -> dict[str, np.ndarray]:
    return {"INPUT": np.random.default_rng(seed).standard_normal((n, 16)).astype(np.float32)}


def launch(lane: Lane, job: BatchJob) -> tuple:
    """Launch `job` on `lane` from the running loop; (result, exc, reply thread) once the reply has come."""
    loop = asyncio.get_running_loop()
    replied: asyncio.Future = loop.create_future()

    def reply(tag, lane_, result, exc, elapsed_ns, cpu_ns):
        assert tag == "batch" and lane_ is lane and not lane.busy and elapsed_ns > 0 and cpu_ns is None
        replied.set_result((result, exc, threading.get_ident()))

    lane.launch(job, reply, "batch")
    assert lane.busy
    return replied


def test_a_launched_batch_gives_what_the_lane_thread_gives(models):
    async def main():
        lane = Lane("cpu.0", "cpu", asyncio.get_running_loop())  # no thread: a batch that runs needs none
        runner = OnnxRunner(str(models["mlp"]), intra_op_threads=2)
        pool = HostBufferPool()
        counts = [1, 600, 500]  # 1,101 rows of 64 bytes: past SMALL_PACK_BYTES, so packed into a pooled buffer
        feeds = [rows(n, seed) for seed, n in enumerate(counts)]
        job = BatchJob(runner, NumpyBackend(), feeds, counts, ["INPUT"], ["OUTPUT"], pool)
        assert runner.runs_async and job.launchable
        (per_request, timings), exc, thread = await asyncio.wait_for(launch(lane, job), WAIT_S)
        assert exc is None and thread == threading.get_ident()  # the reply is on the loop
        expected, _ = BatchJob(runner, NumpyBackend(), feeds, counts, ["INPUT"], ["OUTPUT"])()
        assert [o[0].shape for o in per_request] == [(n, 8) for n in counts]
        for got, want in zip(per_request, expected):
            np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
        assert all(t >= 0 for t in timings) and timings[1] > 0
        assert (lane.launched, lane.batches_run) == (1, 1)
        stats = pool.statistics()  # the packed input went back to its pool
        assert stats["misses"] == 1 and stats["bytes_in_use"] == 0
    asyncio.run(main())


def test_a_failed_launched_batch_is_rerun_one_request_at_a_time_on_the_lane_thread(models):
    async def main():
        lane = Lane("cpu.0", "cpu", asyncio.get_running_loop())
        lane.start()
        runner = OnnxRunner(str(models["gather"]), intra_op_threads=2)
        index = lambda i: {"INDICES": np.array([[i]], np.int64)}  # noqa: E731
        job = BatchJob(runner, NumpyBackend(), [index(3), index(99), index(5)], [1, 1, 1], ["INDICES"], ["OUTPUT"])
        try:
            (per_request, _), exc, _ = await asyncio.wait_for(launch(lane, job), WAIT_S)
        finally:
            lane.stop()
        assert exc is None
        assert isinstance(per_request[1], Exception) and "99" in str(per_request[1])  # onnxruntime names the index
        good = [p[0].tolist() for i, p in enumerate(per_request) if i != 1]
        assert good == [[[[12, 13, 14, 15]]], [[[20, 21, 22, 23]]]]  # rows 3 and 5 of the table
        assert (lane.launched, lane.batches_run) == (1, 1)
    asyncio.run(main())


def test_one_request_that_fails_launched_gets_the_error_of_the_lane_threads_run(models):
    """onnxruntime's callback gives only the message: the request is run again on the lane thread, so that its error
    reads as the lane's run would have it (exception type and status), whichever way the request ran."""
    async def main():
        lane = Lane("cpu.0", "cpu", asyncio.get_running_loop())
        lane.start()
        runner = OnnxRunner(str(models["gather"]), intra_op_threads=2)
        job = BatchJob(runner, NumpyBackend(), [{"INDICES": np.array([[42]], np.int64)}], [1], ["INDICES"], ["OUTPUT"])
        try:
            result, exc, _ = await asyncio.wait_for(launch(lane, job), WAIT_S)
        finally:
            lane.stop()
        with pytest.raises(Exception) as on_the_lane:
            job()
        assert result is None and "42" in str(exc)
        assert (type(exc), str(exc)) == (type(on_the_lane.value), str(on_the_lane.value))
        assert (lane.launched, lane.batches_run, lane.flying, lane.busy) == (1, 1, 0, False)
    asyncio.run(main())


def test_a_batch_onnxruntime_refuses_to_launch_runs_on_the_lane_thread(models):
    async def main():
        lane = Lane("cpu.0", "cpu", asyncio.get_running_loop())
        lane.start()
        runner = OnnxRunner(str(models["mlp"]), intra_op_threads=1)  # RunAsync needs a pool thread besides the caller
        assert not runner.runs_async
        feeds = [rows(1, 1), rows(1, 2)]
        job = BatchJob(runner, NumpyBackend(), feeds, [1, 1], ["INPUT"], ["OUTPUT"])
        assert not job.launchable  # the executor never launches it; launched anyway, it still gets its answers
        try:
            (per_request, _), exc, _ = await asyncio.wait_for(launch(lane, job), WAIT_S)
        finally:
            lane.stop()
        assert exc is None
        for got, feed in zip(per_request, feeds):
            np.testing.assert_allclose(got[0], runner.run(feed)[0], rtol=1e-6)
    asyncio.run(main())


def test_a_job_that_cannot_start_fails_its_batch_and_the_loop_lives_on():
    async def main():
        lane = Lane("cpu.0", "cpu", asyncio.get_running_loop())

        class Unpackable:
            def start(self, finish, retry):
                raise ValueError("cannot pack")

        result, exc, _ = await asyncio.wait_for(launch(lane, Unpackable()), WAIT_S)
        assert result is None and isinstance(exc, ValueError) and not lane.busy
    asyncio.run(main())


def test_jobs_that_bind_their_buffers_are_not_launchable(models):
    runner = OnnxRunner(str(models["mlp"]), intra_op_threads=2)
    assert not BoundBatchJob(runner, NumpyBackend(), [rows(1, 1)], [1], ["INPUT"], ["OUTPUT"]).launchable


def test_stop_waits_for_launched_runs_to_call_back():
    async def main():
        lane = Lane("cpu.0", "cpu", asyncio.get_running_loop())
        lane.start()
        gate, called_back = threading.Event(), threading.Event()

        class Slow:  # a run that calls back from another thread once the gate opens
            def start(self, finish, retry):
                def run():
                    assert gate.wait(WAIT_S)
                    finish("late", None)
                    called_back.set()
                threading.Thread(target=run, daemon=True).start()

        lane.launch(Slow(), lambda *args: None, "batch")
        stopping = threading.Thread(target=lane.stop, kwargs={"join_timeout_s": WAIT_S})
        stopping.start()
        stopping.join(0.2)
        assert stopping.is_alive() and lane._thread.is_alive()  # waiting for the run to call back
        gate.set()
        stopping.join(WAIT_S)
        assert not stopping.is_alive() and called_back.is_set() and not lane._thread.is_alive()
    asyncio.run(main())


class Gated:
    """A launched job that calls back from a thread of its own once `gate` opens: with `result`, or by handing a
    re-run to the lane thread (`retry`), as a failed batch of several requests does."""

    def __init__(self, result, retry=False):
        self.result, self.retry, self.gate, self.started = result, retry, threading.Event(), threading.Event()

    def start(self, finish, retry):
        def run():
            self.started.set()
            assert self.gate.wait(WAIT_S)
            if self.retry:
                retry(lambda: self.result)
            else:
                finish(self.result, None)
        threading.Thread(target=run, daemon=True).start()


def test_a_lane_takes_a_second_launched_job_and_is_free_once_both_and_a_rerun_replied():
    async def main():
        lane = Lane("cpu.0", "cpu", asyncio.get_running_loop())
        lane.start()
        replies: asyncio.Queue = asyncio.Queue()

        def reply(tag, lane_, result, exc, elapsed_ns, cpu_ns):  # on the loop, after the lane's books
            replies.put_nowait((tag, result, exc, lane_.busy, lane_.spare, lane_.flying))

        first, second, third = Gated("a"), Gated("b", retry=True), Gated("c")
        try:
            assert not lane.spare  # idle: a batch of any kind, not a spare slot
            lane.launch(first, reply, 1)
            assert lane.busy and lane.spare and lane.flying == 1
            lane.launch(second, reply, 2)
            assert lane.busy and not lane.spare and lane.flying == 2
            second.gate.set()  # re-run on the lane thread: still counted until it replies
            assert await asyncio.wait_for(replies.get(), WAIT_S) == (2, "b", None, True, True, 1)
            first.gate.set()
            assert await asyncio.wait_for(replies.get(), WAIT_S) == (1, "a", None, False, False, 0)
            lane.launch(third, reply, 3)
            lane.submit(lambda: "d", reply, 4)  # a job of the lane's thread beside a launched one
            assert lane.busy and not lane.spare
            assert await asyncio.wait_for(replies.get(), WAIT_S) == (4, "d", None, True, True, 1)
            third.gate.set()
            assert await asyncio.wait_for(replies.get(), WAIT_S) == (3, "c", None, False, False, 0)
        finally:
            for job in (first, second, third):
                job.gate.set()
            lane.stop()
        assert (lane.launched, lane.batches_run) == (3, 4)


def test_two_launched_jobs_at_once_count_their_time_once():
    async def main():
        lane = Lane("cpu.0", "cpu", asyncio.get_running_loop())
        replies: asyncio.Queue = asyncio.Queue()
        jobs = [Gated("a"), Gated("b")]
        start_ns = time.perf_counter_ns()
        for tag, job in enumerate(jobs):
            lane.launch(job, lambda tag, lane_, result, exc, elapsed_ns, _: replies.put_nowait((tag, elapsed_ns)), tag)
        for job in jobs:  # both computing at once
            assert await asyncio.to_thread(job.started.wait, WAIT_S)
        for job in jobs:
            job.gate.set()
        got = dict([await asyncio.wait_for(replies.get(), WAIT_S) for _ in jobs])
        wall_ns = time.perf_counter_ns() - start_ns
        assert set(got) == {0, 1} and not lane.busy
        assert 0 < lane.busy_ns == sum(got.values()) <= wall_ns  # the busy time, and the jobs' times in the replies
    asyncio.run(main())
    asyncio.run(main())


def test_onnxruntimes_pool_thread_keeps_its_python_thread_state_between_callbacks(models, monkeypatch):
    """A thread state made for each callback would cost an mmap and an munmap a run (backends/thread_state.py):
    what a callback leaves in a thread-local is there for the next one on that thread, up to KEPT_MAX threads."""
    def marks(runner) -> list:
        local, seen = threading.local(), []
        for i in range(3):
            done = threading.Event()

            def ran(outputs, exc, i=i):
                seen.append((threading.get_ident(), getattr(local, "mark", None), exc))
                local.mark = i
                done.set()
            runner.run_async(rows(1, i), None, ran)
            assert done.wait(WAIT_S)
        assert len({ident for ident, _, _ in seen} - {threading.get_ident()}) == 1  # the session's one pool thread
        assert all(exc is None for _, _, exc in seen)
        return [mark for _, mark, _ in seen]

    monkeypatch.setattr(thread_state, "KEPT_MAX", thread_state.kept_count() + 1)  # room for one thread more
    assert marks(OnnxRunner(str(models["mlp"]), intra_op_threads=2)) == [None, 0, 1]
    assert thread_state.kept_count() == thread_state.KEPT_MAX
    assert marks(OnnxRunner(str(models["mlp"]), intra_op_threads=2)) == [None, None, None]  # past the cap


class OnePoolThread:
    """A runner whose `run_async` queues its runs for one thread, as onnxruntime's pool of two intra-op threads does:
    each run computes once its gate opens, after the runs queued before it."""

    def __init__(self):
        self.runs: queue.SimpleQueue = queue.SimpleQueue()
        self.gates: list[threading.Event] = []  # one a run, in launch order
        threading.Thread(target=self._work, daemon=True).start()

    def run_async(self, feeds, output_names, done):
        self.gates.append(threading.Event())
        self.runs.put((self.gates[-1], feeds, done))

    def _work(self):
        while True:
            gate, feeds, done = self.runs.get()
            assert gate.wait(WAIT_S)
            done([feeds["INPUT"] * 2], None)


def test_a_run_queued_behind_another_counts_its_compute_time_from_the_others_end(monkeypatch):
    """Its statistics (and the energy charged from them) are the run's, not its wait in the pool's queue. The clock
    is the test's: it reads 100 ns while both are launched, 5000 when the first computes, 5100 when the second."""
    clock = [100]
    monkeypatch.setattr(batch_job, "_now_ns", lambda: clock[0])
    runner, finished = OnePoolThread(), queue.SimpleQueue()
    jobs = [BatchJob(runner, NumpyBackend(), [rows(1, i)], [1], ["INPUT"], ["OUTPUT"]) for i in range(2)]
    for job in jobs:
        job.start(lambda result, exc: finished.put((result, exc)), lambda again: finished.put(("retry", again)))
    timings = []
    for at, gate in zip((5000, 5100), runner.gates):
        clock[0] = at
        gate.set()
        (_, timing), exc = finished.get(timeout=WAIT_S)
        assert exc is None
        timings.append(timing)
    assert timings == [(0, 4900, 0), (0, 100, 0)]  # not 5000: the second computed once the first was done
