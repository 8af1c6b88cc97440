"""The native gRPC transport (server.grpc_transport: native) at the HTTP/2 level: what
test_grpc_v2.py (which runs every RPC against both transports) does not reach: flow control with
tensors far larger than the windows, compressed requests, escaping of error messages, unknown
methods, and a client that does not speak HTTP/2 or breaks the protocol. Real tritonclient and raw
sockets on 127.0.0.1.
"""
from __future__ import annotations

import socket
import struct

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from gt_serve.testing import model_builders as mb
from gt_serve.protocol.grpc_headers import parse_timeout
from gt_serve.protocol.grpc_native import PREFACE
from tests.conftest import start_server

TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    root = tmp_path_factory.mktemp("native_repo")
    mb.scale(root / "big" / "1" / "model.onnx", factor=2.0, width=4)
    (root / "big" / "config.pbtxt").write_text('name: "big"\nmax_batch_size: 0\n')
    mb.simple_add_sub(root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(mb.SIMPLE_CONFIG)
    # waits (up to 20 s) for a batch of 2: a lone request stays queued, so deadlines can pass
    mb.scale(root / "waits" / "1" / "model.onnx", factor=2.0, width=4)
    (root / "waits" / "config.pbtxt").write_text(
        'name: "waits"\nmax_batch_size: 8\n'
        'dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 20000000 }\n')
    srv = start_server(root, tmp_path_factory.mktemp("native_srv"), env={"GT_GRPC_TRANSPORT": "native"})
    yield srv
    srv.stop()


def _frames(sock: socket.socket, want: int) -> list[tuple[int, int, int, bytes]]:
    """Read until `want` frames (or the peer closes): (type, flags, stream, payload)."""
    data = b""
    out = []
    sock.settimeout(TIMEOUT_S)
    while len(out) < want:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
        while len(data) >= 9:
            length = int.from_bytes(data[:3], "big")
            if len(data) < 9 + length:
                break
            out.append((data[3], data[4], struct.unpack(">I", data[5:9])[0] & 0x7FFFFFFF, data[9:9 + length]))
            data = data[9 + length:]
    return out


def _connect(srv) -> socket.socket:
    host, port = srv.grpc_url.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=TIMEOUT_S)


def _simple_call(srv) -> None:
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = []
        for name in ("INPUT0", "INPUT1"):
            inputs.append(grpcclient.InferInput(name, [1, 16], "INT32"))
            inputs[-1].set_data_from_numpy(a)
        np.testing.assert_array_equal(client.infer("simple", inputs).as_numpy("OUTPUT0"), 2 * a)
    finally:
        client.close()


def test_the_native_transport_answers(native):
    """Its SETTINGS (what grpcio would not send) show which transport is listening."""
    with _connect(native) as sock:
        sock.sendall(PREFACE + struct.pack(">I", 0)[1:] + bytes([4, 0]) + struct.pack(">I", 0))
        kind, flags, sid, payload = _frames(sock, 1)[0]
        assert (kind, flags, sid) == (4, 0, 0)
        settings = dict(struct.unpack_from(">HI", payload, i) for i in range(0, len(payload), 6))
        assert settings[3] == 256 and settings[5] == 1 << 20  # max concurrent streams, max frame size


