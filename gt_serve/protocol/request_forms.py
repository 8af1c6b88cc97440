"""Request skeletons, shared by the HTTP and gRPC request templates: what stays the same between requests whose
encoded text, apart from the input data, is byte-for-byte the same.

A client sends the same request over and over with new data (perf_analyzer, tritonclient with fixed shapes:
the same names, datatypes, shapes, data sizes and requested outputs). The first such request is decoded and
checked in full by the front end's own decoder. When every input holds fixed-size data in the message or names
a system shared-memory region (not BYTES) and the request sets no timeout of its own, its `Skeleton` is kept under the
encoded text that is not data (the key is the front end's: the JSON part of an HTTP request, the fields before
`raw_input_contents` of a gRPC one), and a later request with that key only wraps its data as arrays. An input in
shared memory keeps its region's parameters and no data: the data plane reads the region for each request.

A skeleton's per-tensor parameter dicts and requested outputs are shared by the requests made from it and are
read-only downstream; each request gets its own `parameters` dict and lists. The skeleton is the requests'
`form` (types.InferRequest.form): the data plane checks a form once per model.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..types import InferRequest, InferResponse, Tensor
from .codec import SHM_REGION, numpy_dtype


class Skeleton:
    __slots__ = ("model_name", "version", "inputs", "outputs", "params", "request_id", "priority", "sizes", "offsets",
                 "total", "in_shm")

    def __init__(self, request: InferRequest, inputs: list, sizes: tuple[int, ...]) -> None:
        self.model_name = request.model_name
        self.version = request.model_version
        self.inputs = inputs  # (name, datatype, shape, parameters, numpy dtype or None in shared memory, elements)
        self.outputs = None if request.outputs is None else list(request.outputs)  # not the first request's list
        self.params = dict(request.parameters)
        self.request_id = request.id
        self.priority = request.priority
        self.sizes = sizes  # the data size in bytes of each input with data in the message, in order
        self.offsets = tuple(sum(sizes[:i]) for i in range(len(sizes)))  # where each lies when they follow each other
        self.total = sum(sizes)
        self.in_shm = any(entry[4] is None for entry in inputs)

    def request(self, model_name: str, version: str, buffer: Any, starts: Sequence[int],
                request_id: str | None = None) -> InferRequest:
        """A request of this form for `model_name` / `version` whose inputs' data lie in `buffer` at `starts`
        (in input order; inputs in shared memory have none), with id `request_id` (a form keyed without its id:
        `json_id`, grpc_templates.split_message) or the first request's."""
        if self.in_shm:
            inputs = self._with_shm_inputs(buffer, starts)
        else:
            inputs = [Tensor(name, datatype, shape, np.frombuffer(buffer, dtype, count, start).reshape(shape), params)
                      for (name, datatype, shape, params, dtype, count), start in zip(self.inputs, starts)]
        outputs = self.outputs
        request = InferRequest(model_name, version, self.request_id if request_id is None else request_id, inputs,
                               None if outputs is None else list(outputs), dict(self.params) if self.params else {})
        request.priority = self.priority
        request.form = self  # the data plane checks this form once per model
        return request

    def _with_shm_inputs(self, buffer: Any, starts: Sequence[int]) -> list[Tensor]:
        at = iter(starts)
        return [Tensor(name, datatype, shape,
                       None if dtype is None else np.frombuffer(buffer, dtype, count, next(at)).reshape(shape), params)
                for name, datatype, shape, params, dtype, count in self.inputs]


def in_shared_memory(tensor: Tensor) -> bool:
    """An input whose data is in a system shared-memory region, not in the message."""
    return tensor.data is None and SHM_REGION in tensor.parameters


def skeleton_of(request: InferRequest, sizes: Sequence[int]) -> Skeleton | None:
    """The skeleton of a fully decoded request whose inputs with data in the message have data sizes `sizes`, or
    None when its form cannot be reused (BYTES, an input with no data in the message or a region). The caller keeps
    requests with a timeout of their own out: a deadline is each request's own."""
    inputs = []
    size_of = iter(sizes)
    for t in request.inputs:
        params = t.parameters
        if t.datatype == "BYTES":
            return None
        if in_shared_memory(t):
            inputs.append((t.name, t.datatype, t.shape, params, None, 0))
            continue
        size = next(size_of, None)
        if t.data is None or SHM_REGION in params or t.data.nbytes != size:
            return None
        inputs.append((t.name, t.datatype, t.shape, params, numpy_dtype(t.datatype), t.data.size))
    if next(size_of, None) is not None:
        return None
    return Skeleton(request, inputs, tuple(sizes))


