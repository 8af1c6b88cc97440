"""The floor under any Python front end built like gt-serve's HTTP one: uvloop + httptools answering perf_analyzer's
mlp requests with a canned answer, no batching, no model, no checks (issue #17: how much of gt-serve's event-loop CPU
per request is the transport itself).

A first short gt-serve start records the real answers to what perf_analyzer asks (server and model metadata, config,
statistics, one binary infer answer); then a bare asyncio protocol serves them: httptools parses each request
(on_url, on_body and on_message_complete only: llhttp frames the body by itself), and every infer is answered with
the recorded bytes. Then gt-serve itself, on the same points, in the same run. Prints per point the inf/s, p50 and
the server's CPU per inference it counted (its process tree, from /proc; perf_sweep.server_point), and
gt-serve's ratio to the floor.

    python bench/transport_floor.py [--concurrency 1,16,64] [--interval-ms 2000]

perf_analyzer as in bench/perf_sweep.py's docstring.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import perf_sweep  # noqa: E402
import sweep_servers  # noqa: E402
from common import RaplMeter, emit  # noqa: E402

MODEL = "mlp"
GETS = ("/v2", "/v2/health/live", "/v2/health/ready", f"/v2/models/{MODEL}", f"/v2/models/{MODEL}/ready",
        f"/v2/models/{MODEL}/config", f"/v2/models/{MODEL}/versions/1", f"/v2/models/{MODEL}/versions/1/config")


def record(http_port: int) -> dict[str, bytes]:
    """What gt-serve answers to perf_analyzer's requests, whole HTTP answers (status line, headers, body)."""
    from loop_cost import http_request

    answers = {}
    for path in GETS:
        with sweep_servers.LOOPBACK.open(f"http://127.0.0.1:{http_port}{path}", timeout=10) as r:
            answers[path] = _answer(r.read(), {"Content-Type": "application/json"})
    template = http_request(MODEL, [256])  # perf_analyzer's binary request (bench/loop_cost.py)
    req = urllib.request.Request(f"http://127.0.0.1:{http_port}{template.path}", data=template.body,
                                 headers=template.headers)
    with sweep_servers.LOOPBACK.open(req, timeout=10) as r:
        answers["infer"] = _answer(r.read(), {"Content-Type": "application/octet-stream",
                                              "Inference-Header-Content-Length":
                                              r.headers["Inference-Header-Content-Length"]})
    with sweep_servers.LOOPBACK.open(f"http://127.0.0.1:{http_port}/v2/models/{MODEL}/stats", timeout=10) as r:
        answers["stats"] = r.read()  # after one inference (perf_analyzer wants a model that has run); the body alone
    return answers


def _answer(body: bytes, headers: dict[str, str], status: str = "200 OK") -> bytes:
    lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return f"HTTP/1.1 {status}\r\n{lines}Content-Length: {len(body)}\r\n\r\n".encode("latin-1") + body


def serve(port_file: str, answers: dict[str, bytes]) -> None:
    """The floor server (run in a child process): one connection protocol, canned answers."""
    import httptools
    import uvloop

    infer, missing = answers["infer"], _answer(b'{"error":"not found"}', {"Content-Type": "application/json"},
                                        "404 Not Found")
    served = [0]  # infer requests answered, in the statistics it answers
    recorded = json.loads(answers["stats"])

    def stats(n: int) -> bytes:
        for model in recorded["model_stats"]:
            model["inference_count"] = model["execution_count"] = n
            model["inference_stats"]["success"]["count"] = n
        return _answer(json.dumps(recorded).encode(), {"Content-Type": "application/json"})

    class Floor(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport, self.parser, self.url = transport, httptools.HttpRequestParser(self), b""

        def data_received(self, data):
            self.parser.feed_data(data)

        def on_url(self, url):
            self.url += url

        def on_message_complete(self):
            url, self.url = self.url.decode("latin-1"), b""
            if url.endswith("/infer"):
                served[0] += 1
                self.transport.write(infer)
            elif url.endswith("/stats"):  # perf_analyzer reads the counts before and after each window
                self.transport.write(stats(served[0]))
            else:
                if url not in answers:
                    print("floor: no recorded answer for", url, file=sys.stderr, flush=True)
                self.transport.write(answers.get(url, missing))

    async def main():
        server = await asyncio.get_running_loop().create_server(Floor, "127.0.0.1", 0)
        Path(port_file).write_text(str(server.sockets[0].getsockname()[1]))
        await asyncio.Event().wait()

    uvloop.run(main())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--concurrency", default="1,16,64")
    p.add_argument("--interval-ms", type=int, default=2000)
    p.add_argument("--perf-analyzer")
    a = p.parse_args()
    from gt_serve.testing.launcher import launch

    pa = perf_sweep.perf_analyzer_path(a.perf_analyzer)
    tmp = Path(tempfile.mkdtemp(prefix="gt_floor_"))
    repo = perf_sweep.build_repo(tmp / "repo", [MODEL], triton=False)
    server = launch(["--model-repository", str(repo)], workdir=tmp)
    try:
        answers = record(server.ports["http"])
        with floor_server(answers, tmp) as (pid, port):
            floor_points = points(pa, sweep_servers.Served("floor", pid, port, 0), a, tmp)
        with sweep_servers.gt_serve(server) as served:
            gt_points = points(pa, served, a, tmp)
    finally:
        server.stop()
    for floor, gt in zip(floor_points, gt_points):
        emit(floor)
        emit({**gt, "cpu_per_floor": round(gt["server_cpu_ms_per_inference"] / floor["server_cpu_ms_per_inference"],
                                           2)})


def points(pa: str, srv: sweep_servers.Served, a: argparse.Namespace, tmp: Path) -> list[dict]:
    """perf_sweep's points over HTTP, the server's CPU per inference it counted. `-x 1`: without it perf_analyzer found
    no version in the floor's recorded statistics ("failed to find the requested model version"); both servers get
    it."""
    return [perf_sweep.server_point(pa, srv, "http", MODEL, c, a.interval_ms, RaplMeter(), tmp, extra=["-x", "1"])
            for c in _levels(a)]


@contextlib.contextmanager
def floor_server(answers: dict[str, bytes], tmp: Path) -> Iterator[tuple[int, int]]:
    """The floor server in a child process: (its pid, its port)."""
    port_file = tmp / f"floor-{time.monotonic_ns()}.port"
    payload = json.dumps({k: v.decode("latin-1") for k, v in answers.items()})
    code = (f"import sys, json; sys.path.insert(0, {str(HERE)!r}); import transport_floor as t; "
            f"t.serve({str(port_file)!r}, {{k: v.encode('latin-1') for k, v in json.loads(sys.stdin.read()).items()}})")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, text=True)
    proc.stdin.write(payload)
    proc.stdin.close()
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the floor server did not start")
            time.sleep(0.05)
        yield proc.pid, int(port_file.read_text())
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _levels(a: argparse.Namespace) -> list[int]:
    return [int(c) for c in a.concurrency.split(",") if c]


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
