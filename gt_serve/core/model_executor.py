"""One loaded model version at work: its queue, its sessions on its lanes, its batch jobs, its completions.

A request's path, each hop a direct call or one queue:

    DataPlane.infer -> ModelExecutor.submit (= Batcher.submit: the request's future) -> StreamScheduler.notify
    StreamScheduler._pump -> Batcher.decide -> ModelExecutor.dispatch -> Batcher.take -> job_factory -> Lane.submit
    lane thread: job() -> InferenceSession.run -> loop.call_soon_threadsafe (the one queue back)
    loop: Lane.finish -> ModelExecutor._complete -> StreamScheduler.finished (fair share, the next batch dispatched
          at once) -> BatchCompletion.resolve (futures, stats, energy; with the config's preserve_ordering, once the
          batches taken before it are answered: core/answer_order.py)

A CPU batch may instead be launched from the loop: Lane.launch -> BatchJob.start -> InferenceSession.run_async, its
reply from onnxruntime's pool thread (LaunchChoice: a model's batches of several requests, while fast; `_launches_alone`:
a request of a model that does not batch). A lane may hold two launched batches (Lane.spare, `launches_more`).

A one-row request while requests come one at a time skips the queue: DataPlane.express_run -> ModelExecutor.run_now ->
StreamScheduler.lone_lane -> Lane.run_now (the job on the loop thread) -> BatchCompletion.lone (the outputs
returned, no future); once the caller has written the answer, a turn later: StreamScheduler.finished ->
BatchCompletion.lone_books (stats, energy).

The executor is complete when constructed: everything it calls is passed in. It keeps no callback
of anyone above it; the lane calls back the `_complete` it was handed with the job, like a future.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Mapping, Protocol

from ..errors import Unavailable
from .batch_completion import BatchCompletion
from .batcher import Batch, Batcher, Entry
from .inline_choice import InlineChoice
from .launch_choice import LaunchChoice
from .trace_context import note_batch

log = logging.getLogger(__name__)
_now_ns = time.monotonic_ns
_LONE_SHAPES = 64  # shapes whose one-row run times are remembered (a model with dynamic dims has many)
# batches of up to this many rows may run on the loop's thread (`_runs_inline`); more are launched or go to the lane,
# where LaunchChoice times those of 8 rows or more (or of the model's max_batch_size, where that is smaller)
INLINE_ROWS = 7
# `_answered`: a batch whose run took at least this many queue delays expects its clients back whatever the count: a
# lane held idle for one delay then loses at most an eighth of a run
_LONG_RUN_DELAYS = 8
# `_answered`: up to this many requests (the answered ones and the queued ones, within max_batch_size) a batch expects
# its clients back when fewer are queued than it answered: one batch of them costs far less than two halves (mlp: 16
# rows 0.39 ms of CPU, two batches of 8 0.68), and the loop answers and reads them back well within a queue delay
_EXPECT_REQUESTS = 16
_ROUND_SHAPES = 64  # (row shape, rows) run times kept for `_runs_round`
_GAP_CAP_NS = 1_000_000  # `run_now`: the time between two requests counts up to this (a long idle, then a burst)
BATCH_WAYS = ("at_once", "loop", "lane", "launched")  # where batches ran (`ran`: the gt_batch_runs metric)

# job_factory(runner, batch, spec, lane) -> the zero-argument job the lane runs (execution.job_factory.JobFactory)
JobFactory = Callable[[Any, Batch, Any, Any], Callable[[], Any]]


class SchedulerLink(Protocol):
    """What an executor needs of the StreamScheduler (its batcher holds `notify`)."""

    def finished(self, executor: ModelExecutor, elapsed_ns: int, lane: Any = None) -> None: ...

    def unregister(self, executor: ModelExecutor) -> None: ...

    def lone_lane(self, executor: ModelExecutor) -> Any: ...


class ModelExecutor:
    """Runs one model version's batches on its lanes: `submit` a request (its future comes back), the
    scheduler calls `dispatch`, the lane replies to `_complete`; `close` drains it on unload. All methods
    but `release` run on the loop thread."""

    def __init__(self, batcher: Batcher, runners: Mapping[Any, Any], job_factory: JobFactory,
                 completion: BatchCompletion, scheduler: SchedulerLink, spec: Any, *,
                 version: str = "", weight: float = 1.0, inline_max_ns: int = 0, launch: str = "never",
                 tiny: bool = False) -> None:
        """`inline_max_ns`: a one-row batch of a shape whose runs take less than this runs on the loop thread
        (`_runs_inline`); 0 = every batch goes to its lane's thread. `launch`: whether batches of several requests
        are launched from the loop into onnxruntime's pool: "auto" (LaunchChoice times the model), "always" (every
        batch that fits), "never". `tiny`: the model's largest batch runs in microseconds (core/tiny_models.py):
        with inlining on, every batch runs on the loop's thread, as a lone short row does, on a CPU lane."""
        self.name = batcher.name
        self.version = version
        self.batcher = batcher
        # the hot path: the data plane calls the queue directly (one call per request, as before the executor);
        # the batcher wakes the scheduler it was built with
        self.submit: Callable[..., asyncio.Future] = batcher.submit
        self.lanes = tuple(runners)  # the lanes this model may run on, each with its runner
        self.weight = weight
        self.in_flight = 0  # batches handed to a lane and not yet back
        self.ran = dict.fromkeys(BATCH_WAYS, 0)  # batches by where they ran
        self._runners = dict(runners)
        self._job_factory = job_factory
        self._completion = completion
        self._scheduler = scheduler
        self._spec = spec
        self._tiny = tiny and inline_max_ns > 0
        self._drained = asyncio.Event()  # set when a closed executor has nothing queued or running
        self._release_when_idle = False
        self._released = False
        self._inline_max_ns = inline_max_ns
        self._lone_ns: dict[tuple, int] = {}  # row shapes -> moving average of one-row batches' run time
        self._rows_ns: dict[tuple, int] = {}  # (row shape, rows) -> the same for batches of 2 to INLINE_ROWS rows
        self._round_ns: dict[tuple, int] = {}  # (row shape, rows) -> the same for `_runs_round`'s rows, any way run
        self._expected = 0  # how many batches in a row expected their clients back (`_answered`)
        self._last_rows = 0  # the rows of the last batch run: 1 while requests come one at a time (`run_now`)
        self._asked_ns = 0  # when `run_now` was last asked, and the moving average of the time between two asks
        self._gap_ns = 0
        self._launch = (LaunchChoice(always=launch == "always", max_batch_size=batcher.cfg.max_batch_size)
                        if launch != "never" else None)
        self._inline_choice = InlineChoice()  # small batches of several requests: on the loop or the lane
        self._order = completion.order  # the config's preserve_ordering: batches answered in the order taken, or None

    @property
    def pending(self) -> int:
        return self.batcher.pending

    @property
    def runners(self) -> list:
        return list(dict.fromkeys(self._runners.values()))

    # -- batches --------------------------------------------------------------------------------
    def dispatch(self, entries: list[Entry], lane: Any) -> None:
        """Called by the scheduler: take `entries` off the queue and run them as one batch on `lane`."""
        batch = self.batcher.take(entries)
        if self._order is not None:
            self._order.taken(batch)
        self.in_flight += 1
        job = self._job_factory(self._runners[lane], batch, self._spec, lane)
        way = self._way(batch, lane, job)
        if way == "timed":  # one LaunchChoice would launch, run on the lane for its timing (`_complete`)
            batch.launch, way = False, "lane"
        self.ran[way] += 1
        if way == "loop":
            batch.inline = True
            lane.run_here(job, self._complete, batch)
        elif way == "launched":
            batch.launch = True
            lane.launch(job, self._complete, batch)
        else:
            lane.submit(job, self._complete, batch)

    def _way(self, batch: Batch, lane: Any, job: Any) -> str:
        """Where `batch` runs: on the loop, a tiny model's batch (handing it to another thread would cost more than
        running it), a batch of every client (`_runs_round`) or a small one (`_inline`); launched, a request of a
        model that does not batch (`_launches_alone`) or a batch LaunchChoice launches; "timed", one that fits
        LaunchChoice while it does not launch (on the lane's thread, and its run timed); else on the lane's thread."""
        if (self._tiny and not lane.on_gpu) or self._runs_round(batch, lane):
            return "loop"
        launch = self._launch
        launchable = launch is not None and not lane.on_gpu and getattr(job, "launchable", False)
        if launchable and self._launches_alone(batch):
            return "launched"
        fits = launchable and launch.fits(batch)
        if self._inline_max_ns and self._inline(batch, lane, fits and launch.launching):
            return "loop"
        if not fits:
            return "lane"
        return "launched" if launch.launching else "timed"

    @property
    def launches_more(self) -> bool:
        """Whether a lane busy with launched runs only (`Lane.spare`) may take one more of this model's batches, if
        it is full (`full`): the model's batches are launched (one request each, for a model that does not batch).
        A second batch queued in onnxruntime's pool starts as soon as the first is computed: for a model whose
        batches are capped small this pays (mlp without config.pbtxt, 4 rows, at 64 HTTP clients: 1.13x the inf/s);
        a batch that is not full would have been taken smaller than the next one (any second batch: 0.92x)."""
        launch = self._launch
        return launch is not None and (self.batcher.cfg.max_batch_size <= 0 or launch.launching)

    def full(self, entries: list[Entry]) -> bool:
        """Whether `entries` make a batch of the model's max_batch_size rows (any request of a model that does not
        batch)."""
        most = self.batcher.cfg.max_batch_size
        return most <= 0 or sum(e.batch_size for e in entries) >= most

    def _launches_alone(self, batch: Batch) -> bool:
        """A request of a model that does not batch, whose run is short enough for the loop to run it itself
        (`_inline_ns`): it is launched instead, so that onnxruntime's pool computes while the loop reads and answers
        the next requests (the loop ran every run itself and stayed ~100 % busy, the machine ~30 % idle; launched,
        a model without dynamic batching served 1.2x the inf/s at 4-16 HTTP clients, at the same CPU per
        inference). A request alone (`run_now`) still runs on the loop at once."""
        if self.batcher.cfg.max_batch_size > 0 or not self._inline_max_ns or batch.size > INLINE_ROWS:
            return False
        return self._inline_ns(batch.entries[0].shape_key, batch.size) < self._inline_max_ns

    def run_now(self, feeds: dict, shape_key: tuple) -> list | None:
        """A one-row request run at once on the loop's thread, where the queue would run it inline a turn later: its
        outputs (model order), or None when it must be queued (`submit`). Only while requests come one at a time:
        on average more than twice the shape's run time apart (so that running one at once seldom delays another;
        a burst's requests, read together, are then queued and batched) and the last batch one row; nothing queued,
        due or held for its order (preserve_ordering); `_runs_inline`'s rule; the lane the scheduler would choose
        (`lone_lane`). Charged as the queue charges it (statistics, energy, fair share, the shape's run time), in the
        loop's next turn (`_lone_books`); a failed run raises the error its future would get. It saves the request's
        future, its queue entry, two turns of the loop and the batch's hand-back."""
        now_ns = _now_ns()
        gap_ns = self._gap_ns = self._gap_ns + (min(now_ns - self._asked_ns, _GAP_CAP_NS) - self._gap_ns) // 8
        self._asked_ns = now_ns
        lone_ns = self._lone_ns.get(shape_key, self._inline_max_ns)
        if lone_ns >= self._inline_max_ns or gap_ns < 2 * lone_ns or self._last_rows != 1 or self.batcher.pending \
                or self.batcher.closed is not None or (self._order is not None and self._order.waiting):
            return None
        lane = self._scheduler.lone_lane(self)
        if lane is None or lane.on_gpu:
            return None
        batch = Batch([Entry(feeds, 1, shape_key, None, None)], 1)
        batch.inline = True
        self.ran["at_once"] += 1
        result, exc, elapsed_ns = lane.run_now(self._job_factory(self._runners[lane], batch, self._spec, lane))
        try:
            return self._completion.lone(lane, result, exc)
        finally:  # the books a turn later, once the answer is written (`_lone_books`)
            self.batcher.loop.call_soon(self._lone_books, batch, lane, result, exc, elapsed_ns, _now_ns())

    def _lone_books(self, batch: Batch, lane: Any, result: Any, exc: BaseException | None, elapsed_ns: int,
                    done_ns: int) -> None:
        """`run_now`'s run charged once the caller has written its answer (before the write, these books held it
        back: 0.94x one mlp client's p50 this way): its run time, the fair share, statistics and energy."""
        self._note_run(batch, elapsed_ns)
        self._scheduler.finished(self, elapsed_ns)
        self._completion.lone_books(batch, lane, result, exc, done_ns)

    def _inline(self, batch: Batch, lane: Any, launching: bool) -> bool:
        """Whether the loop runs `batch` itself: a lone row by `_runs_inline`; a small batch of several rows by it
        and by InlineChoice, which measures the loop against the way the batch goes otherwise: the lane's thread,
        or launched (`launching`) for a model whose batches are all small (max_batch_size up to INLINE_ROWS). A
        model with larger batches launches its small ones too: under load they are its stragglers, and the loop
        would stop reading to run them (mlp at 64 HTTP clients: 0.96-0.98x the inf/s at 1.03x the CPU)."""
        rows = batch.size
        all_small = self.batcher.cfg.max_batch_size <= INLINE_ROWS
        small = rows > 1 and (all_small or not launching) and self._runs_inline(batch, lane)
        self._inline_choice.counted(rows, small)
        return self._inline_choice.inline if small else rows == 1 and self._runs_inline(batch, lane)

    def _runs_round(self, batch: Batch, lane: Any) -> bool:
        """A batch of every client of the model (the last two batches' clients were waited for, `_expected`, nothing
        is queued behind it and no other batch of it runs) of 2 to `_EXPECT_REQUESTS` rows, on a CPU lane, whose runs
        of that many rows took less than twice `inline_max_ns` whichever way they ran (`_round_ns`): the loop runs it
        itself, with both intra-op threads, having none of this model's requests to read or answer meanwhile.
        Launched, it would run on one pool thread while the loop waits (mlp: 1.26x the inf/s at 8 HTTP clients, p50
        0.80x; 1.20x at 16, 1.35x at 8 gRPC clients). Not for a model whose batches are all small (InlineChoice
        measures those)."""
        rows = batch.size
        if not (self._expected > 1 and 1 < rows <= _EXPECT_REQUESTS and self.batcher.cfg.max_batch_size > INLINE_ROWS) \
                or self.batcher.pending or self.in_flight > 1 or lane.on_gpu:  # (this batch is in flight already)
            return False
        ran_ns = self._round_ns.get((batch.entries[0].shape_key, rows))
        return ran_ns is not None and ran_ns < 2 * self._inline_max_ns

    def _runs_inline(self, batch: Batch, lane: Any) -> bool:
        """A batch of up to INLINE_ROWS rows on a CPU lane, whose run is expected to take less than `inline_max_ns`
        (`_inline_ns`), with no other lane of this model idle while requests wait: the loop thread runs it itself,
        which costs less than handing it to the lane thread and its answer back (two thread wake-ups and the GIL
        passed back and forth, ~0.1 ms of CPU and latency at one client; mlp's batches of 2-4 rows at 4 clients
        inline: 0.78x the server CPU over HTTP, 0.69x over gRPC, 0.74-0.75x the p50; issue #17). What waits could
        not have joined it (another shape, more rows than the batch may hold, or a model that does not batch), and
        the lane's threads already take the cores the loop would parse on meanwhile: a model without dynamic
        batching served 16 clients 1.25-1.4x faster this way than through its lane."""
        if batch.size > INLINE_ROWS or lane.on_gpu:
            return False
        if self.batcher.pending and any(not other.busy for other in self.lanes if other is not lane):
            return False  # another lane can take the next request while this one runs there
        return self._inline_ns(batch.entries[0].shape_key, batch.size) < self._inline_max_ns

    def _inline_ns(self, key: tuple, rows: int) -> int:
        """How long a batch of `rows` rows of shape `key` is expected to run: the moving average of such batches'
        runs (`_note_run`); for several rows not timed yet, one row's times half the rows, rounded
        up (a batch of 8 mlp rows ran in ~2.6 times one row's time: a guess on the safe side). Unknown: the bound."""
        lone_ns = self._lone_ns.get(key, self._inline_max_ns)
        if rows == 1:
            return lone_ns
        return self._rows_ns.get((key, rows), lone_ns * ((rows + 1) // 2))

    def _complete(self, batch: Batch, lane: Any, result: Any, exc: BaseException | None, elapsed_ns: int,
                  cpu_ns: int | None) -> None:
        """The lane's reply, on the loop: the scheduler first (the lane's next batch starts now and computes while
        this one's answers are written), then the batch's futures, and once their answers are out the window in which
        their clients are expected back (`_answered`)."""
        self.in_flight -= 1
        rows = self._last_rows = batch.size
        if self._inline_max_ns and rows <= INLINE_ROWS and not batch.launch:
            self._note_run(batch, elapsed_ns, cpu_ns)
        if self._inline_max_ns and 1 < rows <= _EXPECT_REQUESTS and exc is None:
            _average(self._round_ns, (batch.entries[0].shape_key, rows), elapsed_ns, _ROUND_SHAPES)
        if batch.launch is not None and exc is None:
            self._launch.ran(batch, batch.launch, elapsed_ns)
        expect = self._answered(batch, elapsed_ns)
        self._expected = self._expected + 1 if expect else 0
        self._scheduler.finished(self, elapsed_ns, lane)
        try:
            self._completion.resolve(batch, lane, result, exc)
        except Exception:  # never let bookkeeping stall the queue
            log.exception("batch completion failed for model %s", self.name)
        if expect:  # after the futures' callbacks, which write the answers
            self.batcher.loop.call_soon(self._answers_out, 1)
        if batch.traced:
            note_batch(batch, lane)
        if self.batcher.closed is not None and not self.in_flight and not self.batcher.pending:
            self._on_drained()

    def turn(self) -> asyncio.Future | None:
        """A response-cache hit's wait for the batches taken before it, where answers keep their order (None: none)."""
        return None if self._order is None else self._order.turn(self.batcher.loop)

    def _answered(self, batch: Batch, elapsed_ns: int) -> bool:
        """Before the next batch is formed: whether it waits for the clients of this one's requests. While these and
        the queued ones together make a small batch (INLINE_ROWS requests): a few closed-loop clients then send their
        next requests together, a little apart, and a batch of all of them costs less than a lone row run ahead of
        the rest (mlp over gRPC: 0.91x the server CPU at 8 clients). While they make up to `_EXPECT_REQUESTS` (and fit
        one batch) and fewer are queued than were answered: the other clients' requests did not all come back while
        the lane computed, so it would idle part of the time anyway, and batches alternating in halves cost more than
        one of all (mlp: 1.13x the inf/s at 0.79x the CPU at 8 HTTP clients). Or when the run took `_LONG_RUN_DELAYS`
        queue delays or more: a compute-bound model's larger batch saves more than the lane's wait costs (convnet:
        0.85x the CPU at 8 HTTP clients). Otherwise many clients keep the lane busy: theirs come back while it
        computes, and waiting would leave it idle (every batch's clients expected: 1.28x the CPU at 64 gRPC mlp
        clients). Returns whether it expects them (docs/DESIGN-NOTES.md: twentieth, thirty-first passes)."""
        requests = len(batch.entries)
        batcher = self.batcher
        window_ns = batcher.return_window_ns
        together = requests + batcher.pending
        expect = bool(window_ns) and (together <= INLINE_ROWS or elapsed_ns >= _LONG_RUN_DELAYS * window_ns
                                      or (together <= min(batcher.cfg.max_batch_size, _EXPECT_REQUESTS)
                                          and batcher.pending < requests))
        if expect:  # the window opens when the answers are out (`_answers_out`)
            batcher.answered(requests, None)
        else:
            batcher.answered(0, _now_ns())
        return expect

    def _answers_out(self, turns: int) -> None:
        """The window for the answered clients opens once their answers are written: the futures' callbacks write
        them in the loop's next turn, and gRPC's connections flush what they queued in the turn after."""
        if turns:
            self.batcher.loop.call_soon(self._answers_out, turns - 1)
        else:
            self.batcher.answers_out(_now_ns())

    def _note_run(self, batch: Batch, elapsed_ns: int, cpu_ns: int | None = None) -> None:
        """The moving average of a shape's run time at the batch's rows: what an inline run took, or what a lane run
        cost its thread in CPU (`cpu_ns`), where no average is yet or where it is less. Not a lane run's wall time:
        that also holds its waits for the GIL and for the thread to be woken, which inline runs do not have (a tree
        ensemble's lane runs of 1-2 rows, ~10 us of compute, read 0.13-0.35 ms; its small batches never ran inline,
        nor mlp's at 4 clients: inline since, 1.28x / 1.42x the inf/s at 0.87x / 0.73x the CPU over HTTP / gRPC;
        twenty-eighth pass). A lane run only lowers the average: its CPU also holds the hand-off's cold caches on the
        other core, and a shape near the bound must not stay on the lane because it runs slower there."""
        took_ns = elapsed_ns if batch.inline else cpu_ns
        if took_ns is None:  # a lane run not timed in CPU
            return
        rows = batch.size
        shape = batch.entries[0].shape_key  # a long sequence must not inherit a short one's run time
        times, key = (self._lone_ns, shape) if rows == 1 else (self._rows_ns, (shape, rows))
        _average(times, key, took_ns, _LONE_SHAPES, lower_only=not batch.inline)

    # -- unload ---------------------------------------------------------------------------------
    async def close(self, drain_timeout_s: float) -> None:
        """Refuse new requests, let queued and running ones finish for up to `drain_timeout_s`, fail the
        rest, leave the scheduler; sessions are released now or when the last running batch returns."""
        self.batcher.close(f"model '{self.name}' version {self.version} is unloading")
        self.batcher.purge_done()  # requests that already timed out or went away need no draining
        if self.batcher.pending or self.in_flight:
            try:
                await asyncio.wait_for(self._drained.wait(), drain_timeout_s)
            except asyncio.TimeoutError:
                pass
        failed = self.batcher.fail_all(Unavailable(f"model '{self.name}' was unloaded before the request ran"))
        if failed:
            log.warning("model %s: %d queued requests failed at unload", self.name, failed)
        self._scheduler.unregister(self)
        if self.in_flight == 0:
            self.release()
        else:  # a batch still running past the deadline: release its sessions when it returns
            self._release_when_idle = True

    def _on_drained(self) -> None:
        self._drained.set()
        if self._release_when_idle:
            self.release()

    def release(self) -> None:
        """Close the sessions (once); any thread."""
        if self._released:
            return
        self._released = True
        for runner in self.runners:
            runner.close()


def _average(times: dict, key: tuple, ns: int, most: int, lower_only: bool = False) -> None:
    """`times[key]` a quarter of the way to `ns` (with `lower_only`, only toward a lower `ns`); a new key starts at
    `ns`, in a dict cleared first when it holds `most` keys (shapes of dynamic dimensions are many)."""
    seen = times.get(key)
    if seen is None:
        if len(times) >= most:
            times.clear()
        times[key] = ns
    elif not lower_only or ns < seen:
        times[key] = seen + (ns - seen) // 4
