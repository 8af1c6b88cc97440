"""Server CPU per unary gRPC call: the native transport against grpcio, plus what the `h2` library's
state machine alone costs for one request/response exchange (in process, no sockets), to judge
whether rebuilding the native transport on `h2` would keep its speed.

For each transport a real server process serves the `simple` add/sub model; a grpc.aio client
keeps `--concurrency` calls in flight for `--calls` calls of ModelInfer (and of ServerLive, which
has no model work: transport + servicer only). Server CPU is read from /proc via psutil before and
after; the client runs in this process, so its CPU is not counted. Prints one JSON line.

    python bench/grpc_transport_bench.py --calls 4000 --concurrency 16
"""
from __future__ import annotations

import argparse
import asyncio
import json
import struct
import sys
import tempfile
import time
from pathlib import Path

import grpc
import psutil
from tritonclient.grpc import service_pb2 as pb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gt_serve.testing import model_builders as mb  # noqa: E402
from gt_serve.testing.launcher import launch  # noqa: E402
from common import simple_grpc_request  # noqa: E402

_SERVICE = "/inference.GRPCInferenceService/"


async def _drive(url: str, method: str, body: bytes, calls: int, concurrency: int) -> float:
    """Run `calls` calls, `concurrency` at a time; return the wall seconds."""
    async with grpc.aio.insecure_channel(url) as channel:
        call = channel.unary_unary(_SERVICE + method)
        await call(body)  # connect and warm up
        left = calls

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await call(body)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - start


def _cpu_s(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def measure_transport(repo: Path, transport: str, calls: int, concurrency: int) -> dict:
    out = {}
    with launch(["--model-repository", str(repo)], workdir=Path(tempfile.mkdtemp()),
                env={"GT_GRPC_TRANSPORT": transport}) as srv:
        proc = psutil.Process(srv.pid)
        for method, body in (("ServerLive", pb.ServerLiveRequest().SerializeToString()),
                             ("ModelInfer", simple_grpc_request())):
            asyncio.run(_drive(srv.grpc_url, method, body, 200, concurrency))  # warm up
            before = _cpu_s(proc)
            wall_s = asyncio.run(_drive(srv.grpc_url, method, body, calls, concurrency))
            cpu_s = _cpu_s(proc) - before
            out[method] = {"server_cpu_ms_per_call": round(1e3 * cpu_s / calls, 4),
                           "calls_per_s": round(calls / wall_s)}
    return out


def measure_h2_state_machine(exchanges: int) -> dict:
    """Server-side `h2.connection.H2Connection` work for one unary gRPC exchange: receive the
    request's HEADERS + DATA, acknowledge the data, send response HEADERS, DATA and trailers."""
    import h2.config
    import h2.connection
    import h2.settings

    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
    server.local_settings = h2.settings.Settings(
        client=False, initial_values={h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 2 * exchanges})
    client.initiate_connection()
    server.initiate_connection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    client.increment_flow_control_window(2**31 - 1 - 65535)  # neither side waits for the other
    server.increment_flow_control_window(2**31 - 1 - 65535)
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    body = simple_grpc_request()
    message = b"\x00" + struct.pack(">I", len(body)) + body
    headers = [(":method", "POST"), (":scheme", "http"), (":path", _SERVICE + "ModelInfer"),
               (":authority", "127.0.0.1"), ("content-type", "application/grpc"), ("te", "trailers")]
    response_headers = [(b":status", b"200"), (b"content-type", b"application/grpc")]
    requests = []
    for i in range(exchanges):  # client side encoded up front: not timed
        sid = 2 * i + 1
        client.send_headers(sid, headers)
        client.send_data(sid, message, end_stream=True)
        requests.append(client.data_to_send())
    start = time.process_time()
    for raw in requests:
        for event in server.receive_data(raw):
            sid = getattr(event, "stream_id", 0)
            length = getattr(event, "flow_controlled_length", 0)
            if length:
                server.acknowledge_received_data(length, sid)
        server.send_headers(sid, response_headers)
        server.send_data(sid, message)
        server.send_headers(sid, [(b"grpc-status", b"0")], end_stream=True)
        server.data_to_send()
    cpu_s = time.process_time() - start
    return {"h2_cpu_ms_per_exchange": round(1e3 * cpu_s / exchanges, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--transports", default="native,grpcio")
    parser.add_argument("--h2-exchanges", type=int, default=2000)
    args = parser.parse_args()
    repo = Path(tempfile.mkdtemp(prefix="grpc_bench_repo_"))
    mb.simple_add_sub(repo / "simple" / "1" / "model.onnx")
    (repo / "simple" / "config.pbtxt").write_text(mb.SIMPLE_CONFIG)
    result = {name: measure_transport(repo, name, args.calls, args.concurrency)
              for name in args.transports.split(",") if name}
    result["h2_library"] = measure_h2_state_machine(args.h2_exchanges)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
