"""A real Lane (worker thread): it runs the job off the loop, replies on the loop with the job's
time, and keeps its own books (busy, busy_ns, batches_run); a failing job fails alone."""
from __future__ import annotations

import asyncio
import threading

import pytest

from gt_serve.execution.lanes import Lane

WAIT_S = 10.0


def test_finish_keeps_the_books():
    lane = Lane("cpu.0", "cpu", loop=None)
    lane.busy = True
    lane.finish(1_500)
    lane.busy = True
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

        def reply(tag, lane_, result, exc, elapsed_ns):
            # on the loop, after the lane's own bookkeeping
            replies.put_nowait((tag, lane_, result, exc, elapsed_ns, threading.get_ident(), lane_.busy))

        try:
            lane.submit(job, reply, "batch-1")
            assert lane.busy and replies.empty()
            gate.set()
            tag, who, job_thread, exc, elapsed_ns, reply_thread, busy = await asyncio.wait_for(replies.get(), WAIT_S)
            assert (tag, who, exc, busy) == ("batch-1", lane, None, False)
            assert job_thread != loop_thread and reply_thread == loop_thread
            assert elapsed_ns > 0 and lane.busy_ns == elapsed_ns and lane.batches_run == 1
        finally:
            lane.stop()
    asyncio.run(main())


def test_a_failing_job_is_handed_back_and_the_lane_serves_the_next():
    async def main():
        loop = asyncio.get_running_loop()
        lane = Lane("cpu.0", "cpu", loop)
        lane.start()
        replies: asyncio.Queue = asyncio.Queue()

        def reply(tag, lane_, result, exc, elapsed_ns):
            replies.put_nowait((tag, result, exc))

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
