"""The gRPC port under the red team's HTTP/2 attacks (issue #11 items 1-10, finding 14): one test per
finding, raw sockets or the `h2` library against a real server process on 127.0.0.1, on both
transports where the check applies. Each asserts the error the server answers with, that a
concurrent probe (HTTP /v2/health/ready and a gRPC ServerLive on fresh connections) is answered
within PROBE_BOUND_S, and where memory is the target, the server's RSS growth. Attacks are bounded
in bytes (a few MB) and time (socket timeouts)."""
from __future__ import annotations

import gzip
import http.client
import socket
import struct
import time

import grpc
import h2.config
import h2.connection
import h2.events
import psutil
import pytest
from hpack import Encoder
from tritonclient.grpc import service_pb2 as pb

from gt_serve.testing import model_builders as mb
from gt_serve.protocol.h2 import frames as f
from gt_serve.protocol.h2.hpack_cache import HeaderDecoder
from gt_serve.protocol.h2.limits import H2Limits
from tests.conftest import start_server

pytestmark = pytest.mark.security

TIMEOUT_S = 10.0
PROBE_BOUND_S = 1.5
MAX_MESSAGE_BYTES = 8 << 20
IDLE_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 24
MIB = 1 << 20
INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"


@pytest.fixture(scope="module", params=["native", "grpcio"])
def srv(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"h2_repo_{request.param}")
    mb.simple_add_sub(root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(mb.SIMPLE_CONFIG)
    work = tmp_path_factory.mktemp(f"h2_srv_{request.param}")
    config = work / "node.yaml"
    config.write_text(f"server:\n  idle_timeout_s: {IDLE_TIMEOUT_S}\n  max_connections: {MAX_CONNECTIONS}\n")
    # explicit mode, nothing loaded: the attacks need the transport, not a model
    server = start_server(root, work, "--config", str(config), "--max-body-bytes", str(MAX_MESSAGE_BYTES),
                          "--model-control-mode", "explicit", env={"GT_GRPC_TRANSPORT": request.param})
    server.transport = request.param
    yield server
    server.stop()


def native_only(srv) -> None:
    if srv.transport != "native":
        pytest.skip("checks an HTTP/2 error code of our transport; grpcio's C core answers its own way")


# ---- helpers -------------------------------------------------------------------------------------

def probe_s(srv) -> float:
    """Seconds for an HTTP readiness check and a gRPC ServerLive, each on a fresh connection."""
    start = time.monotonic()
    host, port = srv.http_url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        conn.request("GET", "/v2/health/ready")
        assert conn.getresponse().status == 200
    finally:
        conn.close()
    with grpc.insecure_channel(srv.grpc_url) as channel:
        live = channel.unary_unary("/inference.GRPCInferenceService/ServerLive",
                                   request_serializer=pb.ServerLiveRequest.SerializeToString,
                                   response_deserializer=pb.ServerLiveResponse.FromString)
        assert live(pb.ServerLiveRequest(), timeout=5).live
    return time.monotonic() - start


def assert_responsive(srv) -> None:
    elapsed = probe_s(srv)
    assert elapsed < PROBE_BOUND_S, f"probe took {elapsed:.2f} s"


def rss_bytes(srv) -> int:
    return psutil.Process(srv.pid).memory_info().rss


def request_block(encoder: Encoder, path: str = INFER, extra=()) -> bytes:
    return encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
                           ("content-type", "application/grpc"), ("te", "trailers"), *extra], huffman=False)


