"""PyTriton's client (nvidia-pytriton's ModelClient, FuturesModelClient and AsyncioModelClient) against gt-serve:
run by tests/tools/test_pytriton_client.py with the Python of the client SDKs' venv (tests/tools/client_sdks.py),
never imported by pytest. PyTriton users point it at a Triton server; it reads the model's config (each instance
group's kind, max_batch_size, the inputs) before its first request.

    python pytriton_client.py http://HOST:PORT | grpc://HOST:PORT

Prints one JSON object of what the server answered; the test asserts on it."""
from __future__ import annotations

import asyncio
import json
import sys
import warnings

import numpy as np
from pytriton.client import AsyncioModelClient, FuturesModelClient, ModelClient

TIMEOUT_S = 30.0


def lists(result: dict) -> dict:
    return {name: [v.decode() if isinstance(v, bytes) else v for v in array.ravel().tolist()]
            for name, array in result.items()}


def error_of(call) -> str:
    try:
        call()
    except Exception as exc:  # PyTriton's own exceptions
        return f"{type(exc).__name__}: {exc}"
    return ""


async def asyncio_infer(url: str) -> dict:
    async with AsyncioModelClient(url, "simple", init_timeout_s=TIMEOUT_S) as client:
        return lists(await client.infer_sample(INPUT0=np.arange(16, dtype=np.int32), INPUT1=np.ones(16, np.int32)))


def main(url: str) -> dict:
    out = {}
    batch = {"INPUT0": np.arange(32, dtype=np.int32).reshape(2, 16), "INPUT1": np.ones((2, 16), np.int32)}
    with ModelClient(url, "simple", init_timeout_s=TIMEOUT_S) as client:
        config = client.model_config
        out["config"] = {"max_batch_size": config.max_batch_size, "inputs": [i.name for i in config.inputs],
                         "kinds": sorted(str(kind) for kind in config.instance_group)}
        out["batch"] = lists(client.infer_batch(**batch))
        out["sample"] = lists(client.infer_sample(INPUT0=np.arange(16, dtype=np.int32), INPUT1=np.ones(16, np.int32)))
        out["error_shape"] = error_of(lambda: client.infer_batch(INPUT0=batch["INPUT0"][:, :15],
                                                                 INPUT1=batch["INPUT1"][:, :15]))
    with ModelClient(url, "strings", init_timeout_s=TIMEOUT_S) as client:
        out["strings"] = lists(client.infer_batch(INPUT=np.array([[b"alpha", b"", b"gamma ray"]], dtype=object)))
    with ModelClient(url, "classifier", init_timeout_s=TIMEOUT_S) as client:  # inputs by position
        out["classifier_shape"] = list(client.infer_batch(np.zeros((3, 8), np.float32))["OUTPUT"].shape)
    with FuturesModelClient(url, "simple", init_timeout_s=TIMEOUT_S) as client:
        out["futures"] = lists(client.infer_batch(**batch).result(timeout=TIMEOUT_S))
    out["asyncio"] = asyncio.run(asyncio_infer(url))
    return out


if __name__ == "__main__":
    warnings.simplefilter("ignore")  # PyTriton warns that its network timeout exceeds init_timeout_s
    print(json.dumps(main(sys.argv[1])))
