"""Locust load test for any KServe V2 / Triton inference server (gt_serve, Triton, MLServer, ...).

Two user classes drive the same model through the real tritonclient libraries:

* ``V2HttpUser``: ``tritonclient.http`` (binary tensor extension) against the locust ``--host``;
* ``V2GrpcUser``: ``tritonclient.grpc`` against ``GT_GRPC_URL`` (default: the ``--host`` name with
  port ``GT_GRPC_PORT``, 8001).

Each user reads the model metadata (and config, for ``max_batch_size``) once in ``on_start``, builds a
small pool of random input sets that match every input's datatype and shape (batch dimension
``-1`` becomes ``GT_BATCH_SIZE``, other ``-1`` dimensions ``GT_DYNAMIC_DIM``), then sends infer
requests back to back. Every call is reported to locust's ``request`` event; a wrong or missing output
counts as a failure. For the ``simple`` model the answers are checked too
(OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1), which catches requests mixed up by batching.

    locust -f tests/load/locustfile.py --headless -u 50 -r 10 -t 30s --host http://127.0.0.1:8000
    locust -f tests/load/locustfile.py --headless -u 8 -r 8 -t 30s --host http://127.0.0.1:8000 V2GrpcUser

Environment: GT_MODEL (simple), GT_MODEL_VERSION (""), GT_GRPC_URL (host:port), GT_GRPC_PORT (8001),
GT_BATCH_SIZE (1), GT_DYNAMIC_DIM (1), GT_POOL_SIZE (8), GT_VERIFY (auto | 1 | 0),
GT_REQUEST_TIMEOUT_S (30), GT_WAIT_S (0: no think time between requests).
"""

from __future__ import annotations

import itertools
import os
import random
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import grpc.experimental.gevent as grpc_gevent
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from locust import User, constant, events, task
from locust.exception import StopUser
from tritonclient.utils import triton_to_np_dtype

# gRPC's C core must cooperate with gevent (locust monkey-patched the stdlib before loading this
# file); this has to run before any channel exists.
grpc_gevent.init_gevent()

MODEL_NAME = os.environ.get("GT_MODEL", "simple")
MODEL_VERSION = os.environ.get("GT_MODEL_VERSION", "")
BATCH_SIZE = int(os.environ.get("GT_BATCH_SIZE", "1"))
DYNAMIC_DIM = int(os.environ.get("GT_DYNAMIC_DIM", "1"))
POOL_SIZE = max(1, int(os.environ.get("GT_POOL_SIZE", "8")))
REQUEST_TIMEOUT_S = float(os.environ.get("GT_REQUEST_TIMEOUT_S", "30"))
WAIT_S = float(os.environ.get("GT_WAIT_S", "0"))
VERIFY = os.environ.get("GT_VERIFY", "auto")


# ---------------------------------------------------------------- model description and data


