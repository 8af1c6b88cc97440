"""Pure batch formation: a function of the queue snapshot, the clock and the lanes' state.

Work-conserving: when a lane is idle, dispatch at once (up to max_batch_size) instead of waiting
out the delay; wait only while every lane is busy, or, within the oldest request's delay budget,
while a preferred size is within reach, or, within the delay from the later of the oldest request's
arrival and the answer that freed the lane, while the clients of requests just answered are expected
back (`returning`: closed-loop clients send their next request a few tens of microseconds after their
answer; a batch formed without them would run a lone row first and the rest after it). `answered_s` is
when those answers were written (Batcher: infinite while they are being written, so the wait has no end
yet: ModelExecutor._answers_out opens it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True, slots=True)
class BatchConfig:
    max_batch_size: int = 0  # 0 = the model does not batch: one request per execution
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_s: float = 0.0
    preserve_ordering: bool = False  # answers in the order their requests were taken (core/answer_order.py)


@dataclass(frozen=True, slots=True)
class BatchDecision:
    take: int  # number of queued requests to dispatch now (0 = wait)
    wait_s: float  # when take == 0: re-evaluate after this long (inf = on the next event)


WAIT_FOR_EVENT = BatchDecision(0, float("inf"))


def form_batch(
    pending_sizes: Sequence[int],
    oldest_arrival_s: float,
    now_s: float,
    idle_lanes: int,
    cfg: BatchConfig,
    returning: int = 0,
    answered_s: float = 0.0,
) -> BatchDecision:
    """Decide how many of the queued requests (their batch sizes in queue order) to dispatch now. `returning`: how
    many clients answered (at `answered_s`) just before the first of these came, or while it waited, are expected
    back. A request larger than max_batch_size never reaches the queue (rejected at submit)."""
    if not pending_sizes or idle_lanes <= 0:
        return WAIT_FOR_EVENT
    if cfg.max_batch_size <= 0:
        return BatchDecision(1, 0.0)
    take, total = _fitting_prefix(pending_sizes, cfg.max_batch_size)
    if take == 0:  # defensive: an oversized head request goes alone
        return BatchDecision(1, 0.0)
    if total >= cfg.max_batch_size or take < len(pending_sizes):
        return BatchDecision(take, 0.0)  # full batch
    preferred = cfg.preferred_batch_sizes
    if (preferred and total in preferred) or cfg.max_queue_delay_s <= 0.0:
        return BatchDecision(take, 0.0)
    if returning > 0:  # they join this batch, rather than wait for it to run
        # the delay counts from when a lane could first have run it: requests that waited behind a busy lane are
        # held for the answered clients up to the delay after that lane's answer (a few clients otherwise settle
        # into alternating halves: convnet at 4 clients ran batches of 2 while 4 rows cost 0.78x two batches of 2)
        left_s = cfg.max_queue_delay_s - (now_s - max(oldest_arrival_s, answered_s))
        return BatchDecision(0, left_s) if left_s > 0.0 else BatchDecision(take, 0.0)
    waited_s = now_s - oldest_arrival_s
    if waited_s >= cfg.max_queue_delay_s:
        return BatchDecision(take, 0.0)
    # a lane is idle: work-conserving unless a preferred size is near (strictly larger, within reach)
    if preferred and any(p > total for p in preferred) and _near_preferred(total, preferred):
        return BatchDecision(0, cfg.max_queue_delay_s - waited_s)
    return BatchDecision(take, 0.0)


def _fitting_prefix(pending_sizes: Sequence[int], max_batch_size: int) -> tuple[int, int]:
    """The longest queue prefix that fits in one batch: its requests and their rows."""
    total = 0
    take = 0
    for size in pending_sizes:
        if total + size > max_batch_size:
            break
        total += size
        take += 1
    return take, total


def _near_preferred(total: int, preferred: tuple[int, ...]) -> bool:
    """A preferred size is 'near' when we already hold at least half of the next larger one."""
    target = min(p for p in preferred if p > total)
    return total * 2 >= target
