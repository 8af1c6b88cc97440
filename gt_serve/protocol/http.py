"""The V2 (KServe / Triton) REST route table on top of http_server, over a DataPlane.

Routes: PROTOCOL.md §1. The request body is never interpreted by Content-Type. Every error is an
uncompressed JSON {"error": "..."} whose status and headers come from protocol/status.py (`_handle`
is the one exception handler). Query strings are ignored; unknown routes answer 404 (NotFound), wrong
methods 405 (MethodNotAllowed, with Allow), a missing token 401 (Unauthenticated, with WWW-Authenticate).
"""
from __future__ import annotations

import asyncio
import base64
import hmac
from concurrent.futures import ThreadPoolExecutor
import logging
from typing import Any

import orjson

from ..core.model_config import model_config_json
from ..errors import InvalidArgument, MethodNotAllowed, NotFound, NotReady, Unauthenticated
from ..tls import TlsFiles, server_context
from . import http_infer
from .http_express import HttpExpress, error_response
from .http_generate import decode_generate, encode_generate
from .http_messages import Request, Response
from .http_server import HttpServer
from .http_templates import AnswerTemplates, RequestTemplates
from .tracing import RequestTracer

_log = logging.getLogger(__name__)

_JSON = {"Content-Type": "application/json"}
_EMPTY_OK = Response(200, b"", None)
# Triton answers health with an empty body; the KServe V2 spec's `{"live": true}` / `{"ready": true}` serves both
# tritonclient (it reads the status alone) and KServe's InferenceRESTClient (it reads the body)
_HEALTHY = {"live": Response(200, b'{"live":true}', _JSON),
            "ready": Response(200, b'{"ready":true}', _JSON)}
COMPRESS_MIN_BYTES = 1024  # smaller infer responses are sent uncompressed even when gzip is accepted
OFFLOAD_DECODE_BYTES = 1 << 20  # infer bodies this large are decoded on the (one) decode thread


def _ok_json(value: Any) -> Response:
    return Response(200, orjson.dumps(value), _JSON)


def _need(req: Request, *methods: str) -> None:
    if req.method not in methods:
        raise MethodNotAllowed(req.method, req.path, methods)


def _json_body(body: bytes, what: str) -> dict:
    return http_infer.json_object(body, f"{what} request") if body.strip() else {}


def _int_field(doc: dict, key: str, what: str, default: int | None = None) -> int:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        if value is None:
            raise InvalidArgument(f"{what}: '{key}' is required")
        raise InvalidArgument(f"{what}: '{key}' must be a non-negative integer, got {value!r}")
    return value


def _split_version(parts: list[str]) -> tuple[str, list[str]]:
    """['versions', V, *rest] -> (V, rest); else ('', parts)."""
    if len(parts) >= 2 and parts[0] == "versions":
        return parts[1], parts[2:]
    return "", parts


