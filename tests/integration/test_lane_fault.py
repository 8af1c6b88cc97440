"""A model whose onnxruntime run fails on some inputs: the request fails cleanly, the lane recovers.

`gather`: INDICES (INT64 [B, 1]) index the rows of a constant table (10 x 4) with Gather; an index
out of range passes every check the server makes (datatype, shape) and fails inside
onnxruntime's run, in a lane thread.
"""
from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from gt_serve.execution.cpu_quota import usable_cpu_cores
from gt_serve.execution.lanes import plan_cpu_lanes
from gt_serve.testing import model_builders as mb
from tests.conftest import start_server

TIMEOUT_S = 30.0
ROWS = 10
TABLE = np.arange(ROWS * 4, dtype=np.float32).reshape(ROWS, 4)


def gather_model(path: Path) -> None:
    mb.gather(path, TABLE)


# the lane paths under test need models that go to their lanes: these Gathers are tiny (core/tiny_models.py), so
# every server but "tiny" turns that off; "tiny" runs every batch of them on the event loop. Its bound is far above
# their runs (~10 us), so that a probe run that waits for a core on a busy machine does not make them not tiny
LANES = {"plain": "io_binding: auto\n  tiny_run_us: 0", "io_binding": "io_binding: always\n  tiny_run_us: 0",
         "launched": "launch: always\n  tiny_run_us: 0", "tiny": "tiny_run_us: 50000"}


