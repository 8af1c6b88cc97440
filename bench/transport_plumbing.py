"""The front ends' own per-request cost, apart from everything else: a real connection object of the HTTP server or
of the native gRPC transport, fed the bytes perf_analyzer's requests come as, with a stub express lane that answers
each at once (no model, no batching, no socket). What is left is the transport's plumbing: parsing, frames, flow
control, streams, the answer's framing (issue #17, tenth pass).

    python bench/transport_plumbing.py [--transport grpc|http] [--requests 40000] [--tensor-bytes 1024]
                                       [--ref ../other-checkout]

With `--ref`, the other checkout's `gt_serve` is imported too, as `gt_serve_ref` (a copy whose absolute imports are
renamed), and the two are timed in alternating slices in this one process: on this shared machine separate runs of
one micro-benchmark drift by ±30 %, slices side by side by a few percent. Prints one JSON line per checkout (the
fastest quarter of its slices, and their median: µs per request) and the ratio.
"""
from __future__ import annotations

import argparse
import asyncio
import atexit
import importlib
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import hpack  # noqa: E402

from common import emit  # noqa: E402

_SERVICE = "/inference.GRPCInferenceService/"
_MESSAGE_HEAD = b"\x0a\x03mlp" + b"\x05" * 76  # about the fields of mlp's ModelInfer request before its tensor
_ANSWER = [b"\x0a\x03mlp", b"\x01" * 40]
_PER_CHUNK = 4  # requests per received chunk (gRPC clients multiplex calls on one connection)


class _Transport:
    def write(self, data) -> None:
        pass

    def writelines(self, pieces) -> None:
        pass

    def set_write_buffer_limits(self, high) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class _GrpcStubServer:
    """What GrpcConnection reads of NativeGrpcServer, with ModelInfer's express lane answering at once."""

    def __init__(self, pkg: str, loop) -> None:
        h2 = importlib.import_module(pkg + ".protocol.h2")
        self.loop, self.limits, self.connections, self.closing = loop, h2.H2Limits(), set(), False
        self.methods = {_SERVICE + "ModelInfer": (None, bytes, False, self)}

    def serve(self, data, deadline: bool, reply) -> bool:
        reply(list(_ANSWER))
        return True

    def authorized(self, path: str, metadata: tuple) -> bool:
        return True

    def stream_closed(self) -> None:
        pass


def grpc_side(pkg: str, loop, requests: int, tensor_bytes: int):
    """(a connection past its handshake, the chunks of `requests` unary calls as grpc-core sends them)."""
    native = importlib.import_module(pkg + ".protocol.grpc_native")
    f = importlib.import_module(pkg + ".protocol.h2.frames")
    conn = native.GrpcConnection(_GrpcStubServer(pkg, loop))
    conn.connection_made(_Transport())
    conn.data_received(f.PREFACE + f.frame(f.SETTINGS, 0, 0, b""))
    encoder = hpack.Encoder()
    headers = [(":method", "POST"), (":scheme", "http"), (":path", _SERVICE + "ModelInfer"),
               (":authority", "127.0.0.1:8001"), ("te", "trailers"), ("content-type", "application/grpc"),
               ("user-agent", "grpc-c++/1.48"), ("grpc-accept-encoding", "identity,deflate,gzip")]
    message = _MESSAGE_HEAD + b"\x07" * tensor_bytes
    calls = []
    for i in range(requests):
        sid = 2 * i + 1  # HEADERS, DATA with the message, and the two WINDOW_UPDATEs grpc-core sends per answer
        calls.append(f.frame(f.HEADERS, f.END_HEADERS, sid, encoder.encode(headers))
                     + f.frame(f.DATA, f.END_STREAM, sid, b"\x00" + f.u32(len(message)) + message)
                     + f.frame(f.WINDOW_UPDATE, 0, 0, f.u32(60)) + f.frame(f.WINDOW_UPDATE, 0, sid, f.u32(60)))
    return conn, [b"".join(calls[i:i + _PER_CHUNK]) for i in range(0, requests, _PER_CHUNK)]