class HttpFrontEnd:
    def __init__(self, dataplane, *, max_body_bytes: int = 256 * 1024 * 1024, max_connections: int = 1024,
                 auth_token: str | None = None, idle_timeout_s: float = 60.0, header_timeout_s: float = 10.0,
                 body_timeout_s: float = 60.0, compress_min_bytes: int = COMPRESS_MIN_BYTES,
                 tracer: RequestTracer | None = None, express: bool = True) -> None:
        """`express`: serve repeated binary infer requests from their plans (protocol/http_express.py)."""
        self._dp = dataplane
        self._max_body_bytes = max_body_bytes
        self._auth = f"Bearer {auth_token}".encode() if auth_token else None
        self._compress_min_bytes = compress_min_bytes
        self._tracer = tracer or RequestTracer.disabled()  # shared with the gRPC front end (App)
        self._trace_settings = self._tracer.settings
        self._decoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gt-http-decode")
        self._templates = RequestTemplates()  # repeated JSON parts of binary requests, decoded once
        self._answers = AnswerTemplates()  # ... and of binary answers, encoded once
        self._log_settings = {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
                              "log_verbose_level": 0, "log_format": "default"}
        self._express = HttpExpress(dataplane, self._answers, auth=self._auth, trace_settings=self._trace_settings,
                                    max_json_bytes=self._templates.max_json_bytes,
                                    compress_min_bytes=compress_min_bytes) if express else None
        self._server = HttpServer(self._handle, express=self._express.serve if express else None, bound=self._express,
                                  max_body_bytes=max_body_bytes, max_connections=max_connections,
                                  idle_timeout_s=idle_timeout_s, header_timeout_s=header_timeout_s,
                                  body_timeout_s=body_timeout_s)

    @property
    def port(self) -> int:
        return self._server.port

    async def start(self, host: str, port: int, ssl_context=None, reuse_port: bool = False) -> None:
        await self._server.start(host, port, ssl_context, reuse_port)

    async def close(self, drain_timeout_s: float = 5.0) -> None:
        await self._server.close(drain_timeout_s)
        self._decoder.shutdown(wait=False, cancel_futures=True)

    # ---- the one exception handler ----
    async def _handle(self, req: Request) -> Response:
        try:
            if self._auth is not None and not req.path.startswith("/v2/health/"):
                self._check_auth(req)
            path = req.path
            if path.endswith("/infer") and path.startswith("/v2/models/"):
                parts = path[11:-6].split("/")
                if parts[0] and (len(parts) == 1 or (len(parts) == 3 and parts[1] == "versions")):
                    _need(req, "POST")
                    return await self._infer(req, parts[0], parts[2] if len(parts) == 3 else "")
            return await self._route(req, [p for p in path.split("/") if p])
        except Exception as exc:  # noqa: BLE001 - a GtServeError's status, anything else logged once, a 500
            return error_response(exc, f"{req.method} {req.path}")

    def _check_auth(self, req: Request) -> None:
        got = req.headers.get("authorization", "").encode("latin-1")
        if not hmac.compare_digest(got, self._auth):
            raise Unauthenticated("missing or invalid bearer token")

    def _body(self, req: Request) -> bytes:
        encoding = req.headers.get("content-encoding")
        if encoding:
            return http_infer.decompress(req.body, encoding, self._max_body_bytes)
        return req.body

    # ---- routing ----
    async def _route(self, req: Request, parts: list[str]) -> Response:
        if not parts or parts[0] != "v2":
            raise NotFound(f"no route for {req.path}")
        rest = parts[1:]
        n = len(rest)
        head = rest[0] if rest else ""
        if n == 0:
            _need(req, "GET")
            return _ok_json(self._dp.server_metadata())
        if head == "health" and n == 2 and rest[1] in ("live", "ready"):
            _need(req, "GET")
            if self._dp.live() if rest[1] == "live" else self._dp.ready():
                return _HEALTHY[rest[1]]
            raise NotReady(f"server is not {rest[1]}")
        if head == "models" and n >= 2:
            return await self._model_route(req, rest[1:])
        if head == "repository":
            return await self._repository_route(req, rest[1:])
        if head in ("systemsharedmemory", "cudasharedmemory"):
            return await self._shm_route(req, head == "cudasharedmemory", rest[1:])
        if head == "trace" and rest[1:] == ["setting"]:
            return await self._trace(req, "")
        if head == "logging" and n == 1:
            return await self._logging(req)
        raise NotFound(f"no route for {req.path}")

    async def _model_route(self, req: Request, parts: list[str]) -> Response:
        dp = self._dp
        if parts == ["stats"]:
            _need(req, "GET")
            return _ok_json(await dp.statistics("", ""))
        name = parts[0]
        version, rest = _split_version(parts[1:])
        if not rest:
            _need(req, "GET")
            return _ok_json(await dp.model_metadata(name, version))
        action = rest[0]
        if len(rest) == 1:
            if action == "ready":
                _need(req, "GET")
                if await dp.model_ready(name, version):
                    return _EMPTY_OK
                raise NotReady(f"model '{name}'{f' version {version}' if version else ''} is not ready")
            if action == "config":
                _need(req, "GET")
                config = await dp.model_config(name, version)
                return _ok_json(model_config_json(config))
            if action == "stats":
                _need(req, "GET")
                return _ok_json(await dp.statistics(name, version))
            if action == "infer":
                _need(req, "POST")
                return await self._infer(req, name, version)
            if action in ("generate", "generate_stream"):  # Triton's generate extension (protocol/http_generate.py)
                _need(req, "POST")
                return await self._generate(req, name, version, action == "generate_stream")
        if rest == ["trace", "setting"]:
            return await self._trace(req, name)
        raise NotFound(f"no route for {req.path}")

    async def _repository_route(self, req: Request, parts: list[str]) -> Response:
        dp = self._dp
        if parts == ["index"]:
            _need(req, "POST", "GET")
            doc = _json_body(self._body(req), "repository index")
            return _ok_json(await dp.repository_index(bool(doc.get("ready", False))))
        if len(parts) == 3 and parts[0] == "models" and parts[2] in ("load", "unload"):
            _need(req, "POST")
            name = parts[1]
            doc = _json_body(self._body(req), parts[2])
            params = doc.get("parameters") or {}
            if not isinstance(params, dict):
                raise InvalidArgument(f"failed to {parts[2]} '{name}': 'parameters' must be a JSON object")
            if parts[2] == "load":
                await dp.load_model(name, _load_parameters(name, params))
            else:
                await dp.unload_model(name, bool(params.get("unload_dependents", False)))
            return _EMPTY_OK
        raise NotFound(f"no route for {req.path}")

    async def _shm_route(self, req: Request, cuda: bool, parts: list[str]) -> Response:
        dp = self._dp
        region = ""
        if len(parts) == 3 and parts[0] == "region":
            region, parts = parts[1], parts[2:]
        if len(parts) != 1:
            raise NotFound(f"no route for {req.path}")
        action = parts[0]
        if action == "status":
            _need(req, "GET")
            return _ok_json(await (dp.cuda_shm_status(region) if cuda else dp.shm_status(region)))
        if action == "unregister":
            _need(req, "POST")
            await (dp.cuda_shm_unregister(region) if cuda else dp.shm_unregister(region))
            return _EMPTY_OK
        if action == "register" and region:
            _need(req, "POST")
            doc = _json_body(self._body(req), "shared memory register")
            what = f"register of shared memory region '{region}'"
            byte_size = _int_field(doc, "byte_size", what)
            if cuda:
                handle = doc.get("raw_handle")
                b64 = handle.get("b64") if isinstance(handle, dict) else None
                if not isinstance(b64, str):
                    raise InvalidArgument(f"{what}: 'raw_handle' must be an object with a base64 'b64' string")
                try:
                    raw = base64.b64decode(b64, validate=True)
                except ValueError:
                    raise InvalidArgument(f"{what}: 'raw_handle.b64' is not valid base64") from None
                device_id = _int_field(doc, "device_id", what, 0)
                await dp.cuda_shm_register(region, raw, device_id, byte_size)
            else:
                key = doc.get("key")
                if not isinstance(key, str) or not key:
                    raise InvalidArgument(f"{what}: 'key' is required")
                offset = _int_field(doc, "offset", what, 0)
                await dp.shm_register(region, key, offset, byte_size)
            return _EMPTY_OK
        raise NotFound(f"no route for {req.path}")

    async def _trace(self, req: Request, model: str) -> Response:
        _need(req, "GET", "POST")
        if model and not await self._dp.model_ready(model, ""):  # Triton's check and words
            raise InvalidArgument(f"Request for unknown model : {model[:256]}")
        if req.method == "POST":
            doc = _json_body(self._body(req), "trace setting")
            current = self._trace_settings.update(model, doc)
            await self._dp.tell_workers("trace_setting", model, doc)
            return _ok_json(current)
        return _ok_json(self._trace_settings.get(model))

    async def _logging(self, req: Request) -> Response:
        _need(req, "GET", "POST")
        if req.method == "POST":
            doc = _json_body(self._body(req), "logging")
            self.apply_logging(doc)
            await self._dp.tell_workers("log_settings", doc)
        return _ok_json(self._log_settings)

    def apply_logging(self, doc: dict) -> dict:
        """Triton's logging settings (POST /v2/logging): `log_verbose_level` > 0 turns debug logging on."""
        for key in doc:
            if key not in self._log_settings:
                raise InvalidArgument(f"unknown logging setting '{key}'")
        self._log_settings.update(doc)
        level = self._log_settings.get("log_verbose_level")
        if isinstance(level, int) and not isinstance(level, bool):
            logging.getLogger("gt_serve").setLevel(logging.DEBUG if level > 0 else logging.NOTSET)
        return self._log_settings

    # ---- inference ----
    async def _infer(self, req: Request, name: str, version: str) -> Response:
        if self._trace_settings.active:  # the one check a request pays with tracing off
            trace = self._tracer.start(name, version, "http", req.headers.get("traceparent"),
                                       req.headers.get("tracestate"))
            if trace is not None:
                return await self._tracer.serve(trace, lambda: self._decode(req, name, version), self._dp.infer,
                                                lambda infer_req, resp: self._encode(req, infer_req, resp))
        infer_req = await self._decode(req, name, version)
        answer = await self._dp.infer(infer_req)
        response = self._encode(req, infer_req, answer)
        if infer_req.form is not None and self._express is not None:  # made from a skeleton: may be planned
            self._express.learn(req, infer_req, answer)
        return response

    async def _decode(self, req: Request, name: str, version: str):
        headers = req.headers
        body = self._body(req) if "content-encoding" in headers else req.body
        header_length = http_infer.parse_header_length(headers.get("inference-header-content-length"), len(body))
        if header_length == 0:
            config = await self._dp.model_config(name, version)
            decode, args = http_infer.decode_raw_request, (name, version, body, config)
        elif len(body) < OFFLOAD_DECODE_BYTES:
            return self._templates.decode(name, version, body, header_length)
        else:
            decode, args = http_infer.decode_request, (name, version, body, header_length)
        if len(body) >= OFFLOAD_DECODE_BYTES:  # up to seconds for the largest JSON bodies: keep the loop serving
            return await asyncio.get_running_loop().run_in_executor(self._decoder, decode, *args)
        return decode(*args)

    async def _generate(self, req: Request, name: str, version: str, streaming: bool) -> Response:
        body = self._body(req)
        args = (name, version, body, await self._dp.model_metadata(name, version))
        if len(body) >= OFFLOAD_DECODE_BYTES:  # as an infer request's: a large JSON body is parsed off the loop
            infer_req = await asyncio.get_running_loop().run_in_executor(self._decoder, decode_generate, *args)
        else:
            infer_req = decode_generate(*args)
        return encode_generate(await self._dp.infer(infer_req), streaming)

    def _encode(self, req: Request, infer_req, resp) -> Response:
        parts, out_headers, heads = self._answers.encode(resp, infer_req)  # out_headers may be shared: copy to change
        accept = req.headers.get("accept-encoding")
        if accept:
            encoding = http_infer.choose_encoding(accept)
            packed = encoding and http_infer.compressed_response(parts, out_headers, encoding, self._compress_min_bytes)
            if packed:
                return packed
        return Response(200, parts if len(parts) > 1 else parts[0], out_headers, heads)