@pytest.fixture(scope="module", params=sorted(LANES))
def fault_server(request, tmp_path_factory):
    """The same server on the plain path, with every lane using IO binding (BoundBatchJob), with every batch of
    several requests launched into onnxruntime's pool from the event loop (Lane.launch), and with the models told
    tiny at load, every batch run on the event loop (Lane.run_here)."""
    root = tmp_path_factory.mktemp("fault_repo")
    gather_model(root / "gather" / "1" / "model.onnx")
    # CPU lanes: onnxruntime's CPU Gather checks its indices (a CUDA kernel need not)
    cpu = 'instance_group [ { kind: KIND_CPU } ]\n'
    (root / "gather" / "config.pbtxt").write_text('name: "gather"\nmax_batch_size: 8\n' + cpu)
    # the same model waiting (work-conserving batcher notwithstanding) for a preferred batch of 2:
    # two single-row requests sent together are run as one batch
    gather_model(root / "gather_batched" / "1" / "model.onnx")
    (root / "gather_batched" / "config.pbtxt").write_text(
        'name: "gather_batched"\nmax_batch_size: 8\n'
        'dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 10000000 }\n' + cpu)
    mb.simple_add_sub(root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(mb.SIMPLE_CONFIG)
    work = tmp_path_factory.mktemp("fault_srv")
    (work / "node.yaml").write_text(f"lanes:\n  {LANES[request.param]}\n")
    srv = start_server(root, work, "--config", str(work / "node.yaml"))
    srv.lanes = request.param
    try:  # a failed check here must not leave the server running
        assert ("model gather v1 is tiny" in srv.log()) == (request.param == "tiny"), srv.log()[-3000:]
        yield srv
    finally:
        srv.stop()


def post(srv, model: str, doc: dict) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://{srv.http_url}/v2/models/{model}/infer", data=json.dumps(doc).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def gather_doc(indices: list[int]) -> dict:
    return {"inputs": [{"name": "INDICES", "shape": [len(indices), 1], "datatype": "INT64", "data": indices}]}


def simple_doc() -> dict:
    return {"inputs": [{"name": n, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
                       for n in ("INPUT0", "INPUT1")]}


def assert_gather_ok(status: int, body: dict, indices: list[int]) -> None:
    assert status == 200, body
    (out,) = body["outputs"]
    assert out["shape"] == [len(indices), 1, 4]
    np.testing.assert_array_equal(np.array(out["data"], np.float32).reshape(-1, 4), TABLE[indices])


def stats(srv, model: str) -> dict:
    with urllib.request.urlopen(f"http://{srv.http_url}/v2/models/{model}/stats", timeout=TIMEOUT_S) as r:
        return json.loads(r.read())["model_stats"][0]


def test_failing_run_gets_a_clear_error_and_the_lane_recovers(fault_server):
    srv = fault_server
    before = stats(srv, "gather")["inference_stats"]
    assert_gather_ok(*post(srv, "gather", gather_doc([1, 2])), [1, 2])

    status, body = post(srv, "gather", gather_doc([3, 100]))
    assert status == 500, body
    message = body["error"]
    assert message.startswith("model 'gather': inference failed on lane cpu."), message
    assert "100" in message  # onnxruntime's reason, naming the bad index, reaches the client

    # the lanes live on: the same model, and another model, are served again, several times over
    for _ in range(4):
        assert_gather_ok(*post(srv, "gather", gather_doc([9, 0, 4])), [9, 0, 4])
        status, body = post(srv, "simple", simple_doc())
        assert status == 200 and body["outputs"][0]["data"] == [2 * i for i in range(16)]

    after = stats(srv, "gather")
    inference = after["inference_stats"]
    assert inference["fail"]["count"] - before["fail"]["count"] == 1
    assert inference["success"]["count"] - before["success"]["count"] == 5
    with urllib.request.urlopen(f"http://{srv.metrics_url}/metrics", timeout=TIMEOUT_S) as r:
        text = r.read().decode()
    count = float(inference["fail"]["count"])  # Triton's reason label: the model's run failed
    assert f'nv_inference_request_failure{{model="gather",reason="BACKEND",version="1"}} {count}' in text


def test_failing_run_over_grpc_is_internal_and_names_the_model(fault_server):
    client = grpcclient.InferenceServerClient(fault_server.grpc_url)
    try:
        def infer(indices):
            x = np.array(indices, np.int64).reshape(-1, 1)
            i = grpcclient.InferInput("INDICES", list(x.shape), "INT64")
            i.set_data_from_numpy(x)
            return client.infer("gather", [i], client_timeout=TIMEOUT_S)

        with pytest.raises(InferenceServerException) as info:
            infer([-11])  # below -rows: also out of range
        assert info.value.status() == "StatusCode.INTERNAL"
        assert "model 'gather': inference failed" in info.value.message()
        np.testing.assert_array_equal(infer([5]).as_numpy("OUTPUT"), TABLE[[5]].reshape(1, 1, 4))
        np.testing.assert_array_equal(infer([-1]).as_numpy("OUTPUT"), TABLE[[-1]].reshape(1, 1, 4))
    finally:
        client.close()


def test_every_lane_recovers_under_repeated_failures(fault_server):
    """Failures interleaved with good requests from several threads: every request is answered,
    bad ones with the error, good ones with the right rows; nothing hangs, the lanes serve after.

    Requests that arrive together may share a batch (the batcher merges them), and a batch that
    fails fails every request in it (see test_a_bad_request_does_not_fail_its_batch_mates), so a good
    request may carry a co-batched bad request's error: never any other one."""
    srv = fault_server
    barrier = threading.Barrier(8)

    def worker(i: int) -> list[tuple[bool, int]]:
        barrier.wait(TIMEOUT_S)
        seen = []
        for j in range(10):
            bad = (i + j) % 3 == 0
            indices = [ROWS + j] if bad else [j % ROWS]
            status, body = post(srv, "gather", gather_doc(indices))
            if status == 200:
                assert not bad, body
                assert_gather_ok(status, body, indices)
            else:
                assert status == 500, body
                assert body["error"].startswith("model 'gather': inference failed"), body
                assert "indices element out of data bounds" in body["error"], body
            seen.append((bad, status))
        return seen

    with ThreadPoolExecutor(8) as pool:
        results = [r for rs in pool.map(worker, range(8)) for r in rs]
    assert len(results) == 80
    assert all(status == 500 for bad, status in results if bad)
    assert any(status == 200 for bad, status in results if not bad)
    for _ in range(3):  # and every lane serves afterwards
        assert_gather_ok(*post(srv, "gather", gather_doc([7])), [7])


def test_a_bad_request_does_not_fail_its_batch_mates(fault_server):
    srv = fault_server
    cases = [[ROWS + 5], [1]]
    barrier = threading.Barrier(len(cases))

    def call(indices):
        barrier.wait(TIMEOUT_S)
        return post(srv, "gather_batched", gather_doc(indices))

    before = stats(srv, "gather_batched")["inference_stats"]
    with ThreadPoolExecutor(len(cases)) as pool:
        (bad_status, bad_body), (good_status, good_body) = list(pool.map(call, cases))
    assert bad_status == 500 and "inference failed" in bad_body["error"]
    assert_gather_ok(good_status, good_body, cases[1])
    after = stats(srv, "gather_batched")["inference_stats"]
    assert after["fail"]["count"] - before["fail"]["count"] == 1
    assert after["success"]["count"] - before["success"]["count"] == 1


def test_a_launched_batch_that_fails_is_rerun_request_by_request(fault_server):
    """With `lanes.launch: always`, batches of several requests were launched (the metric counts them), and the
    failed one was re-run one request at a time (the test above)."""
    if fault_server.lanes != "launched":
        pytest.skip("only the server that launches its batches")
    test_a_bad_request_does_not_fail_its_batch_mates(fault_server)
    with urllib.request.urlopen(f"http://{fault_server.metrics_url}/metrics", timeout=TIMEOUT_S) as r:
        text = r.read().decode()
    launched = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith("gt_lane_batches_launched_total{")]
    if plan_cpu_lanes(usable_cpu_cores().cores)[1] < 2:  # onnxruntime's RunAsync needs two intra-op threads: no launch
        assert launched and sum(launched) == 0
    else:
        assert launched and sum(launched) >= 1


def test_requests_of_a_model_that_does_not_batch_are_launched_and_each_gets_its_own_answer(fault_server):
    """`gather` has no dynamic_batching: each request runs alone. With the default lanes, those that queue behind
    others are launched into onnxruntime's pool, two at a time on a lane (ModelExecutor._launches_alone,
    Lane.spare); every one gets its own rows or its own error, and the launch metric counts them."""
    srv = fault_server
    if srv.lanes != "plain":
        pytest.skip("the server with the default lanes (tiny models off: gather is one)")

    def launched() -> float:
        with urllib.request.urlopen(f"http://{srv.metrics_url}/metrics", timeout=TIMEOUT_S) as r:
            return sum(float(line.rsplit(" ", 1)[1]) for line in r.read().decode().splitlines()
                       if line.startswith("gt_lane_batches_launched_total{"))

    before = launched()
    barrier = threading.Barrier(8)

    def worker(i: int) -> int:
        barrier.wait(TIMEOUT_S)
        for j in range(25):
            index = (i * 25 + j) % (ROWS + 1)  # ROWS is out of range: that request alone fails
            status, body = post(srv, "gather", gather_doc([index]))
            if index == ROWS:
                assert status == 500 and "indices element out of data bounds" in body["error"], body
            else:
                assert_gather_ok(status, body, [index])
        return j + 1

    with ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(worker, range(8))) == 200
    if plan_cpu_lanes(usable_cpu_cores().cores)[1] >= 2:  # onnxruntime's RunAsync needs two intra-op threads
        assert launched() > before
