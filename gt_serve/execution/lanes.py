"""A lane = one worker thread (+ a CUDA stream on a GPU) that runs batch jobs off the event loop.

Jobs are plain callables. `submit(job, reply, tag)` marks the lane busy and queues the job; the
lane thread runs it, times it, and hands the result (or exception) back to the loop with one
call_soon_threadsafe per batch, where the lane first does its own bookkeeping (`finish`) and then
calls `reply(tag, lane, result, exc, elapsed_ns, cpu_ns)`: the submitter's own completion method, passed
with the work like a future, not installed on the lane. onnxruntime releases the GIL while it
computes. `elapsed_ns` is wall time (the lane's busy time); `cpu_ns`, for a job of the lane thread, is that
thread's CPU time in it: what the job itself cost, without its waits for the GIL and for the thread to be
woken, which wall time holds (None for a job run on the loop, whose wall time is its cost, or launched).

A lane is `busy` while any of its jobs runs. One job at a time runs on its thread or the loop's; a job
launched into onnxruntime's pool (`launch`) leaves the lane `spare` for one more launched job (LAUNCH_DEPTH),
which the scheduler gives it only as a full batch (issue #17, twenty-sixth pass).
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

log = logging.getLogger(__name__)

# reply(tag, lane, result, exc, elapsed_ns, cpu_ns), called on the loop once the job has run
Reply = Callable[[Any, "Lane", Any, "BaseException | None", int, "int | None"], None]
_now_ns = time.perf_counter_ns
_cpu_ns = time.thread_time_ns
# launched jobs a lane may have in flight: a second one queues in onnxruntime's pool while the first computes, so
# the pool's thread starts it as soon as the first is done, not after the first's answer has passed through the
# loop (a model that does not batch: 1.2x the inf/s at 16 HTTP clients; a third read the same)
LAUNCH_DEPTH = 2


@dataclass(eq=False)
class Lane:
    lane_id: str
    device: str  # "cpu" or "gpu:<id>"
    loop: asyncio.AbstractEventLoop
    stream: Any = None  # cupy Stream on GPU lanes
    batches_run: int = 0
    launched: int = 0  # of those, batches launched into onnxruntime's pool from the loop (`launch`)
    busy_ns: int = 0
    flying: int = 0  # launched jobs whose reply has not come yet
    _held: bool = False  # a job of the lane's thread or the loop's is running (one at a time)
    _landed_ns: int = 0  # when the last launched job's reply came (`_landed_reply`)
    _jobs: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    _thread: threading.Thread | None = None
    _airborne: set = field(default_factory=set)  # launched jobs whose run has not called back yet
    _landing: threading.Condition = field(default_factory=threading.Condition)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._work, name=f"lane-{self.lane_id}", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], Any], reply: Reply, tag: Any) -> None:
        """Queue `job`; `reply(tag, self, result, exc, elapsed_ns, cpu_ns)` runs on the loop when it is done."""
        self._held = True
        self._jobs.put((job, self._finished, reply, tag))

    def run_here(self, job: Callable[[], Any], reply: Reply, tag: Any) -> None:
        """Run `job` on the calling thread (the loop's) now; `reply` comes in the loop's next turn, as from the
        lane thread. For a lone job shorter than the two thread hand-offs it saves (the caller decides)."""
        self._held = True
        timed = self._timed(job, Exception)  # the batch fails, the loop lives on
        self.loop.call_soon(self._finished, reply, tag, *timed)

    def run_now(self, job: Callable[[], Any]) -> tuple[Any, BaseException | None, int]:
        """`run_here` with no reply to wait for: run `job` on the calling thread (the loop's) and book it at once;
        (result, None, elapsed_ns) or (None, what it raised, elapsed_ns)."""
        self._held = True
        timed = self._timed(job, Exception)  # the request fails, the loop lives on
        self.finish(timed[2])
        return timed

    def launch(self, job: Any, reply: Reply, tag: Any) -> None:
        """Start `job` (a BatchJob of a runner that `runs_async`) from the calling thread, the loop's: it packs here
        and computes on a thread of onnxruntime's pool, so the run starts without waking the lane thread and waiting
        for the GIL to pass to it. `reply` comes as from the lane thread; a failed batch of several requests is
        re-run one request at a time on the lane thread, still counted in `flying` until it replies."""
        self.flying += 1
        self.launched += 1
        start_ns = _now_ns()
        call = self.loop.call_soon_threadsafe
        self._airborne.add(job)

        def finish(result: Any, exc: BaseException | None) -> None:  # on onnxruntime's thread
            try:
                call(self._landed_reply, reply, tag, result, exc, _now_ns() - start_ns)
            except RuntimeError:  # loop closed during shutdown
                pass
            finally:
                self._landed(job)

        def retry(again: Callable[[], Any]) -> None:  # on onnxruntime's thread
            self._jobs.put((again, self._landed_reply, reply, tag))
            self._landed(job)

        try:
            job.start(finish, retry)
        except Exception as exc:  # noqa: BLE001 - the batch fails, the loop lives on
            self._landed(job)
            self.loop.call_soon(self._landed_reply, reply, tag, None, exc, _now_ns() - start_ns)

    def _landed(self, job: Any) -> None:
        with self._landing:
            self._airborne.discard(job)
            self._landing.notify_all()

    @property
    def busy(self) -> bool:
        """A job of the lane's thread or the loop's runs, or a launched one has not replied yet."""
        return self._held or self.flying > 0

    @property
    def spare(self) -> bool:
        """Busy with launched jobs only, fewer than LAUNCH_DEPTH: it may take one more launched job."""
        return not self._held and 0 < self.flying < LAUNCH_DEPTH

    def finish(self, elapsed_ns: int) -> None:
        """Bookkeeping for one finished job of the lane's thread or the loop's, on the loop thread (the only writer
        of these fields)."""
        self._held = False
        self._book(elapsed_ns)

    def _book(self, elapsed_ns: int) -> None:
        """The books of every finished job: its time, its count."""
        self.busy_ns += elapsed_ns
        self.batches_run += 1

    def _finished(self, reply: Reply, tag: Any, result: Any, exc: BaseException | None, elapsed_ns: int,
                  cpu_ns: int | None = None) -> None:
        self.finish(elapsed_ns)
        reply(tag, self, result, exc, elapsed_ns, cpu_ns)

    def _landed_reply(self, reply: Reply, tag: Any, result: Any, exc: BaseException | None, elapsed_ns: int,
                      cpu_ns: int | None = None) -> None:
        """`_finished` for a launched job (or its one-by-one re-run), on the loop thread. Of a job launched beside
        another, only the time since the other's reply counts, as the lane's busy time and as the job's time in the
        reply (the model's fair share): it waited in onnxruntime's pool meanwhile, and the lane's busy time stays
        wall time."""
        self.flying -= 1
        now_ns = _now_ns()
        elapsed_ns = min(elapsed_ns, now_ns - self._landed_ns)
        self._landed_ns = now_ns
        self._book(elapsed_ns)
        # no CPU time: onnxruntime's pool computed the batch (and a failed one's re-run is not the batch's cost)
        reply(tag, self, result, exc, elapsed_ns, None)

    def _work(self) -> None:
        call = self.loop.call_soon_threadsafe
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, done, reply, tag = item
            start_cpu_ns = _cpu_ns()
            timed = self._timed(job, BaseException)  # handed to the loop: the batch fails, the lane lives on
            try:
                call(done, reply, tag, *timed, _cpu_ns() - start_cpu_ns)
            except RuntimeError:  # loop closed during shutdown
                return

    def _timed(self, job: Callable[[], Any], catch: type[BaseException]) -> tuple[Any, BaseException | None, int]:
        """(result, None, elapsed_ns) of `job` run here (in the lane's CUDA stream, if it has one), or (None, what
        it raised, elapsed_ns) for an exception of kind `catch`."""
        start_ns = _now_ns()
        try:
            if self.stream is not None:
                with self.stream:
                    result = job()
            else:
                result = job()
            exc = None
        except catch as e:
            result, exc = None, e
        return result, exc, _now_ns() - start_ns

    def stop(self, join_timeout_s: float = 5.0) -> None:
        """Let launched runs call back (up to `join_timeout_s`), so that none outlives its lane and a failed one's
        re-run still reaches the thread, then end the thread once it has run what it was given (as long again)."""
        with self._landing:
            self._landing.wait_for(lambda: not self._airborne, join_timeout_s)
        self._jobs.put(None)
        if self._thread is not None:
            self._thread.join(join_timeout_s)

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("gpu")


def plan_cpu_lanes(cores: int, lanes: int = 0, intra_op_threads: int = 0) -> tuple[int, int]:
    """Lanes share the cores without oversubscribing them: lanes x threads <= cores.

    By default one lane per two cores (at most 4 lanes), each with cores / lanes intra-op threads.
    Measured on 2 cores (bench/run_bench.py): a lane with 2 threads beat 2 lanes of 1 thread, as the
    second lane kept taking the few requests that had come back while the first one computed and
    ran them as small, inefficient batches (mean batch 11 vs 31; CNN 1763 vs 1576 and MLP 17.7k vs
    12.7k requests/s with the lean client, gRPC MLP +33 %), for ~0.1 ms more single-request latency
    on the MLP (p50 0.57 vs 0.48 ms), which the short spin of `lanes.spin_us` won back. That spin is within a
    run only (it stops when the run returns): off for a while in issue #17, on again since its twenty-seventh pass.
    """
    cores = max(1, cores)
    if lanes <= 0:
        lanes = max(1, min(cores // 2, 4))
    if intra_op_threads <= 0:
        intra_op_threads = max(1, cores // lanes)
    return lanes, intra_op_threads