def _load_parameters(name: str, params: dict) -> dict:
    out = {}
    for key, value in params.items():
        if key.startswith("file:"):
            if not isinstance(value, str):
                raise InvalidArgument(f"failed to load '{name}': parameter '{key}' must be a base64 string")
            try:
                out[key] = base64.b64decode(value, validate=True)
            except ValueError:
                raise InvalidArgument(f"failed to load '{name}': parameter '{key}' is not valid base64") from None
        elif key == "config" and isinstance(value, dict):
            out[key] = orjson.dumps(value).decode()
        else:
            out[key] = value
    return out


async def start_http(dataplane, host: str, port: int, *, max_body_bytes: int = 256 * 1024 * 1024,
                     max_connections: int = 1024, auth_token: str | None = None,
                     idle_timeout_s: float = 60.0, header_timeout_s: float = 10.0, body_timeout_s: float = 60.0,
                     compress_min_bytes: int = COMPRESS_MIN_BYTES, tls: TlsFiles | None = None,
                     tracer: RequestTracer | None = None, express: bool = True,
                     reuse_port: bool = False) -> HttpFrontEnd:
    """Build and start the V2 HTTP front end; `.port` is the bound port (port 0 = ephemeral); HTTPS with
    `tls` (bad files: ConfigError naming the file)."""
    ssl_context = server_context(tls, ("http/1.1",)) if tls is not None else None
    front = HttpFrontEnd(dataplane, max_body_bytes=max_body_bytes, max_connections=max_connections,
                         auth_token=auth_token, idle_timeout_s=idle_timeout_s, header_timeout_s=header_timeout_s,
                         body_timeout_s=body_timeout_s, compress_min_bytes=compress_min_bytes, tracer=tracer,
                         express=express)
    await front.start(host, port, ssl_context, reuse_port)
    return front
