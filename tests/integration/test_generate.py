"""Triton's generate extension on a real server (HTTP): a flat JSON object in, the model's outputs by name out, over
/generate and /generate_stream (one Server-Sent Event), with the model's version in the path or not; bad requests get
a 400 naming the problem, and the model's statistics count every request."""
from __future__ import annotations

import http.client
import json

import pytest

TIMEOUT_S = 30.0


def _post(server, path: str, body) -> tuple[int, dict, bytes]:
    host, port = server.http_url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
    try:
        conn.request("POST", path, body=body if isinstance(body, bytes) else json.dumps(body).encode(),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _successes(server, model: str) -> int:
    host, port = server.http_url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
    try:
        conn.request("GET", f"/v2/models/{model}/stats")
        (entry,) = json.loads(conn.getresponse().read())["model_stats"]
        return entry["inference_stats"]["success"]["count"]
    finally:
        conn.close()


def test_generate_maps_keys_to_inputs_and_outputs_to_keys(server):
    before = _successes(server, "simple")
    status, headers, body = _post(server, "/v2/models/simple/generate",
                                  {"INPUT0": list(range(16)), "parameters": {"INPUT1": [1] * 16, "temperature": 0}})
    assert status == 200 and headers["content-type"] == "application/json", body
    assert json.loads(body) == {"model_name": "simple", "model_version": "1", "OUTPUT0": list(range(1, 17)),
                                "OUTPUT1": list(range(-1, 15))}
    assert _successes(server, "simple") == before + 1


def test_a_string_model_answers_a_string(server):
    status, _, body = _post(server, "/v2/models/strings/generate", {"INPUT": "hello gt-serve"})
    assert status == 200 and json.loads(body)["OUTPUT"] == "hello gt-serve", body


def test_generate_stream_sends_one_event(server):
    status, headers, body = _post(server, "/v2/models/versioned/versions/3/generate_stream", {"INPUT": [1, 2, 3, 4]})
    assert status == 200 and headers["content-type"] == "text/event-stream; charset=utf-8", body
    assert body.startswith(b"data: ") and body.endswith(b"\n\n") and body.count(b"data: ") == 1
    assert json.loads(body[6:]) == {"model_name": "versioned", "model_version": "3", "OUTPUT": [3.0, 6.0, 9.0, 12.0]}


@pytest.mark.parametrize("path,body,words", [
    ("/v2/models/identity_fp32/generate", {"INPUT": [1, 2, 3]}, "input 'INPUT'"),  # 3 elements for [-1, 4]
    ("/v2/models/simple/generate", {"INPUT0": list(range(16))}, "INPUT1"),  # an input left out
    ("/v2/models/simple/generate", {"INPUT0": list(range(16)), "INPUT1": [1] * 16, "extra": [1]}, "'extra'"),
    ("/v2/models/simple/generate", b"{not json", "failed to parse"),
    ("/v2/models/nope/generate", {"x": 1}, "nope"),
])
def test_bad_generate_requests_get_a_400_naming_the_problem(server, path, body, words):
    status, headers, payload = _post(server, path, body)
    assert status == 400 and headers["content-type"] == "application/json", payload
    assert words in json.loads(payload)["error"]
    status, _, payload = _post(server, "/v2/models/identity_fp32/generate", {"INPUT": [1, 2, 3, 4]})
    assert status == 200 and json.loads(payload)["OUTPUT"] == [2.0, 4.0, 6.0, 8.0]  # and the others are served
