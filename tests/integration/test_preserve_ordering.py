"""The config's `preserve_ordering` (core/answer_order.py) against a real gt-serve process on two CPU lanes and
tritonclient's gRPC stream: long and short requests sent on one stream come back in the order sent, cache hits
included, where the same model without it answers the short ones first; a sequence model's `oldest` strategy takes
it too."""
from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from gt_serve.testing import model_builders as mb
from tests.conftest import start_server

LONG, SHORT = 1 << 19, 4  # row widths: a run of tens of milliseconds, and one of microseconds
ROUNDS = 32
CONFIG = """max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
dynamic_batching { %s }
instance_group [ { count: 2 kind: KIND_CPU } ]
response_cache { enable: true }
"""
SEQUENCE = mb.ACCUMULATOR_CONFIG.replace("oldest {", "oldest { preserve_ordering: true") % (60_000_000, "TYPE_UINT64")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo_ordering")
    for name, block in (("ordered", "preserve_ordering: true"), ("unordered", "")):
        mb.sine_sum(repo / name / "1" / "model.onnx", rounds=ROUNDS)
        (repo / name / "config.pbtxt").write_text(CONFIG % block)
    mb.accumulator(repo / "acc_ordered" / "1" / "model.onnx")
    (repo / "acc_ordered" / "config.pbtxt").write_text(SEQUENCE + "instance_group [ { count: 2 kind: KIND_CPU } ]\n")
    work = tmp_path_factory.mktemp("srv_ordering")
    (work / "node.yaml").write_text("lanes:\n  cpu_lanes: 2\n")
    srv = start_server(repo, work, "--config", str(work / "node.yaml"), "--cache-config", "local,size=1048576")
    try:
        yield srv
    finally:
        srv.stop()


def _row(width: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (1, width)).astype(np.float32)


def _expected(row: np.ndarray) -> float:
    out = row.astype(np.float64)
    for _ in range(ROUNDS):
        out = np.sin(out)
    return float(out.sum())


def _stream(server, model: str, rows: list[np.ndarray], extra: dict | None = None) -> list[tuple[str, float]]:
    """Every row sent on one gRPC stream before any answer (request ids "0", "1", ...; `extra`: row index -> more
    keyword arguments of async_stream_infer): (id, first value of OUTPUT) as answered."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for i, row in enumerate(rows):
            tensor = grpcclient.InferInput("INPUT", list(row.shape), "FP32")
            tensor.set_data_from_numpy(row)
            client.async_stream_infer(model, [tensor], request_id=str(i), **(extra or {}).get(i, {}))
        got = []
        for _ in rows:
            result, error = answers.get(timeout=60)
            assert error is None, error
            got.append((result.get_response().id, float(result.as_numpy("OUTPUT").reshape(-1)[0])))
        return got
    finally:
        client.stop_stream()


def test_long_and_short_requests_on_one_stream_are_answered_in_the_order_sent(server):
    widths = [LONG, SHORT, SHORT, LONG, SHORT, SHORT, SHORT]
    rows = [_row(width, seed) for seed, width in enumerate(widths)]
    got = _stream(server, "ordered", rows)
    assert [i for i, _ in got] == [str(i) for i in range(len(rows))]
    for (i, value), row in zip(got, rows):
        assert value == pytest.approx(_expected(row), rel=1e-3, abs=1e-3), i
    # the same model and requests without preserve_ordering: a short request, run on the other lane while a long one
    # runs, is answered before it (the case the option is for)
    plain = _stream(server, "unordered", rows)
    assert sorted(i for i, _ in plain) == [str(i) for i in range(len(rows))]
    assert [i for i, _ in plain] != [str(i) for i in range(len(rows))]


def test_a_cached_answer_keeps_its_place(server):
    """A request answered before is answered from the cache after the long request taken before it (or, while that
    one is still queued, run again behind it: tests/unit/test_answer_order.py has both ways)."""
    hit = _row(SHORT, 100)
    assert _stream(server, "ordered", [hit])[0][0] == "0"  # cached now
    got = _stream(server, "ordered", [_row(LONG, 101), hit, _row(SHORT, 102)])
    assert [i for i, _ in got] == ["0", "1", "2"]
    assert got[1][1] == pytest.approx(_expected(hit), rel=1e-3, abs=1e-3)


def test_a_sequence_models_oldest_strategy_preserves_the_order_too(server):
    steps, ids = 4, (21, 22, 23)
    rows, extra = [], {}
    for step in range(steps):
        for sid in ids:
            extra[len(rows)] = dict(sequence_id=sid, sequence_start=step == 0, sequence_end=step == steps - 1)
            rows.append(np.full((1, 4), sid * 10 + step, dtype=np.float32))
    got = _stream(server, "acc_ordered", rows, extra)
    assert [i for i, _ in got] == [str(i) for i in range(len(rows))]
    sums = {sid: np.cumsum([sid * 10 + step for step in range(steps)]) for sid in ids}
    assert [v for _, v in got] == [float(sums[sid][step]) for step in range(steps) for sid in ids]
