"""KServe's own V2 clients (the `kserve` SDK's InferenceRESTClient and InferenceGRPCClient) against gt-serve: run by
tests/tools/test_kserve_sdk.py with the Python of the client SDKs' venv
(tests/tools/client_sdks.py), never imported by pytest.

    python kserve_sdk_client.py rest|grpc HOST:PORT

Prints one JSON object of what the server answered; the test asserts on it."""
from __future__ import annotations

import asyncio
import json
import sys

import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig
from kserve.protocol.infer_type import RequestedOutput


def simple_request(binary: bool, *, width: int = 16, outputs=None, parameters=None,
                   model: str = "simple") -> InferRequest:
    inputs = []
    for name, data in (("INPUT0", np.arange(width, dtype=np.int32)), ("INPUT1", np.full(width, 2, np.int32))):
        tensor = InferInput(name, [1, width], "INT32")
        tensor.set_data_from_numpy(data.reshape(1, width), binary_data=binary)
        inputs.append(tensor)
    return InferRequest(model_name=model, infer_inputs=inputs, request_id="kserve-1", request_outputs=outputs,
                        parameters=parameters)


def strings_request(binary: bool) -> InferRequest:
    tensor = InferInput("INPUT", [1, 3], "BYTES")
    tensor.set_data_from_numpy(np.array([["alpha", "", "gamma ray"]], dtype=object), binary_data=binary)
    return InferRequest(model_name="strings", infer_inputs=[tensor])


def outputs_of(response) -> dict:
    return {o.name: [v.decode() if isinstance(v, bytes) else v for v in o.as_numpy().ravel().tolist()]
            for o in response.outputs}


async def error_of(call) -> str:
    try:
        await call
    except Exception as exc:  # the SDK's own exception: httpx.HTTPStatusError, grpc.aio.AioRpcError
        details = getattr(exc, "details", None)
        return details() if callable(details) else str(exc)
    return ""


async def rest(url: str) -> dict:
    base = f"http://{url}"
    async with InferenceRESTClient(RESTConfig(protocol="v2", retries=0)) as client:
        def infer(request, model="simple"):
            return client.infer(base, request, model_name=model)
        subset = [RequestedOutput("OUTPUT1", parameters={"binary_data": True})]
        return {
            "live": await client.is_server_live(base),
            "ready": await client.is_server_ready(base),
            "model_ready": await client.is_model_ready(base, "simple"),
            "missing_ready": await client.is_model_ready(base, "no_such_model"),
            "json": outputs_of(await infer(simple_request(False))),
            "binary": outputs_of(await infer(simple_request(True, parameters={"binary_data_output": True}))),
            "id": (await infer(simple_request(True))).id,
            "subset": outputs_of(await infer(simple_request(True, outputs=subset))),
            "strings_json": outputs_of(await infer(strings_request(False), "strings")),
            "strings_binary": outputs_of(await infer(strings_request(True), "strings")),
            "error_model": await error_of(infer(simple_request(False, model="no_such_model"), "no_such_model")),
            "error_shape": await error_of(infer(simple_request(False, width=15))),
        }


async def grpc(url: str) -> dict:
    client = InferenceGRPCClient(url, verbose=False)
    try:
        return {
            "live": await client.is_server_live(),
            "ready": await client.is_server_ready(),
            "model_ready": await client.is_model_ready("simple"),
            "binary": outputs_of(await client.infer(simple_request(True))),
            "id": (await client.infer(simple_request(True))).id,
            "strings_binary": outputs_of(await client.infer(strings_request(True))),
            "error_model": await error_of(client.infer(simple_request(True, model="no_such_model"))),
            "error_shape": await error_of(client.infer(simple_request(True, width=15))),
        }
    finally:
        await client.close()


if __name__ == "__main__":
    mode, address = sys.argv[1], sys.argv[2]
    print(json.dumps(asyncio.run(rest(address) if mode == "rest" else grpc(address))))