@dataclass(frozen=True)
class TensorMeta:
    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ModelSpec:
    """What a user needs to build requests: inputs with concrete shapes and the output names."""

    name: str
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[str, ...]
    verify_simple: bool

    @classmethod
    def from_metadata(
        cls,
        name: str,
        inputs: list[tuple[str, str, list[int]]],
        outputs: list[str],
        max_batch_size: int | None,
    ) -> ModelSpec:
        """``max_batch_size`` None = config unavailable: a leading -1 is taken as the batch dim."""
        concrete = []
        for input_name, datatype, shape in inputs:
            # without the config, a leading -1 is taken for the batch dimension
            batched = max_batch_size > 0 if max_batch_size is not None else bool(shape) and shape[0] == -1
            dims = [DYNAMIC_DIM if dim < 0 else dim for dim in shape]
            if batched:
                dims[0] = BATCH_SIZE
            concrete.append(TensorMeta(input_name, datatype, tuple(dims)))
        names = {tensor.name for tensor in concrete}
        looks_simple = names == {"INPUT0", "INPUT1"} and {"OUTPUT0", "OUTPUT1"} <= set(outputs)
        verify = VERIFY == "1" or (VERIFY == "auto" and name == "simple" and looks_simple)
        return cls(name, tuple(concrete), tuple(outputs), verify)

    def random_inputs(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {tensor.name: _random_array(tensor, rng) for tensor in self.inputs}

    def check(self, sent: dict[str, np.ndarray], received: Callable[[str], np.ndarray | None]) -> int:
        """Raise AssertionError on a missing or wrong output; return the received payload size."""
        arrays = {}
        for output in self.outputs:
            array = received(output)
            if array is None:
                raise AssertionError(f"output {output!r} missing from the response")
            arrays[output] = array
        if self.verify_simple:
            a, b = sent["INPUT0"], sent["INPUT1"]
            for output, expected in (("OUTPUT0", a + b), ("OUTPUT1", a - b)):
                got = arrays[output]
                if got.shape != expected.shape or not np.array_equal(got, expected):
                    raise AssertionError(f"{output} is not the expected value for this request")
        return sum(_payload_size(array) for array in arrays.values())


def _random_array(tensor: TensorMeta, rng: np.random.Generator) -> np.ndarray:
    if tensor.datatype == "BYTES":
        values = rng.integers(0, 1_000_000, size=tensor.shape)
        return np.vectorize(lambda v: str(v).encode(), otypes=[object])(values)
    dtype = triton_to_np_dtype(tensor.datatype)
    if dtype is None:
        raise ValueError(f"input {tensor.name!r}: unsupported datatype {tensor.datatype}")
    if dtype == np.bool_:
        return rng.integers(0, 2, size=tensor.shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        # small values: add/sub style models must not overflow int8 or underflow unsigned types
        return rng.integers(0, 50, size=tensor.shape).astype(dtype)
    return rng.random(size=tensor.shape).astype(dtype)


def _payload_size(array: np.ndarray) -> int:
    if array.dtype == np.object_:
        return sum(len(item) for item in array.flat)
    return int(array.nbytes)


def _http_target(host: str | None) -> tuple[str, bool]:
    if not host:
        raise ValueError("no host: pass --host http://HOST:PORT to locust")
    parts = urlsplit(host if "://" in host else f"http://{host}")
    return parts.netloc, parts.scheme == "https"


def _grpc_target(host: str | None) -> str:
    explicit = os.environ.get("GT_GRPC_URL")
    if explicit:
        return explicit.split("://", 1)[-1]
    if not host:
        raise ValueError("set GT_GRPC_URL=HOST:PORT or pass --host to locust")
    parts = urlsplit(host if "://" in host else f"http://{host}")
    return f"{parts.hostname}:{os.environ.get('GT_GRPC_PORT', '8001')}"


# ---------------------------------------------------------------- users


class _V2User(User):
    """Shared loop: pick the next input set, infer, check, report."""

    abstract = True
    wait_time = constant(WAIT_S)
    request_type = "V2"

    def on_start(self) -> None:
        self._rng = np.random.default_rng(random.SystemRandom().getrandbits(64))
        started = time.perf_counter()
        try:
            self._connect()
            self.spec = self._model_spec()
        except Exception as exc:  # report, then retire this user: nothing to send without metadata
            self._report(f"metadata {MODEL_NAME}", started, 0, exc)
            raise StopUser() from exc
        self._report(f"metadata {MODEL_NAME}", started, 0, None)
        self._pool = [self.spec.random_inputs(self._rng) for _ in range(POOL_SIZE)]
        self._next: Iterator[dict[str, np.ndarray]] = itertools.cycle(self._pool)

    def on_stop(self) -> None:
        client = getattr(self, "client", None)
        if client is not None:
            client.close()

    @task
    def infer(self) -> None:
        sent = next(self._next)
        started = time.perf_counter()
        size = 0
        exception: Exception | None = None
        try:
            size = self._infer(sent)
        except Exception as exc:  # every failure is a locust failure, never a crashed user
            exception = exc
        self._report(f"infer {MODEL_NAME}", started, size, exception)

    def _report(self, name: str, started: float, size: int, exception: Exception | None) -> None:
        self.environment.events.request.fire(
            request_type=self.request_type,
            name=name,
            response_time=(time.perf_counter() - started) * 1000.0,
            response_length=size,
            exception=exception,
            context={},
        )

    def _connect(self) -> None:
        raise NotImplementedError

    def _model_spec(self) -> ModelSpec:
        raise NotImplementedError

    def _infer(self, sent: dict[str, np.ndarray]) -> int:
        raise NotImplementedError


class V2HttpUser(_V2User):
    request_type = "HTTP"

    def _connect(self) -> None:
        url, use_ssl = _http_target(self.host)
        self.client: Any = httpclient.InferenceServerClient(
            url, concurrency=1, ssl=use_ssl, network_timeout=REQUEST_TIMEOUT_S
        )

    def _model_spec(self) -> ModelSpec:
        metadata = self.client.get_model_metadata(MODEL_NAME, MODEL_VERSION)
        try:
            max_batch_size = int(self.client.get_model_config(MODEL_NAME, MODEL_VERSION).get("max_batch_size", 0))
        except Exception:  # the config route is a Triton extension; metadata alone still works
            max_batch_size = None
        inputs = [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in metadata["inputs"]]
        outputs = [t["name"] for t in metadata["outputs"]]
        self._requested = [httpclient.InferRequestedOutput(name, binary_data=True) for name in outputs]
        return ModelSpec.from_metadata(MODEL_NAME, inputs, outputs, max_batch_size)

    def _infer(self, sent: dict[str, np.ndarray]) -> int:
        inputs = []
        for tensor in self.spec.inputs:
            infer_input = httpclient.InferInput(tensor.name, list(tensor.shape), tensor.datatype)
            infer_input.set_data_from_numpy(sent[tensor.name], binary_data=True)
            inputs.append(infer_input)
        result = self.client.infer(
            MODEL_NAME, inputs, model_version=MODEL_VERSION, outputs=self._requested
        )
        return self.spec.check(sent, result.as_numpy)


class _GrpcClient(grpcclient.InferenceServerClient):
    """tritonclient's gRPC client, closed once however often close() is called.

    tritonclient's ``__del__`` closes the client again after ``on_stop`` did. That second close runs when the
    interpreter exits, and under gevent it can block for ever on a lock of grpc's gevent channel count that no thread
    is left to release (a grpc thread stopped by the exit, as far as we can tell): locust prints its summary and never
    returns (2 of 104 runs; docs/DESIGN-NOTES.md, "Thirty-seventh pass").
    """

    _closed = False

    def __init__(self, url: str) -> None:
        super().__init__(url)
        _GRPC_CLIENTS.add(self)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            super().close()


_GRPC_CLIENTS: weakref.WeakSet[_GrpcClient] = weakref.WeakSet()


@events.quit.add_listener
def _close_grpc_clients(**_kwargs: Any) -> None:
    """Close what on_stop did not, while grpc's threads still run (locust fires quit just before it exits)."""
    for client in list(_GRPC_CLIENTS):
        client.close()


class V2GrpcUser(_V2User):
    request_type = "gRPC"

    def _connect(self) -> None:
        self.client: Any = _GrpcClient(_grpc_target(self.host))

    def _model_spec(self) -> ModelSpec:
        metadata = self.client.get_model_metadata(MODEL_NAME, MODEL_VERSION, client_timeout=REQUEST_TIMEOUT_S)
        try:
            config = self.client.get_model_config(MODEL_NAME, MODEL_VERSION, client_timeout=REQUEST_TIMEOUT_S)
            max_batch_size = int(config.config.max_batch_size)
        except Exception:  # optional extension, as for HTTP
            max_batch_size = None
        inputs = [(t.name, t.datatype, [int(d) for d in t.shape]) for t in metadata.inputs]
        outputs = [t.name for t in metadata.outputs]
        self._requested = [grpcclient.InferRequestedOutput(name) for name in outputs]
        return ModelSpec.from_metadata(MODEL_NAME, inputs, outputs, max_batch_size)

    def _infer(self, sent: dict[str, np.ndarray]) -> int:
        inputs = []
        for tensor in self.spec.inputs:
            infer_input = grpcclient.InferInput(tensor.name, list(tensor.shape), tensor.datatype)
            infer_input.set_data_from_numpy(sent[tensor.name])
            inputs.append(infer_input)
        result = self.client.infer(
            MODEL_NAME,
            inputs,
            model_version=MODEL_VERSION,
            outputs=self._requested,
            client_timeout=REQUEST_TIMEOUT_S,
        )
        return self.spec.check(sent, result.as_numpy)
