"""Request skeletons, reused: the JSON part of a binary-extension infer request, decoded once per distinct text.

A client sends the same JSON part over and over (perf_analyzer, tritonclient with fixed shapes: the
same names, datatypes, shapes, binary sizes and requested outputs); only the binary data after it
changes. The first request with a given JSON part is decoded and checked in full
(`http_infer.decode_request`). When every input is binary and fixed-size, or names a shared-memory
region (perf_analyzer `--shared-memory system`), and the request sets no timeout, its skeleton is
kept under the JSON part's bytes, and a later request whose JSON part is byte-for-byte the same only
wraps its binary parts as arrays: no JSON parsing and no per-field checks, which were ~10 µs of the
~80 µs of Python a small request cost (issue #17).
Anything else, or a body whose binary part has another length, takes the full path, which names
what is wrong. Bounded: a full table starts over.

The skeletons themselves and their table are protocol/request_forms.py, shared with the gRPC templates
(protocol/grpc_templates.py); a skeleton is its requests' `form`, which the data plane checks once per model.

Answers the same way (`AnswerTemplates`): when every output that holds data goes back binary (or was written to
shared memory), the JSON part of the answer is a function of the model, version, id, the outputs' names, datatypes
and shapes (and regions) and what the request asked for, so it is encoded once per such key
(`http_infer.encode_response` on a miss) and the HTTP headers with it; an answer then costs its outputs' raw views.

Request ids (perf_analyzer `--async` numbers its requests; a tritonclient user may give each its own): a JSON part
that opens with a plain id (request_forms.json_id) is keyed without the id's value and its requests get their own;
an answer with a plain id is keyed by the id's length, its template kept around the id, and the id put back in.
"""
from __future__ import annotations

import orjson

from ..types import InferRequest, InferResponse
from .codec import BINARY_DATA_SIZE, raw_from_array
from .http_infer import decode_request, encode_response
from .request_forms import SkeletonTable, answer_key, in_shared_memory, json_id, with_id


class RequestTemplates:
    """One front end's table of skeletons (touched on the event loop only), keyed by the JSON part."""

    def __init__(self, capacity: int = 256, max_json_bytes: int = 4096) -> None:
        self.max_json_bytes = max_json_bytes
        self._table = SkeletonTable(capacity)

    @property
    def hits(self) -> int:
        return self._table.hits

    @property
    def kept(self) -> int:
        return len(self._table)

    def decode(self, model_name: str, version: str, body, header_length: int | None) -> InferRequest:
        """As http_infer.decode_request (same result, same errors)."""
        if header_length is None or header_length > self.max_json_bytes:
            return decode_request(model_name, version, body, header_length)
        key = bytes(body[:header_length])
        request_id = None
        keyed = json_id(key)
        if keyed is not None:  # an id of its own: the form is keyed without it
            key, request_id = keyed
        skeleton = self._table.get(key)
        if skeleton is None or len(body) - header_length != skeleton.total:
            request = decode_request(model_name, version, body, header_length)
            if skeleton is None:
                self._learn(key, request, len(body) - header_length, request_id)
            return request
        self._table.hits += 1
        return skeleton.request(model_name, version, body, [header_length + o for o in skeleton.offsets], request_id)

    def _learn(self, key: bytes, request: InferRequest, binary_bytes: int, request_id: str | None) -> None:
        if request.deadline_s is not None:  # a timeout counts from each request's arrival
            return
        if request_id is not None and request.id != request_id:  # not read as json_id reads it: not kept
            return
        # binary inputs follow each other; an input in shared memory has no part
        sizes = [t.parameters.get(BINARY_DATA_SIZE) for t in request.inputs if not in_shared_memory(t)]
        if None not in sizes and sum(sizes) == binary_bytes:
            self._table.learn(key, request, sizes)


class AnswerTemplates:
    """One front end's table of answer JSON parts and headers (touched on the event loop only). A template is
    (the JSON part before the id, after it or None when the JSON part is the whole answer's, the headers, the
    `Response.heads` dict): a plain id (request_forms.plain_id) is put back in each answer, any other is in the key."""

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self._answers: dict[tuple, tuple[bytes, bytes | None, dict, dict]] = {}
        self.hits = 0

    def encode(self, resp: InferResponse, req: InferRequest) -> tuple[list, dict, dict | None]:
        """(body parts: the JSON part, then the binary blobs; the response headers, shared: copy to change; the
        `Response.heads` dict of the answers alike, or None)."""
        key = self._key(resp, req)
        if key is not None:
            known = self._answers.get(key)
            if known is not None:
                self.hits += 1
                before, after, headers, heads = known
                return [with_id(before, after, resp.id),
                        *[raw_from_array(t.data, t.datatype) for t in resp.outputs
                          if t.data is not None and t.data.size]], headers, heads
        parts, json_bytes = encode_response(resp, req)
        if json_bytes is None:
            headers = {"Content-Type": "application/json"}
            if key is None or any(t.data is not None for t in resp.outputs):  # JSON data
                return parts, headers, None
            # else every output went to shared memory: the answer is its JSON part alone
        else:
            headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(json_bytes)}
            if key is None or len(parts) - 1 != sum(1 for t in resp.outputs if t.data is not None and t.data.size):
                return parts, headers, None  # not all binary
        around = _around_id(parts[0], resp, isinstance(key[0][2], int))
        if around is None:
            return parts, headers, None
        if len(self._answers) >= self.capacity:
            self._answers.clear()
        heads: dict = {}
        self._answers[key] = (*around, headers, heads)
        return parts, headers, heads

    def template(self, resp: InferResponse, req: InferRequest) -> tuple | None:
        """The template kept for answers like `resp` to `req` (after `encode` gave them a `heads` dict)."""
        key = self._key(resp, req)
        return None if key is None else self._answers.get(key)

    @staticmethod
    def _key(resp: InferResponse, req: InferRequest) -> tuple | None:
        key = answer_key(resp)
        if key is None:
            return None
        params = req.parameters
        # as encode_response reads them: a flag's truth, whatever JSON value carries it (a list is not hashable)
        asked = tuple((o.name, _flag(o.parameters.get("binary_data"))) for o in req.outputs) if req.outputs else None
        return key, asked, bool(params.get("binary_data_output", False)) if params else False


def _around_id(json_part: bytes, resp: InferResponse, plain: bool) -> tuple[bytes, bytes | None] | None:
    """(the JSON part up to a plain id's value, after it) of an answer with a plain id (`plain`: its key's id class
    says so), where encode_response writes it (after model_name and model_version); (the JSON part, None) for an
    answer with another id, or none."""
    if not plain or not resp.id:
        return json_part, None
    before = orjson.dumps({"model_name": resp.model_name, "model_version": resp.model_version})[:-1] + b',"id":"'
    raw = resp.id.encode()
    if not json_part.startswith(before + raw + b'"'):
        return None
    return before, json_part[len(before) + len(raw):]


def _flag(value) -> bool | None:
    return None if value is None else bool(value)