class Raw:
    """A raw HTTP/2 client socket: frames in, frames out."""

    def __init__(self, srv, settings: bytes = b"") -> None:
        host, port = srv.grpc_url.split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=TIMEOUT_S)
        self.data = b""
        self.sock.sendall(f.PREFACE + f.frame(f.SETTINGS, 0, 0, settings))

    def send(self, *frames: bytes) -> bool:
        try:
            self.sock.sendall(b"".join(frames))
            return True
        except OSError:  # the server closed the connection meanwhile
            return False

    def read(self, until, timeout_s: float = TIMEOUT_S):
        """Frames until `until(frame)` holds for one (returned), or None at EOF / reset / timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            while len(self.data) >= 9:
                length = int.from_bytes(self.data[:3], "big")
                if len(self.data) < 9 + length:
                    break
                got = (self.data[3], self.data[4], struct.unpack(">I", self.data[5:9])[0] & 0x7FFFFFFF,
                       self.data[9:9 + length])
                self.data = self.data[9 + length:]
                if until(got):
                    return got
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(1 << 20)
            except (socket.timeout, OSError):
                return None
            if not chunk:
                return None
            self.data += chunk

    def goaway_code(self, timeout_s: float = TIMEOUT_S) -> int | None:
        got = self.read(lambda fr: fr[0] == f.GOAWAY, timeout_s)
        return None if got is None else struct.unpack(">I", got[3][4:8])[0]

    def rst_code(self, sid: int, timeout_s: float = TIMEOUT_S) -> int | None:
        got = self.read(lambda fr: fr[0] == f.RST_STREAM and fr[2] == sid, timeout_s)
        return None if got is None else struct.unpack(">I", got[3])[0]

    def closed_within(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                if not self.sock.recv(1 << 16):
                    return True
            except socket.timeout:
                return False
            except OSError:
                return True
        return False

    def close(self) -> None:
        self.sock.close()


class H2Client:
    """The `h2` library over a socket, for attacks that must respect flow control."""

    def __init__(self, srv) -> None:
        host, port = srv.grpc_url.split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=TIMEOUT_S)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        self.events: list = []
        self.flush()

    def flush(self) -> None:
        self.sock.sendall(self.conn.data_to_send())

    def pump(self, timeout_s: float) -> bool:
        """Read once (up to `timeout_s`); False when nothing came or the connection ended."""
        self.sock.settimeout(timeout_s)
        try:
            chunk = self.sock.recv(1 << 20)
        except (socket.timeout, OSError):
            return False
        if not chunk:
            return False
        self.events += self.conn.receive_data(chunk)
        self.flush()
        return True

    def open(self, path: str, extra=()) -> int:
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":path", path),
                                     (":authority", "x"), ("content-type", "application/grpc"),
                                     ("te", "trailers"), *extra])
        self.flush()
        return sid

    def send_within_windows(self, sid: int, data: bytes, stall_s: float = 1.0) -> int:
        """Send what the windows allow; stop when no window opens for `stall_s`. Returns bytes sent."""
        sent = 0
        while sent < len(data):
            window = min(self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size)
            if window <= 0:
                if not self.pump(stall_s):
                    return sent
                continue
            chunk = data[sent:sent + window]
            self.conn.send_data(sid, chunk)
            self.flush()
            sent += len(chunk)
        return sent

    def grpc_status(self, sid: int, timeout_s: float = TIMEOUT_S) -> str | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for event in self.events:
                if isinstance(event, (h2.events.TrailersReceived, h2.events.ResponseReceived)) \
                        and event.stream_id == sid:
                    status = dict(event.headers).get("grpc-status")
                    if status is not None:
                        return status
            if not self.pump(max(0.01, deadline - time.monotonic())):
                break
        return None

    def close(self) -> None:
        self.sock.close()


# ---- 1. HPACK dynamic table size updates ------------------------------------------------------------

def test_1_hpack_size_update_bomb(srv):
    """2 MiB of 0x20 (table size update to 0) as one header block: refused from the frame header."""
    raw = Raw(srv)
    try:
        raw.send(f.frame_head(2 * MIB, f.HEADERS, f.END_STREAM | f.END_HEADERS, 1), b"\x20" * (2 * MIB))
        assert_responsive(srv)
        if srv.transport == "native":
            assert raw.goaway_code() == f.FRAME_SIZE_ERROR
        else:
            assert raw.closed_within(TIMEOUT_S)
    finally:
        raw.close()


def test_1_size_updates_beyond_two_per_block(srv):
    """A block that fits a frame but starts with 16,000 size updates: COMPRESSION_ERROR before decoding."""
    native_only(srv)
    raw = Raw(srv)
    try:
        raw.send(f.frame(f.HEADERS, f.END_STREAM | f.END_HEADERS, 1, b"\x20" * 16000))
        assert raw.goaway_code() == f.COMPRESSION_ERROR
        assert_responsive(srv)
    finally:
        raw.close()


# ---- 2. the header cache is bounded in bytes ---------------------------------------------------------

def test_2_header_cache_is_bounded_in_bytes():
    """300 distinct ~16 KiB blocks that leave the HPACK table alone (all cacheable)."""
    limits = H2Limits()
    decoder = HeaderDecoder(limits)
    for i in range(300):
        name, value = f"x-{i}".encode(), b"v" * 16000
        block = b"\x00" + bytes((len(name),)) + name + b"\x7f" + _hpack_int(len(value) - 127) + value
        assert decoder.decode(block) == [(name.decode(), value.decode())]
    assert 0 < decoder.cache_bytes <= limits.header_cache_bytes


def _hpack_int(n: int) -> bytes:
    out = bytearray()
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def test_2_many_big_header_blocks_hold_little_memory(srv):
    """100 calls on one connection, each with ~24 KiB of distinct metadata (HEADERS + CONTINUATION)."""
    native_only(srv)
    encoder = Encoder()
    raw = Raw(srv)
    before = rss_bytes(srv)
    try:
        for i in range(100):
            block = request_block(encoder, "/no.Such/Method", [(f"x-meta-{i}", "m" * 24000)])
            sid = 2 * i + 1
            parts = [block[j:j + 16000] for j in range(0, len(block), 16000)]
            frames = [f.frame(f.HEADERS, f.END_STREAM if len(parts) > 1 else f.END_STREAM | f.END_HEADERS,
                              sid, parts[0])]
            frames += [f.frame(f.CONTINUATION, f.END_HEADERS if k == len(parts) - 1 else 0, sid, p)
                       for k, p in enumerate(parts[1:], 1)]
            assert raw.send(*frames)
            assert raw.read(lambda fr, s=sid: fr[0] == f.HEADERS and fr[2] == s) is not None
        assert rss_bytes(srv) - before < 32 * MIB
        assert_responsive(srv)
    finally:
        raw.close()


# ---- 3. partial frames -----------------------------------------------------------------------------

def test_3_a_huge_frame_is_refused_from_its_header(srv):
    raw = Raw(srv)
    before = rss_bytes(srv)
    try:
        raw.send(f.frame_head(16_777_215, f.DATA, 0, 1), b"\x00" * MIB)  # of 16 MiB announced
        if srv.transport == "native":
            assert raw.goaway_code() == f.FRAME_SIZE_ERROR
        else:
            assert raw.closed_within(TIMEOUT_S)
        assert rss_bytes(srv) - before < 8 * MIB
        assert_responsive(srv)
    finally:
        raw.close()


def test_3_a_partial_frame_times_out(srv):
    native_only(srv)
    raw = Raw(srv)
    try:
        raw.send(f.frame_head(16000, f.PING, 0, 0), b"\x00" * 100)  # never completed
        start = time.monotonic()
        assert raw.goaway_code(IDLE_TIMEOUT_S + 5) == f.PROTOCOL_ERROR
        assert time.monotonic() - start < IDLE_TIMEOUT_S + 5
    finally:
        raw.close()


# ---- 4. a peer that does not read --------------------------------------------------------------------

def test_4_ping_flood_without_reading(srv):
    """INITIAL_WINDOW_SIZE 2^31-1, then PINGs (up to 4 MiB of them) and never a read."""
    raw = Raw(srv, struct.pack(">HI", f.SETTINGS_INITIAL_WINDOW_SIZE, 2**31 - 1))
    raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    before = rss_bytes(srv)
    chunk = f.frame(f.PING, 0, 0, b"12345678") * 4096  # 68 KiB
    try:
        raw.sock.settimeout(1.0)
        sent = 0
        while sent < 4 * MIB and raw.send(chunk):
            sent += len(chunk)
        assert rss_bytes(srv) - before < 48 * MIB
        assert_responsive(srv)
        if srv.transport == "native":  # the control-frame limit ends it long before 4 MiB
            assert sent < 4 * MIB
            code = raw.goaway_code()
            assert code in (f.ENHANCE_YOUR_CALM, None)  # None: reset before our read got the GOAWAY
            assert raw.closed_within(TIMEOUT_S)
    finally:
        raw.close()


# ---- 5. connection cap and idle timeout -----------------------------------------------------------------

def test_5_connection_cap_and_idle_timeout(srv):
    host, port = srv.grpc_url.split(":")
    socks = []
    try:
        for _ in range(MAX_CONNECTIONS + 16):
            socks.append(socket.create_connection((host, int(port)), timeout=TIMEOUT_S))
        host_http, port_http = srv.http_url.split(":")
        conn = http.client.HTTPConnection(host_http, int(port_http), timeout=5)
        conn.request("GET", "/v2/health/ready")
        assert conn.getresponse().status == 200
        conn.close()
        if srv.transport != "native":
            return
        # every one of them is closed: the surplus at once, the rest by the handshake/idle timeout
        deadline = time.monotonic() + IDLE_TIMEOUT_S + 6
        for sock in socks:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                while sock.recv(65536):
                    pass
            except ConnectionResetError:
                pass
        assert time.monotonic() < deadline
        assert_responsive(srv)
    finally:
        for sock in socks:
            sock.close()


# ---- 6. SETTINGS with many entries while many streams are open --------------------------------------------

def test_6_settings_entries_times_open_streams(srv):
    native_only(srv)
    encoder = Encoder()
    raw = Raw(srv)
    try:
        headers = [f.frame(f.HEADERS, f.END_HEADERS, 2 * i + 1, request_block(encoder)) for i in range(250)]
        raw.send(*headers)
        entry = struct.pack(">HI", f.SETTINGS_INITIAL_WINDOW_SIZE, 1000)
        bomb = f.frame(f.SETTINGS, 0, 0, entry * 2700)  # fits a 16 KiB frame
        raw.send(*[bomb] * 40)
        assert_responsive(srv)
        assert raw.goaway_code() == f.ENHANCE_YOUR_CALM
    finally:
        raw.close()


# ---- 7. stream reassembly -----------------------------------------------------------------------------

def test_7_a_message_announced_over_the_limit_is_refused_at_once(srv):
    client = H2Client(srv)
    try:
        sid = client.open(STREAM_INFER)
        client.conn.send_data(sid, b"\x00" + struct.pack(">I", 2**31 - 2) + b"x" * 1000)
        client.flush()
        assert client.grpc_status(sid) == str(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])
        assert_responsive(srv)
    finally:
        client.close()


def test_7_reassembly_is_linear(srv):
    """A 7 MiB message sent as 6 MiB of 16 KiB frames and then 1,000 one-byte frames."""
    proc = psutil.Process(srv.pid)
    client = H2Client(srv)
    try:
        sid = client.open(STREAM_INFER)
        cpu_before = sum(proc.cpu_times()[:2])
        head = b"\x00" + struct.pack(">I", 7 * MIB) + b"\x00" * (6 * MIB)
        assert client.send_within_windows(sid, head) == len(head)
        for _ in range(1000):
            client.conn.send_data(sid, b"\x00")
        client.flush()
        assert_responsive(srv)
        cpu_s = sum(proc.cpu_times()[:2]) - cpu_before
        assert cpu_s < 2.0, f"server spent {cpu_s:.2f} s of CPU"
    finally:
        client.close()


# ---- 8. compressed messages ------------------------------------------------------------------------------

def test_8_gzip_bomb(srv):
    bomb = gzip.compress(b"\x00" * (256 * MIB), compresslevel=9)  # ~250 KB that inflates to 256 MiB
    before = rss_bytes(srv)
    client = H2Client(srv)
    try:
        sid = client.open(INFER, [("grpc-encoding", "gzip")])
        client.send_within_windows(sid, b"\x01" + struct.pack(">I", len(bomb)) + bomb)
        client.conn.end_stream(sid)
        client.flush()
        assert_responsive(srv)
        assert client.grpc_status(sid) == str(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])
        assert rss_bytes(srv) - before < 64 * MIB
    finally:
        client.close()


# ---- 9. receive flow control -----------------------------------------------------------------------------

def test_9_unfinished_messages_are_held_within_a_budget(srv):
    """16 streams each announce a 7 MiB message and send what the windows allow, never finishing:
    the server stops opening windows near its buffer budget (32 MiB + one message + the windows)."""
    before = rss_bytes(srv)
    client = H2Client(srv)
    sent = 0
    try:
        body = b"\x00" + struct.pack(">I", 7 * MIB) + b"\x00" * (7 * MIB - 1)
        for _ in range(16):
            sid = client.open(STREAM_INFER)
            sent += client.send_within_windows(sid, body, stall_s=0.5)
        assert_responsive(srv)
        grown = rss_bytes(srv) - before
        if srv.transport == "native":
            assert sent < 64 * MIB, f"{sent / MIB:.0f} MiB accepted"
            assert grown < 96 * MIB
        else:
            assert grown < 256 * MIB
    finally:
        client.close()


# ---- 10. CONTINUATION floods, rapid reset, RFC 9113 errors --------------------------------------------------

def test_10_endless_empty_continuation(srv):
    encoder = Encoder()
    raw = Raw(srv)
    try:
        raw.send(f.frame(f.HEADERS, 0, 1, request_block(encoder)))
        empty = f.frame(f.CONTINUATION, 0, 1) * 10000
        for _ in range(10):  # up to 100,000 frames, 900 KB
            if not raw.send(empty):
                break
        assert_responsive(srv)
        if srv.transport == "native":
            assert raw.goaway_code() == f.ENHANCE_YOUR_CALM
    finally:
        raw.close()


def test_10_rapid_reset(srv):
    encoder = Encoder()
    raw = Raw(srv)
    try:
        block = request_block(encoder)
        batch = []
        for i in range(20000):
            sid = 2 * i + 1
            batch.append(f.frame(f.HEADERS, f.END_HEADERS, sid, block) + f.rst_stream(sid, f.CANCEL))
            if len(batch) == 1000:
                if not raw.send(*batch):
                    break
                batch = []
        assert_responsive(srv)
        if srv.transport == "native":
            assert raw.goaway_code() == f.ENHANCE_YOUR_CALM
    finally:
        raw.close()


def _one_violation(srv, *frames: bytes) -> int | None:
    raw = Raw(srv)
    try:
        raw.send(*frames)
        return raw.goaway_code()
    finally:
        raw.close()


def test_10_rfc9113_connection_errors(srv):
    native_only(srv)
    encoder = Encoder()
    hdr = lambda sid, flags=f.END_HEADERS: f.frame(f.HEADERS, flags, sid, request_block(encoder))  # noqa: E731
    cases = {
        "empty PADDED HEADERS": f.frame(f.HEADERS, f.PADDED | f.END_HEADERS, 1),
        "HEADERS padding beyond the frame": f.frame(f.HEADERS, f.PADDED | f.END_HEADERS, 1, b"\x09abc"),
        "DATA on an idle stream": f.frame(f.DATA, 0, 7, b"x"),
        "WINDOW_UPDATE on an idle stream": f.window_update(9, 10),
        "RST_STREAM on an idle stream": f.rst_stream(11, f.CANCEL),
        "connection WINDOW_UPDATE of 0": f.window_update(0, 0),
    }
    for name, frame in cases.items():
        encoder = Encoder()  # every case on a new connection, with a new HPACK context
        assert _one_violation(srv, frame) == f.PROTOCOL_ERROR, name
    encoder = Encoder()
    assert _one_violation(srv, hdr(1), f.frame(f.DATA, f.PADDED, 1)) == f.PROTOCOL_ERROR  # empty PADDED DATA
    encoder = Encoder()
    assert _one_violation(srv, hdr(5), hdr(3)) == f.PROTOCOL_ERROR  # decreasing stream ids
    encoder = Encoder()
    assert _one_violation(srv, f.window_update(0, 2**31 - 1)) == f.FLOW_CONTROL_ERROR
    assert "Traceback" not in srv.log()
    assert_responsive(srv)


def test_10_rfc9113_stream_errors(srv):
    native_only(srv)
    encoder = Encoder()
    raw = Raw(srv)
    try:
        raw.send(f.frame(f.HEADERS, f.END_HEADERS, 1, request_block(encoder)), f.window_update(1, 0))
        assert raw.rst_code(1) == f.PROTOCOL_ERROR
        raw.send(f.frame(f.HEADERS, f.END_HEADERS, 3, request_block(encoder)), f.window_update(3, 2**31 - 1))
        assert raw.rst_code(3) == f.FLOW_CONTROL_ERROR
        raw.send(f.frame(f.PING, 0, 0, b"still-up"))  # the connection carries on
        assert raw.read(lambda fr: fr[0] == f.PING and fr[1] & f.ACK) is not None
    finally:
        raw.close()


# ---- finding 14: no credentials in DEBUG logs ---------------------------------------------------------------

def test_14_debug_logs_hold_no_bearer_token(tmp_path, srv):
    root = tmp_path / "repo"
    mb.simple_add_sub(root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(mb.SIMPLE_CONFIG)
    secret = "s3cret-token-for-the-log-test"
    with start_server(root, tmp_path, "--log-level", "DEBUG", "--auth-token", secret,
                      "--model-control-mode", "explicit", env={"GT_GRPC_TRANSPORT": srv.transport}) as debug_srv:
        with grpc.insecure_channel(debug_srv.grpc_url) as channel:
            meta = channel.unary_unary("/inference.GRPCInferenceService/ServerMetadata",
                                       request_serializer=pb.ServerMetadataRequest.SerializeToString,
                                       response_deserializer=pb.ServerMetadataResponse.FromString)
            assert meta(pb.ServerMetadataRequest(), metadata=[("authorization", f"Bearer {secret}")], timeout=10)
        debug_srv.stop()
        assert secret not in debug_srv.log()
