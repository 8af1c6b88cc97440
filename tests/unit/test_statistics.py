"""ModelStats' failures by Triton's reason label (nv_inference_request_failure{reason}): the scheduler's refusals are
REJECTED, a failed run is BACKEND, anything else OTHER; every failure is also in the statistics' `fail`."""
from __future__ import annotations

import pytest

from gt_serve.core.statistics import ModelStats, failure_reason
from gt_serve.errors import (DeadlineExceeded, DeviceOutOfMemory, Internal, InvalidArgument, ModelNotFound, QueueFull,
                             Unavailable)


@pytest.mark.parametrize("error,reason", [
    (QueueFull("queue is full"), "REJECTED"), (DeadlineExceeded("timed out in the queue"), "REJECTED"),
    (Internal("inference failed on lane cpu.0"), "BACKEND"), (DeviceOutOfMemory("gpu:0", "m"), "BACKEND"),
    (InvalidArgument("unexpected shape"), "OTHER"), (Unavailable("not ready"), "OTHER"),
    (ModelNotFound("unknown model"), "OTHER"), (None, "OTHER"),
])
def test_each_failure_has_tritons_reason(error, reason):
    assert failure_reason(error) == reason
    stats = ModelStats("m", "1")
    stats.record_failure(1_000, error)
    assert stats.failures == {**dict.fromkeys(("REJECTED", "BACKEND", "OTHER"), 0), reason: 1}
    assert stats.as_dict()["inference_stats"]["fail"] == {"count": 1, "ns": 1_000}
