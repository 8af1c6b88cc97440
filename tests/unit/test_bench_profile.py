"""bench/profile_point.py's reading of py-spy's raw output: waiting threads apart, components by the
innermost frame that names one."""
from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import profile_point as pp  # noqa: E402

RAW = """\
thread_run (libpython3.11.so);Lane._work (gt_serve/execution/lanes.py:52);_queue_SimpleQueue_get (_queuemodule.c:1);PyThread_acquire_lock_timed (libpython3.11.so);0x7f00 (libc.so.6) 40
run (gt_serve/app.py:375);uv_run (core.c:464);uv__io_poll (linux.c:1452);epoll_pwait (libc.so.6) 10
Lane._work (gt_serve/execution/lanes.py:52);OnnxRunner.run (gt_serve/backends/onnx_runner.py:119);Session.run (onnxruntime/capi/onnxruntime_inference_collection.py:220);0x7f11 (onnxruntime/capi/onnxruntime_pybind11_state.so) 60
run (gt_serve/app.py:375);uv__read (stream.c:106);read (libc.so.6) 20
run (gt_serve/app.py:375);_Connection._run (gt_serve/protocol/http_server.py:277) 15
worker (loadgen.py:119);InferResult.__init__ (tritonclient/http/_infer_result.py:53) 5
this line is not a sample
"""


def test_summary_separates_waits_and_names_components(tmp_path):
    raw = tmp_path / "server.txt"
    raw.write_text(RAW)
    s = pp.summarize(raw)
    assert s["waiting_samples"] == 50  # the queue wait and the epoll wait
    assert s["busy_samples"] == 100
    shares = s["share_by_component"]
    assert shares["onnxruntime compute"] == 0.6
    assert shares["kernel and libc (socket, epoll, futex, memcpy)"] == 0.2
    assert shares["gt_serve server code"] == 0.15
    assert shares["tritonclient"] == 0.05
    assert abs(sum(shares.values()) - 1.0) < 1e-9
    assert s["top_innermost_frames"][0][1] == 0.6


def test_innermost_component_wins():
    # numpy called from our code is numpy's time, not ours
    stack = ["run (gt_serve/app.py:1)", "pack (gt_serve/execution/batch_job.py:55)", "concatenate (numpy/core/x.py:1)"]
    assert pp.component(stack) == "numpy"
    assert pp.component(["something (elsewhere.py:1)"]) == "other"
    assert not pp.waiting(stack)