def test_tensors_far_larger_than_the_flow_control_windows(native):
    rows = 3_000_000  # 48 MB each way: many frames, window updates in both directions
    x = np.random.default_rng(0).standard_normal((rows, 4)).astype(np.float32)
    client = grpcclient.InferenceServerClient(native.grpc_url)
    try:
        i = grpcclient.InferInput("INPUT", [rows, 4], "FP32")
        i.set_data_from_numpy(x)
        out = client.infer("big", [i], client_timeout=TIMEOUT_S).as_numpy("OUTPUT")
        np.testing.assert_array_equal(out, 2 * x)
    finally:
        client.close()


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests(native, algorithm):
    client = grpcclient.InferenceServerClient(native.grpc_url)
    try:
        x = np.tile(np.arange(4, dtype=np.float32), (1000, 1))  # compressible
        i = grpcclient.InferInput("INPUT", list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        out = client.infer("big", [i], compression_algorithm=algorithm).as_numpy("OUTPUT")
        np.testing.assert_array_equal(out, 2 * x)
    finally:
        client.close()


def test_error_messages_arrive_unmangled(native):
    client = grpcclient.InferenceServerClient(native.grpc_url)
    try:
        name = "módel %41 ü\u2603 \"quoted\""
        i = grpcclient.InferInput("INPUT", [1, 4], "FP32")
        i.set_data_from_numpy(np.zeros((1, 4), np.float32))
        with pytest.raises(InferenceServerException) as info:
            client.infer(name, [i])
        assert name in info.value.message()
        assert info.value.status() in ("StatusCode.INVALID_ARGUMENT", "StatusCode.NOT_FOUND")
    finally:
        client.close()


def test_unknown_method_is_unimplemented(native):
    with grpc.insecure_channel(native.grpc_url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/NoSuchMethod")
        with pytest.raises(grpc.RpcError) as info:
            call(b"", timeout=TIMEOUT_S)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "NoSuchMethod" in info.value.details()


def test_a_client_that_is_not_http2_is_turned_away(native):
    with _connect(native) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        frames = _frames(sock, 10)  # our SETTINGS, then GOAWAY, then the close
        assert frames[-1][0] == 7 and struct.unpack(">I", frames[-1][3][4:8])[0] == 1  # PROTOCOL_ERROR
    _simple_call(native)  # the server lives on


def test_a_protocol_violation_ends_that_connection_only(native):
    with _connect(native) as sock:
        sock.sendall(PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        sock.sendall(b"\x00\x00\x04\x05\x04\x00\x00\x00\x01" + b"\x00\x00\x00\x02")  # PUSH_PROMISE from a client
        frames = _frames(sock, 10)
        goaway = [f for f in frames if f[0] == 7]
        assert goaway and struct.unpack(">I", goaway[0][3][4:8])[0] == 1
    _simple_call(native)


def test_ping_is_answered(native):
    with _connect(native) as sock:
        sock.sendall(PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00" + b"\x00\x00\x08\x06\x00\x00\x00\x00\x00" + b"gt-serve")
        frames = _frames(sock, 4)
        assert (6, 1, 0, b"gt-serve") in frames


def test_grpc_timeout_header():
    assert parse_timeout("2S") == 2.0
    assert parse_timeout("100m") == pytest.approx(0.1)
    assert parse_timeout("5u") == pytest.approx(5e-6)
    assert parse_timeout("1H") == 3600.0
    assert parse_timeout("x") is None and parse_timeout("10") is None


def _waits_input():
    i = grpcclient.InferInput("INPUT", [1, 4], "FP32")
    i.set_data_from_numpy(np.ones((1, 4), np.float32))
    return i


def test_a_deadline_that_passes_in_the_queue(native):
    client = grpcclient.InferenceServerClient(native.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.infer("waits", [_waits_input()], client_timeout=0.3)
        assert info.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        # two together make the preferred batch and are served at once
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            outs = list(pool.map(lambda _: client.infer("waits", [_waits_input()], client_timeout=TIMEOUT_S)
                                 .as_numpy("OUTPUT"), range(2)))
        for out in outs:
            np.testing.assert_array_equal(out, np.full((1, 4), 2.0, np.float32))
    finally:
        client.close()
    _simple_call(native)


def test_client_cancellation_frees_the_call(native):
    """A call cancelled by the client (RST_STREAM) while it waits in the queue is dropped; the
    connection and the server carry on."""
    import asyncio

    import tritonclient.grpc.aio as aioclient

    async def main():
        async with aioclient.InferenceServerClient(native.grpc_url) as client:
            i = aioclient.InferInput("INPUT", [1, 4], "FP32")
            i.set_data_from_numpy(np.ones((1, 4), np.float32))
            task = asyncio.ensure_future(client.infer("waits", [i]))
            done, _ = await asyncio.wait([task], timeout=0.3)
            assert not done  # still queued
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await client.is_server_live()  # same connection, still fine

    asyncio.run(main())
    _simple_call(native)


def test_random_frames_never_take_the_server_down(native):
    """Seeded random frame sequences after a valid preface: each connection ends or carries on,
    the server keeps serving."""
    rng = np.random.default_rng(1234)
    for case in range(60):
        with _connect(native) as sock:
            frames = [PREFACE, b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"]
            for _ in range(int(rng.integers(1, 6))):
                kind = int(rng.integers(0, 12))
                flags = int(rng.integers(0, 256))
                sid = int(rng.choice([0, 1, 2, 3, 2**31 - 1]))
                payload = rng.integers(0, 256, int(rng.integers(0, 40)), dtype=np.uint8).tobytes()
                frames.append(len(payload).to_bytes(3, "big") + bytes([kind, flags]) + struct.pack(">I", sid) + payload)
            try:
                sock.sendall(b"".join(frames))
                sock.settimeout(0.5)
                while sock.recv(65536):
                    pass
            except (socket.timeout, ConnectionError):
                pass
    _simple_call(native)


def test_another_http2_client_huffman_continuation_and_padding(native):
    """The `h2` library as the client (not gRPC's C core): Huffman-coded headers, a header block
    big enough to need CONTINUATION frames, padded DATA split in two frames, and a ping."""
    import h2.config
    import h2.connection
    import h2.events
    from tritonclient.grpc import service_pb2 as pb

    request = pb.ModelInferRequest(model_name="simple", id="h2-client")
    for name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        assert tensor is not None
        request.raw_input_contents.append(np.arange(16, dtype=np.int32).tobytes())
    body = request.SerializeToString()
    message = b"\x00" + struct.pack(">I", len(body)) + body

    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    headers = [(":method", "POST"), (":scheme", "http"), (":path", "/inference.GRPCInferenceService/ModelInfer"),
               (":authority", native.grpc_url), ("content-type", "application/grpc"), ("te", "trailers"),
               ("x-big-metadata", "m" * 30000)]  # > 16 KiB encoded: HEADERS + CONTINUATION
    with _connect(native) as sock:
        conn.send_headers(1, headers)
        half = len(message) // 2
        conn.send_data(1, message[:half], pad_length=7)
        conn.send_data(1, message[half:], end_stream=True, pad_length=3)
        conn.ping(b"12345678")
        out = conn.data_to_send()
        kinds, pos = [], len(PREFACE)
        while pos < len(out):
            kinds.append(out[pos + 3])
            pos += 9 + int.from_bytes(out[pos:pos + 3], "big")
        assert 9 in kinds and kinds.count(0) == 2  # CONTINUATION was needed; two DATA frames
        sock.sendall(out)
        sock.settimeout(TIMEOUT_S)
        status = data = trailers = None
        data = b""
        pong = False
        while trailers is None or not pong:
            chunk = sock.recv(65536)
            assert chunk, "connection closed early"
            for event in conn.receive_data(chunk):
                if isinstance(event, h2.events.ResponseReceived):
                    status = dict(event.headers)
                elif isinstance(event, h2.events.DataReceived):
                    data += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.TrailersReceived):
                    trailers = dict(event.headers)
                elif isinstance(event, h2.events.PingAckReceived):
                    pong = event.ping_data == b"12345678"
            sock.sendall(conn.data_to_send())
    assert status[":status"] == "200" and status["content-type"] == "application/grpc"
    assert trailers["grpc-status"] == "0", trailers
    response = pb.ModelInferResponse.FromString(data[5:5 + struct.unpack(">I", data[1:5])[0]])
    assert response.id == "h2-client"
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], np.int32), 2 * np.arange(16))


def test_large_answers_in_small_frames_and_windows_on_concurrent_streams(native):
    """An answer is written as pieces (the tensor's bytes are not joined first), framed as the peer allows: the `h2`
    library as the client keeps 16 KiB frames and 64 KiB windows; two calls' answers of 800 KB interleave."""
    import h2.config
    import h2.connection
    import h2.events
    from tritonclient.grpc import service_pb2 as pb

    srv = native
    rows = 50_000
    xs = {sid: np.random.default_rng(sid).standard_normal((rows, 4)).astype(np.float32) for sid in (1, 3)}
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    headers = [(":method", "POST"), (":scheme", "http"), (":path", "/inference.GRPCInferenceService/ModelInfer"),
               (":authority", srv.grpc_url), ("content-type", "application/grpc"), ("te", "trailers")]
    bodies = {}
    for sid, x in xs.items():
        request = pb.ModelInferRequest(model_name="big", id=f"s{sid}")
        request.inputs.add(name="INPUT", datatype="FP32", shape=[rows, 4])
        request.raw_input_contents.append(x.tobytes())
        body = request.SerializeToString()
        bodies[sid] = b"\x00" + struct.pack(">I", len(body)) + body
        conn.send_headers(sid, headers)
    data = {sid: b"" for sid in xs}
    trailers = {}
    largest = 0
    with _connect(srv) as sock:
        sock.settimeout(TIMEOUT_S)
        sock.sendall(conn.data_to_send())
        while len(trailers) < len(xs):
            for sid, body in bodies.items():  # the requests go as the server's windows allow
                while body and conn.local_flow_control_window(sid) > 0:
                    n = min(len(body), conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
                    conn.send_data(sid, body[:n], end_stream=n == len(body))
                    body = body[n:]
                bodies[sid] = body
            sock.sendall(conn.data_to_send())
            chunk = sock.recv(65536)
            assert chunk, "connection closed early"
            for event in conn.receive_data(chunk):
                if isinstance(event, h2.events.DataReceived):
                    largest = max(largest, len(event.data))
                    data[event.stream_id] += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.TrailersReceived):
                    trailers[event.stream_id] = dict(event.headers)
            sock.sendall(conn.data_to_send())
    assert largest <= 16384  # the client's SETTINGS_MAX_FRAME_SIZE (the default)
    for sid, x in xs.items():
        assert trailers[sid]["grpc-status"] == "0", trailers[sid]
        (length,) = struct.unpack(">I", data[sid][1:5])
        assert len(data[sid]) == 5 + length
        response = pb.ModelInferResponse.FromString(data[sid][5:])
        assert response.id == f"s{sid}"
        np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], np.float32).reshape(rows, 4),
                                      2 * x)
