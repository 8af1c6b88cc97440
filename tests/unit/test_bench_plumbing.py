"""bench/transport_plumbing.py measures what it says: every request it feeds a real connection reaches the stub
express lane and is answered (HTTP: after the first, unparsed, from its known head), and `--ref` times another
checkout imported under its own package name beside this one (issue #17, tenth pass)."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import transport_plumbing as tp  # noqa: E402


def _feed(loop, conn, chunks) -> None:
    async def go() -> None:
        for chunk in chunks:
            conn.data_received(chunk)
            await asyncio.sleep(0)  # the answers' writes and replies run

    loop.run_until_complete(go())


def test_every_grpc_call_reaches_the_stub_and_is_answered():
    loop = asyncio.new_event_loop()
    try:
        conn, chunks = tp.grpc_side("gt_serve", loop, 40, 1024)
        served = []
        stub = conn._server
        original = stub.serve
        stub.serve = lambda data, deadline, reply: served.append(len(data)) or original(data, deadline, reply)
        writes = []
        conn._transport.write = writes.append
        _feed(loop, conn, chunks)
        assert len(served) == 40 and set(served) == {len(tp._MESSAGE_HEAD) + 1024}
        assert not conn.streams  # every call answered and closed
        assert sum(map(len, writes)) > 40 * (9 * 3 + 5 + sum(map(len, tp._ANSWER)))  # three frames an answer
    finally:
        loop.close()


def test_every_http_request_after_the_first_is_served_from_its_known_head():
    loop = asyncio.new_event_loop()
    try:
        conn, chunks = tp.http_side("gt_serve", loop, 30, 4096)
        writes = []
        conn._transport.write = writes.append
        _feed(loop, conn, chunks)
        assert conn._server.known_heads_served == 29  # the first is parsed and teaches its head
        assert len(writes) == 30 and all(w.startswith(b"HTTP/1.1 200 OK\r\n") for w in writes)
    finally:
        loop.close()


def test_a_reference_checkout_is_timed_beside_this_one():
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "transport_plumbing.py"), "--transport", "http",
                           "--requests", "400", "--ref", str(ROOT)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [line["checkout"] for line in lines] == ["this", str(ROOT)]
    assert all(line["us_per_request_fastest_quarter"] > 0 for line in lines)
    assert "this / ref:" in done.stdout