def http_side(pkg: str, loop, requests: int, tensor_bytes: int):
    """(a connection, one chunk per request as perf_analyzer's libcurl sends it); its express lane answers each on
    the next turn of the loop, as a batch's completion would."""
    server_mod = importlib.import_module(pkg + ".protocol.http_server")
    messages = importlib.import_module(pkg + ".protocol.http_messages")
    answer = messages.Response(200, _ANSWER, {"Content-Type": "application/octet-stream"}, {})

    def express(req, reply):
        return loop.call_soon(reply, answer)

    server = server_mod.HttpServer(None, express=express)
    server._loop = loop
    conn = server_mod._Connection(server)
    conn.connection_made(_Transport())
    json_part = (b'{"inputs":[{"name":"INPUT0","shape":[1,256],"datatype":"FP32",'
                 b'"parameters":{"binary_data_size":%d}}]}' % tensor_bytes)
    body = json_part + b"\x07" * tensor_bytes
    head = (f"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUser-Agent: libcurl-agent/1.0\r\n"
            f"Accept: */*\r\nContent-Type: application/octet-stream\r\nInference-Header-Content-Length: "
            f"{len(json_part)}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    return conn, [head + body] * requests


def import_ref(root: Path) -> str:
    """`root`'s gt_serve, copied as gt_serve_ref (absolute imports renamed) onto sys.path: its package name."""
    dest = Path(tempfile.mkdtemp(prefix="gt_serve_ref_"))
    atexit.register(shutil.rmtree, dest, True)
    shutil.copytree(root / "gt_serve", dest / "gt_serve_ref", ignore=shutil.ignore_patterns("__pycache__"))
    for path in (dest / "gt_serve_ref").rglob("*.py"):
        text = path.read_text()
        path.write_text(re.sub(r"\b(from|import) gt_serve\b", r"\1 gt_serve_ref", text))
    sys.path.insert(0, str(dest))
    return "gt_serve_ref"


async def run(args) -> None:
    loop = asyncio.get_running_loop()
    pkgs = ["gt_serve"] + ([import_ref(Path(args.ref).resolve())] if args.ref else [])
    make = grpc_side if args.transport == "grpc" else http_side
    sides = {pkg: make(pkg, loop, args.requests, args.tensor_bytes) for pkg in pkgs}
    per_request = 1 if args.transport == "http" else _PER_CHUNK
    slices = 40
    times: dict[str, list[float]] = {pkg: [] for pkg in pkgs}
    for r in range(slices):
        for pkg in (pkgs if r % 2 else pkgs[::-1]):
            conn, chunks = sides[pkg]
            part = chunks[r * len(chunks) // slices:(r + 1) * len(chunks) // slices]
            start = time.perf_counter()
            for chunk in part:
                conn.data_received(chunk)
                await asyncio.sleep(0)  # the answers' writes (gRPC) and replies (HTTP) run
            times[pkg].append((time.perf_counter() - start) / (len(part) * per_request) * 1e6)
    summary = {}
    for pkg, values in times.items():
        values.sort()
        summary[pkg] = fast = sum(values[:slices // 4]) / (slices // 4)
        emit({"checkout": "this" if pkg == "gt_serve" else args.ref, "transport": args.transport,
              "tensor_bytes": args.tensor_bytes,
              "us_per_request_fastest_quarter": round(fast, 2), "us_per_request_median": round(values[slices // 2], 2)})
    if args.ref:
        print(f"this / ref: {summary['gt_serve'] / summary['gt_serve_ref']:.3f}x (fastest quarters)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transport", choices=("grpc", "http"), default="grpc")
    ap.add_argument("--requests", type=int, default=40000)
    ap.add_argument("--tensor-bytes", type=int, default=1024, help="the input tensor's bytes (convnet: 49152)")
    ap.add_argument("--ref", help="another checkout, timed against this one in the same process")
    args = ap.parse_args()
    try:
        import uvloop
        uvloop.run(run(args))
    except ImportError:
        asyncio.run(run(args))


if __name__ == "__main__":
    main()
