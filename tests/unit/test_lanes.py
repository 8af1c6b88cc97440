"""A real Lane (worker thread): it runs the job off the loop, replies on the loop with the job's
time, and keeps its own books (busy, busy_ns, batches_run); a failing job fails alone."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from gt_serve.execution.lanes import Lane

WAIT_S = 10.0


def test_finish_keeps_the_books():
    lane = Lane("cpu.0", "cpu", loop=None)  # not started: a submitted job waits in its queue
    lane.submit(lambda: None, None, None)
    assert lane.busy
    lane.finish(1_500)
    lane.submit(lambda: None, None, None)
    lane.finish(500)
    assert (lane.busy, lane.busy_ns, lane.batches_run) == (False, 2_000, 2)


def test_the_lane_runs_off_the_loop_and_replies_on_it_with_its_books_done():
    async def main():
        loop = asyncio.get_running_loop()
        lane = Lane("cpu.0", "cpu", loop)
        lane.start()
        gate = threading.Event()
        replies: asyncio.Queue = asyncio.Queue()
        loop_thread = threading.get_ident()

        def job():
            assert gate.wait(WAIT_S)
            return threading.get_ident()

        def reply(tag, lane_, result, exc, elapsed_ns, cpu_ns):
            # on the loop, after the lane's own bookkeeping
            replies.put_nowait((tag, lane_, result, exc, elapsed_ns, threading.get_ident(), lane_.busy, cpu_ns))

        try:
            lane.submit(job, reply, "batch-1")
            assert lane.busy and replies.empty()
            gate.set()
            tag, who, job_thread, exc, elapsed_ns, reply_thread, busy, cpu_ns = await asyncio.wait_for(replies.get(),
                                                                                                       WAIT_S)
            assert (tag, who, exc, busy) == ("batch-1", lane, None, False)
            assert job_thread != loop_thread and reply_thread == loop_thread
            assert elapsed_ns > 0 and lane.busy_ns == elapsed_ns and lane.batches_run == 1
            assert cpu_ns is not None and cpu_ns >= 0  # the lane thread's (test_a_lane_threads_job_replies_...)
        finally:
            lane.stop()
    asyncio.run(main())


def started_lane(keep) -> tuple[Lane, asyncio.Queue, object]:
    """A lane started on the running loop, the queue its replies go to (each as `keep(tag, result, exc, elapsed_ns,
    cpu_ns)`), and the reply to submit with."""
    lane = Lane("cpu.0", "cpu", asyncio.get_running_loop())
    lane.start()
    replies: asyncio.Queue = asyncio.Queue()

    def reply(tag, lane_, result, exc, elapsed_ns, cpu_ns):
        replies.put_nowait(keep(tag, result, exc, elapsed_ns, cpu_ns))

    return lane, replies, reply


def test_a_failing_job_is_handed_back_and_the_lane_serves_the_next():
    async def main():
        lane, replies, reply = started_lane(lambda tag, result, exc, *_: (tag, result, exc))

        def broken():
            raise ValueError("bad batch")

        try:
            lane.submit(broken, reply, 1)
            tag, result, exc = await asyncio.wait_for(replies.get(), WAIT_S)
            assert tag == 1 and result is None
            with pytest.raises(ValueError, match="bad batch"):
                raise exc
            lane.submit(lambda: "ok", reply, 2)
            assert await asyncio.wait_for(replies.get(), WAIT_S) == (2, "ok", None)
            assert lane.batches_run == 2 and not lane.busy
        finally:
            lane.stop()
    asyncio.run(main())


def test_a_lane_threads_job_replies_with_the_threads_cpu_time_not_its_waits():
    """The CPU time is what the job cost: a job that waits (as a lane run waits for the GIL and to be woken) costs
    little of it, one that computes costs about its wall time."""
    async def main():
        lane, replies, reply = started_lane(lambda tag, result, exc, elapsed_ns, cpu_ns: (tag, elapsed_ns, cpu_ns))

        def computes():
            end_ns = time.thread_time_ns() + 30_000_000
            while time.thread_time_ns() < end_ns:
                pass

        try:
            lane.submit(lambda: threading.Event().wait(0.05), reply, "waits")  # the job's content is a wait
            tag, elapsed_ns, cpu_ns = await asyncio.wait_for(replies.get(), WAIT_S)
            assert tag == "waits" and elapsed_ns >= 50_000_000 and cpu_ns < elapsed_ns / 5
            lane.submit(computes, reply, "computes")
            tag, elapsed_ns, cpu_ns = await asyncio.wait_for(replies.get(), WAIT_S)
            assert tag == "computes" and 30_000_000 <= cpu_ns <= elapsed_ns + 1_000_000  # + the lane's own few us
        finally:
            lane.stop()
    asyncio.run(main())


def test_run_here_runs_on_the_calling_thread_and_replies_in_a_later_loop_turn():
    async def main():
        loop = asyncio.get_running_loop()
        lane = Lane("cpu.0", "cpu", loop)  # no thread started: run_here needs none
        replies: asyncio.Queue = asyncio.Queue()

        def reply(tag, lane_, result, exc, elapsed_ns, cpu_ns):
            assert cpu_ns is None  # on the loop: its wall time is what it cost
            replies.put_nowait((tag, result, exc, elapsed_ns, threading.get_ident(), lane_.busy))

        def broken():
            raise ValueError("bad batch")

        lane.run_here(threading.get_ident, reply, "lone")
        assert lane.busy and replies.empty()  # the reply is not re-entrant: it comes in the loop's next turn
        tag, result, exc, elapsed_ns, reply_thread, busy = await asyncio.wait_for(replies.get(), WAIT_S)
        assert (tag, result, exc, busy) == ("lone", threading.get_ident(), None, False)
        assert reply_thread == threading.get_ident() and lane.busy_ns == elapsed_ns and lane.batches_run == 1
        lane.run_here(broken, reply, "bad")
        tag, result, exc, *_ = await asyncio.wait_for(replies.get(), WAIT_S)
        assert (tag, result) == ("bad", None) and isinstance(exc, ValueError) and lane.batches_run == 2
    asyncio.run(main())


def test_run_now_runs_on_the_calling_thread_and_books_the_run_before_it_returns():
    """ModelExecutor.run_now's lane call: no thread, no reply; busy while the job runs, free and booked after, and a
    failing job handed back as what it raised."""
    lane = Lane("cpu.0", "cpu", loop=None)
    seen = []
    result, exc, elapsed_ns = lane.run_now(lambda: seen.append((threading.get_ident(), lane.busy)) or "out")
    assert (result, exc) == ("out", None) and seen == [(threading.get_ident(), True)]
    assert (lane.busy, lane.busy_ns, lane.batches_run) == (False, elapsed_ns, 1)

    def boom():
        raise RuntimeError("session exploded")

    result, exc, _ = lane.run_now(boom)
    assert result is None and isinstance(exc, RuntimeError) and not lane.busy and lane.batches_run == 2
