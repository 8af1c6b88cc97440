"""bench/sequence_sweep.py: the two servers' configs of its stateful model, the step model itself, and its table
(the perf_analyzer runs themselves are a benchmark, not a test)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

from gt_serve.backends.onnx_runner import describe_model
from gt_serve.core.model_config import complete_config, parse_pbtxt, spec_from_config

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import sequence_sweep as ss  # noqa: E402


def test_the_repositories_hold_the_step_model_under_each_servers_config(tmp_path):
    gt = ss.build_repo(tmp_path / "gt", triton=False)
    triton = ss.build_repo(tmp_path / "triton", triton=True)
    assert (triton / "rnn" / "1" / "model.py").read_text() == (BENCH / "triton_sequence_model.py").read_text()
    path = gt / "rnn" / "1" / "model.onnx"
    inputs, outputs = describe_model(str(path))
    cfg = parse_pbtxt((gt / "rnn" / "config.pbtxt").read_text(), "gt")
    spec = spec_from_config(complete_config(cfg, "rnn", inputs, outputs, True), gt / "rnn")
    assert spec.input_order == ("INPUT",) and spec.output_order == ("OUTPUT",)
    assert [c.name for c in spec.sequence.controls] == ["START"] and spec.sequence.hidden_outputs == ("STATE_OUT",)
    tcfg = parse_pbtxt((triton / "rnn" / "config.pbtxt").read_text(), "triton")
    assert [c.name for c in tcfg.sequence_batching.control_input] == ["START", "END", "CORRID"]
    assert tcfg.parameters["state_width"].string_value == str(ss.HIDDEN)


def test_the_step_model_carries_its_state_and_a_start_forgets_it(tmp_path):
    path = ss.build_repo(tmp_path, triton=False) / "rnn" / "1" / "model.onnx"
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((1, ss.FEATURES)).astype(np.float32)
    state = np.full((1, ss.HIDDEN), 0.5, dtype=np.float32)

    def step(held, start):
        return session.run(None, {"INPUT": x, "STATE_IN": held, "START": np.array([[start]], dtype=np.float32)})

    fresh = step(np.zeros_like(state), 0.0)
    np.testing.assert_allclose(step(state, 1.0)[1], fresh[1], rtol=1e-6)  # START: the held state is not read
    assert not np.allclose(step(state, 0.0)[1], fresh[1])


def test_table_gives_ratios_to_raw_and_to_triton_where_it_ran():
    raw = {"raw_b1_cpu_ms_per_inference": 0.05, "raw_b32_inferences_per_s": 100000.0}

    def p(server, protocol, inf_s, cpu_ms):
        return {"server": server, "protocol": protocol, "concurrency": 8, "inferences_per_s": inf_s, "p50_ms": 1.0,
                "server_cpu_ms_per_inference": cpu_ms}

    points = [p("gt_serve", "http", 5000.0, 0.15), p("triton", "http", 2500.0, 0.5), p("gt_serve", "grpc", 4000.0, 0.2),
              {"server": "gt_serve", "protocol": "grpc", "concurrency": 64, "error": "perf_analyzer exited 1: boom"}]
    rows = ss.table(points, raw).splitlines()
    assert rows[0].startswith("raw onnxruntime: batch 1 0.0500 ms")
    http, grpc, failed = rows[3], rows[4], rows[5]
    assert http.split()[5:7] == ["3.00", "0.05"] and http.split()[-2:] == ["2.00", "0.30"]
    assert len(grpc.split()) == 7 and "boom" in failed
