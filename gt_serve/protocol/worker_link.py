"""The link between the worker processes of one server (server.workers > 1; gt_serve/supervisor.py starts them).

Every worker serves the same HTTP and gRPC ports (SO_REUSEPORT: the kernel spreads connections over them), so a
client's next connection may reach another worker. What a control call changes must therefore reach all of them:
the worker that receives a model load or unload, or a shared-memory registration, does it, then sends it to every
other worker over this link and answers once they all have; statistics and metrics are gathered from all.

Each worker listens on a unix socket, `worker-<index>.sock`, in the group's directory (the supervisor makes it,
mode 0700: only this user reaches it). A call is one connection: a frame out, a frame back. A frame is a 4-byte
big-endian length and a JSON object; bytes travel as {"$b": base64}. An error comes back as its code, kind and
message and is raised again here as a GtServeError that names the worker.
"""
from __future__ import annotations

import asyncio
import base64
import inspect
import os
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ..errors import Code, GtServeError, Unavailable

ENV_DIR, ENV_INDEX, ENV_COUNT = "GT_WORKER_DIR", "GT_WORKER_INDEX", "GT_WORKER_COUNT"
_FRAME = struct.Struct(">I")
READY_OP = "ready"

Handler = Callable[..., Any]  # a plain function or a coroutine function


@dataclass(frozen=True)
class WorkerSpec:
    """Which worker this process is: its index among `count`, and the group's directory."""

    directory: Path
    index: int
    count: int

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> WorkerSpec | None:
        if ENV_DIR not in environ:
            return None
        return cls(Path(environ[ENV_DIR]), int(environ[ENV_INDEX]), int(environ[ENV_COUNT]))

    def socket_path(self, index: int) -> Path:
        return self.directory / f"worker-{index}.sock"

    def environ(self) -> dict[str, str]:
        return {ENV_DIR: str(self.directory), ENV_INDEX: str(self.index), ENV_COUNT: str(self.count)}

    @property
    def peers(self) -> list[int]:
        return [i for i in range(self.count) if i != self.index]


def _encode(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$b": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if len(value) == 1 and "$b" in value:
            return base64.b64decode(value["$b"])
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


async def _write_frame(writer: asyncio.StreamWriter, message: dict) -> None:
    body = orjson.dumps(_encode(message))
    writer.write(_FRAME.pack(len(body)) + body)
    await writer.drain()


async def _read_frame(reader: asyncio.StreamReader) -> dict:
    (size,) = _FRAME.unpack(await reader.readexactly(_FRAME.size))
    return _decode(orjson.loads(await reader.readexactly(size)))


def _error_frame(exc: BaseException) -> dict:
    if isinstance(exc, GtServeError):
        return {"error": {"code": exc.code.value, "kind": exc.kind, "message": exc.message}}
    return {"error": {"code": Code.INTERNAL.value, "kind": "", "message": f"{type(exc).__name__}: {exc}"}}


def _raise_error(index: int, error: dict) -> None:
    exc = GtServeError(f"worker {index}: {error.get('message', '')}", code=Code(error.get("code", "INTERNAL")))
    exc.kind = error.get("kind", "")
    raise exc


class WorkerLink:
    """This worker's end of the link: serves the calls of the others (`handle(op, fn)` names what may be
    called) and makes calls to them (`broadcast`: a change told to all, or a read gathered from all).
    `peers_ready` is set once every other worker has said it is ready (`all_ready`): a worker reports ready only
    then, so that no connection the kernel gives to a worker still loading its models sees a model missing."""

    def __init__(self, spec: WorkerSpec, connect_timeout_s: float = 120.0) -> None:
        self.spec = spec
        self._handlers: dict[str, Handler] = {READY_OP: self._peer_ready}
        self._connect_timeout_s = connect_timeout_s
        self._server: asyncio.AbstractServer | None = None
        self._ready_peers: set[int] = set()
        self.peers_ready = asyncio.Event()
        if not spec.peers:
            self.peers_ready.set()

    @property
    def index(self) -> int:
        return self.spec.index

    def handle(self, op: str, fn: Handler) -> None:
        self._handlers[op] = fn

    async def start(self) -> None:
        path = self.spec.socket_path(self.spec.index)
        path.unlink(missing_ok=True)
        self._server = await asyncio.start_unix_server(self._serve, path=str(path))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self.spec.socket_path(self.spec.index).unlink(missing_ok=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await _read_frame(reader)
            handler = self._handlers.get(request.get("op", ""))
            try:
                if handler is None:
                    raise GtServeError(f"unknown worker call {request.get('op')!r}")
                result = handler(*request.get("args", ()))
                reply = {"result": await result if inspect.isawaitable(result) else result}
            except Exception as exc:  # the caller gets it as its error
                reply = _error_frame(exc)
            await _write_frame(writer, reply)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _peer_ready(self, index: int) -> None:
        self._ready_peers.add(int(index))
        if self._ready_peers >= set(self.spec.peers):
            self.peers_ready.set()

    async def all_ready(self) -> bool:
        """Tell every other worker this one is ready (its start-up models loaded), then wait until all have
        said so; True then."""
        await self.broadcast(READY_OP, self.spec.index)
        await self.peers_ready.wait()
        return True

    async def broadcast(self, op: str, *args: Any) -> list:
        """`op(*args)` on every other worker, at once; their results in index order. The first worker's error
        is raised (after all have answered: none is left half-way)."""
        replies = await asyncio.gather(*(self._call(i, op, args) for i in self.spec.peers))
        for index, reply in zip(self.spec.peers, replies):
            if "error" in reply:
                _raise_error(index, reply["error"])
        return [reply["result"] for reply in replies]

    async def everyone(self, here: Any, op: str, *args: Any) -> list:
        """Every worker's answer in worker order: this one's (`here`) among the others' to `op(*args)`."""
        others = await self.broadcast(op, *args)
        return [*others[:self.index], here, *others[self.index:]]

    async def _connect(self, index: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A worker that is still starting has no socket yet: wait for it, up to connect_timeout_s."""
        path, deadline, delay = str(self.spec.socket_path(index)), time.monotonic() + self._connect_timeout_s, 0.01
        while True:
            try:
                return await asyncio.open_unix_connection(path)
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                if time.monotonic() >= deadline:
                    raise Unavailable(f"worker {index} cannot be reached: {exc.strerror}") from None
            await asyncio.sleep(delay)  # a peer starting up: retry with a growing backoff
            delay = min(delay * 2, 0.5)

    async def _call(self, index: int, op: str, args: tuple) -> dict:
        reader, writer = await self._connect(index)
        try:
            await _write_frame(writer, {"op": op, "args": list(args)})
            return await _read_frame(reader)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise Unavailable(f"worker {index} closed the link during '{op}': {exc}") from None
        finally:
            writer.close()
