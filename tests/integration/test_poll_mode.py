"""Triton's `poll` model control mode against a real server: a model directory added to the repository
becomes READY, a changed config is served while requests in flight keep succeeding, a reload that fails
keeps the old version serving, a removed directory is unloaded. Every wait is a bounded loop of real
requests (count and time), never a sleep."""
from __future__ import annotations

import http.client
import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from gt_serve.testing import model_builders as mb
from tests.conftest import start_server

POLL_S = 0.2
WAIT_S = 60.0
MAX_PROBES = 50_000
ROW = [1.0, 2.0, 3.0, 4.0]


def _config(name: str, max_batch_size: int) -> str:
    return f'name: "{name}"\nmax_batch_size: {max_batch_size}\n'


def _write_model(root: Path, name: str, factor: float, max_batch_size: int = 8) -> None:
    """Each file written whole then renamed in, so a scan never sees half a file."""
    (root / name / "1").mkdir(parents=True, exist_ok=True)
    staged = root / f".{name}.model.onnx"
    mb.scale(staged, factor=factor, width=4)
    os.replace(staged, root / name / "1" / "model.onnx")
    _write_config(root, name, _config(name, max_batch_size))


def _write_config(root: Path, name: str, text: str) -> None:
    staged = root / f".{name}.config.pbtxt"
    staged.write_text(text)
    os.replace(staged, root / name / "config.pbtxt")


class Client:
    def __init__(self, srv) -> None:
        host, port = srv.http_url.split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=30)

    def call(self, method: str, path: str, doc=None) -> tuple[int, dict]:
        body = json.dumps(doc).encode() if doc is not None else None
        self.conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
        resp = self.conn.getresponse()
        data = resp.read(1 << 20)
        return resp.status, (json.loads(data) if data else {})

    def infer(self, name: str) -> tuple[int, dict]:
        return self.call("POST", f"/v2/models/{name}/infer",
                         {"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 4], "data": ROW}]})

    def state(self, name: str) -> str | None:
        status, rows = self.call("POST", "/v2/repository/index", {})
        assert status == 200, rows
        states = {r["state"] for r in rows if r["name"] == name}
        return "READY" if "READY" in states else (states.pop() if states else None)

    def close(self) -> None:
        self.conn.close()


def wait_until(what: str, predicate) -> None:
    deadline_s = time.monotonic() + WAIT_S
    for _ in range(MAX_PROBES):
        if predicate():
            return
        if time.monotonic() > deadline_s:
            break
    pytest.fail(f"not within {WAIT_S} s: {what}")


@pytest.fixture(scope="module")
def poll_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("poll_repo")
    _write_model(repo, "first", factor=2.0)
    srv = start_server(repo, tmp_path_factory.mktemp("poll_srv"), "--model-control-mode", "poll",
                       "--repository-poll-secs", str(POLL_S))
    client = Client(srv)
    yield srv, repo, client
    client.close()
    srv.stop()


def test_start_up_models_load_and_load_api_is_refused(poll_server):
    srv, _, client = poll_server
    assert client.state("first") == "READY"
    status, body = client.infer("first")
    assert status == 200 and body["outputs"][0]["data"] == [2 * x for x in ROW]
    status, body = client.call("POST", "/v2/repository/models/first/load", {})
    assert status >= 400 and "not allowed" in body["error"]


def test_added_model_becomes_ready_then_removed_is_unloaded(poll_server):
    srv, repo, client = poll_server
    assert client.state("added") is None
    _write_model(repo, "added", factor=5.0)
    wait_until("'added' READY", lambda: client.state("added") == "READY")
    status, body = client.infer("added")
    assert status == 200 and body["outputs"][0]["data"] == [5 * x for x in ROW]
    shutil.rmtree(repo / "added")
    wait_until("'added' gone from the index", lambda: client.state("added") is None)
    status, body = client.infer("added")
    assert status in (400, 404) and "added" in body["error"]
    assert client.infer("first")[0] == 200  # the others serve on


def _hammer(srv, name: str, stop: threading.Event, under_way: threading.Event, seen: dict, failures: list) -> None:
    client = Client(srv)
    try:
        for n in range(MAX_PROBES):
            if stop.is_set():
                return
            status, body = client.infer(name)
            if status != 200:
                failures.append((status, body))
                return
            first = body["outputs"][0]["data"][0]
            seen[first] = seen.get(first, 0) + 1
            if n >= 10:
                under_way.set()
    finally:
        under_way.set()  # a worker that ended early wakes the test, which then finds why
        client.close()


def test_changed_model_is_reloaded_while_requests_in_flight_succeed(poll_server):
    srv, repo, client = poll_server
    _write_model(repo, "changing", factor=2.0, max_batch_size=8)
    wait_until("'changing' READY", lambda: client.state("changing") == "READY")
    stop, under_way, failures = threading.Event(), threading.Event(), []
    seen: list[dict] = [{}, {}]
    workers = [threading.Thread(target=_hammer, args=(srv, "changing", stop, under_way, seen[i], failures))
               for i in range(2)]
    for w in workers:
        w.start()
    try:
        assert under_way.wait(WAIT_S) and not failures, failures
        _write_model(repo, "changing", factor=3.0, max_batch_size=16)
        wait_until("the new config served",
                   lambda: client.call("GET", "/v2/models/changing/config")[1].get("max_batch_size") == 16)
        wait_until("the new model answering", lambda: client.infer("changing")[1]["outputs"][0]["data"][0] == 3.0)
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=WAIT_S)
    assert not any(w.is_alive() for w in workers)
    assert failures == []  # every request during the reload succeeded
    merged = {k: sum(s.get(k, 0) for s in seen) for k in (2.0, 3.0)}
    assert merged[2.0] > 0 and sum(merged.values()) == sum(sum(s.values()) for s in seen), seen


def test_failed_reload_keeps_the_old_version_serving(poll_server):
    srv, repo, client = poll_server
    _write_model(repo, "fragile", factor=2.0)
    wait_until("'fragile' READY", lambda: client.state("fragile") == "READY")
    _write_config(repo, "fragile", 'name: "fragile"\nmax_batch_size: this is not a number\n')
    # a model added after the bad config: once it is READY, a poll has tried 'fragile' (names in order)
    _write_model(repo, "zz_marker", factor=1.0)
    wait_until("'zz_marker' READY", lambda: client.state("zz_marker") == "READY")
    assert "fragile" in srv.log() and "repository poll" in srv.log()
    assert client.state("fragile") == "READY"
    status, body = client.infer("fragile")
    assert status == 200 and body["outputs"][0]["data"] == [2 * x for x in ROW]
    # fixed: loaded again on the next poll
    _write_config(repo, "fragile", _config("fragile", 4))
    wait_until("the fixed config served",
               lambda: client.call("GET", "/v2/models/fragile/config")[1].get("max_batch_size") == 4)