class SkeletonTable:
    """A bounded table of skeletons by key (touched on the event loop only): a full table starts over. A key is
    learned the second time it is seen, so that a client whose every request differs (a fresh id each time) costs
    a set entry per request, not a skeleton."""

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self._skeletons: dict[bytes, Skeleton] = {}
        self._seen_once: set[bytes] = set()
        self.hits = 0

    def __len__(self) -> int:
        return len(self._skeletons)

    def get(self, key: bytes) -> Skeleton | None:
        return self._skeletons.get(key)

    def learn(self, key: bytes, request: InferRequest, sizes: Sequence[int]) -> None:
        if key not in self._seen_once:
            if len(self._seen_once) >= self.capacity:
                self._seen_once.clear()
            self._seen_once.add(key)
            return
        skeleton = skeleton_of(request, sizes)
        if skeleton is None:
            return
        if len(self._skeletons) >= self.capacity:
            self._skeletons.clear()
        self._skeletons[key] = skeleton
        self._seen_once.discard(key)


# ---- request ids: kept out of the keys, put back in each request and answer ----

_PLAIN_ID_BYTES = bytes(b for b in range(0x20, 0x7F) if b not in b'"\\')
MAX_PLAIN_ID = 127  # a protobuf length of one byte


def plain_id(raw: bytes) -> bool:
    """Whether request id bytes are read as the same str from JSON and protobuf, and written back as they are by
    both: printable ASCII but '"' and '\\', at most MAX_PLAIN_ID bytes. perf_analyzer `--async` numbers every
    request ("0", "1", ...), and a tritonclient user may give each its own (a UUID): such an id is kept out of the
    request and answer templates' keys and put back in each request and answer, so that every request of one form
    shares one skeleton, plan and answer."""
    if len(raw) > MAX_PLAIN_ID:
        return False
    return raw.isalnum() or not raw.translate(None, _PLAIN_ID_BYTES)  # ASCII letters and digits: the usual ids


def id_class(request_id: str) -> int | str:
    """What an answer template is keyed by in place of the answer's id: a plain id's length (the template holds
    the encoded answer around it), any other id itself."""
    if request_id.isascii():
        raw = request_id.encode("ascii")
        if plain_id(raw):
            return len(raw)
    return request_id


def json_id(part: bytes) -> tuple[bytes, str] | None:
    """(the JSON part with its id's value cut out, the id) for a JSON part of a request that opens with a plain
    "id" (`{"id":"7",...`, as perf_analyzer and tritonclient write one) and has no other "id" and no escape in it
    (so that nothing else can be read as the id); None for any other."""
    if part.startswith(b'{"id":"'):
        at = 7
    elif part.startswith(b'{"id": "'):
        at = 8
    else:
        return None
    end = part.find(b'"', at)
    if end < 0 or part.find(b'"id"', end) >= 0 or b"\\" in part:
        return None
    if end == at:  # an empty id (perf_analyzer's without --async): the part is its own key
        return part, ""
    raw = part[at:end]
    if not plain_id(raw):
        return None
    return part[:at] + part[end:], raw.decode("ascii")


def with_id(before: bytes, after: bytes | None, request_id: str) -> bytes:
    """An answer's encoded head from a template kept around a plain id (after None: the head is whole, its id in
    the template's key), both front ends."""
    return before if after is None else before + request_id.encode() + after


_SHM_OUTPUT_KEYS = frozenset((SHM_REGION, "shared_memory_offset", "shared_memory_byte_size"))


def answer_key(resp: InferResponse) -> tuple | None:
    """What an answer template is keyed by, both front ends: (model, version, the id's `id_class`, each output's
    name, datatype and shape, and for an output written to shared memory its region's parameters), or None for an
    answer with parameters or an output without fixed-size data of its own (classification, BYTES)."""
    if resp.parameters:
        return None
    outputs = []
    for t in resp.outputs:
        params = t.parameters
        if t.data is None:  # written to a region: the data plane checked these three, a str and two ints
            if not params or not _SHM_OUTPUT_KEYS.issuperset(params):
                return None
            outputs.append((t.name, t.datatype, t.shape, tuple(sorted(params.items()))))
            continue
        if params or t.datatype == "BYTES":
            return None
        outputs.append((t.name, t.datatype, t.shape))
    return resp.model_name, resp.model_version, id_class(resp.id), tuple(outputs)
