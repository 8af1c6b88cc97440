"""gt_serve.protocol.http_templates: a repeated JSON part is decoded once, with the same result and the same
errors as the full decoder (http_infer.decode_request)."""
from __future__ import annotations

import numpy as np
import orjson
import pytest

from gt_serve.errors import InvalidArgument
from gt_serve.protocol.http_infer import decode_request
from gt_serve.protocol.http_templates import AnswerTemplates, RequestTemplates


def binary_body(arrays: dict[str, tuple[str, np.ndarray]], **extra) -> tuple[bytes, int]:
    inputs, blobs = [], []
    for name, (datatype, array) in arrays.items():
        raw = array.tobytes()
        inputs.append({"name": name, "datatype": datatype, "shape": list(array.shape),
                       "parameters": {"binary_data_size": len(raw)}})
        blobs.append(raw)
    head = orjson.dumps({"id": "", "inputs": inputs, **extra})
    return head + b"".join(blobs), len(head)


def same(a, b) -> None:
    assert (a.model_name, a.model_version, a.id, a.parameters, a.priority, a.deadline_s) == \
           (b.model_name, b.model_version, b.id, b.parameters, b.priority, b.deadline_s)
    assert [(o.name, o.parameters) for o in a.outputs or []] == [(o.name, o.parameters) for o in b.outputs or []]
    assert len(a.inputs) == len(b.inputs)
    for x, y in zip(a.inputs, b.inputs):
        assert (x.name, x.datatype, x.shape, x.parameters) == (y.name, y.datatype, y.shape, y.parameters)
        if x.data is None or y.data is None:  # an input in shared memory: its region's parameters, no data
            assert x.data is None and y.data is None
        else:
            assert x.data.dtype == y.data.dtype and x.data.shape == y.data.shape and np.array_equal(x.data, y.data)


def test_repeated_json_part_decoded_once_with_each_requests_own_data():
    templates = RequestTemplates()
    rng = np.random.default_rng(0)
    extra = {"outputs": [{"name": "OUT", "parameters": {"binary_data": True}}], "parameters": {"priority": 2, "k": 1}}
    forms = []
    for i in range(5):
        a = rng.standard_normal((2, 3)).astype(np.float32)
        b = np.arange(4, dtype=np.int64).reshape(1, 4) + i
        body, n = binary_body({"A": ("FP32", a), "B": ("INT64", b)}, **extra)
        got = templates.decode("m", "1", body, n)
        same(got, decode_request("m", "1", body, n))
        assert np.array_equal(got.inputs[0].data, a) and np.array_equal(got.inputs[1].data, b)
        assert got.priority == 2 and got.parameters == {"k": 1}
        forms.append(got.form)
    assert templates.hits == 3  # learned when seen the second time
    # the requests made from the skeleton share one form, which the data plane checks once per model
    assert forms[:2] == [None, None] and forms[2] is not None and all(f is forms[2] for f in forms[2:])


def test_inputs_in_shared_memory_are_kept_with_their_regions_and_no_data():
    """perf_analyzer --shared-memory system: a JSON part naming regions, a binary part for the other inputs (or
    none), Inference-Header-Content-Length given; the data plane reads the regions for each request."""
    templates = RequestTemplates()
    region = {"shared_memory_region": "in", "shared_memory_byte_size": 8}
    out = [{"name": "OUT", "parameters": {"shared_memory_region": "out", "shared_memory_byte_size": 8}}]
    shm_only = orjson.dumps({"id": "", "inputs": [{"name": "S", "datatype": "FP32", "shape": [1, 2],
                                                   "parameters": region}], "outputs": out})
    a = np.arange(3, dtype=np.int32).reshape(1, 3)
    head = orjson.dumps({"inputs": [{"name": "S", "datatype": "FP32", "shape": [1, 2], "parameters": region},
                                    {"name": "A", "datatype": "INT32", "shape": [1, 3],
                                     "parameters": {"binary_data_size": a.nbytes}}]})
    for body, n in ((shm_only, len(shm_only)), (head + a.tobytes(), len(head))):
        hits = templates.hits
        forms = []
        for _ in range(3):
            got = templates.decode("m", "1", body, n)
            same(got, decode_request("m", "1", body, n))
            assert got.inputs[0].data is None and got.inputs[0].parameters == region
            forms.append(got.form)
        assert templates.hits == hits + 1 and forms[2] is not None
        if len(got.inputs) == 2:
            assert np.array_equal(got.inputs[1].data, a)
    # another binary length still takes the full decoder, which names it
    with pytest.raises(InvalidArgument, match="unexpected additional input data"):
        templates.decode("m", "1", head + a.tobytes() + b"xyzw", len(head))


def test_each_request_gets_its_own_parameters_and_output_list():
    templates = RequestTemplates()
    body, n = binary_body({"A": ("FP32", np.ones((1, 2), np.float32))}, parameters={"gt_hops": 1},
                          outputs=[{"name": "OUT"}])
    for _ in range(2):  # learned from the second
        first = templates.decode("m", "", body, n)
        first.parameters.pop("gt_hops")  # what the data plane does with its own keys
        first.outputs.append("changed")
    second = templates.decode("m", "", body, n)
    assert second.parameters == {"gt_hops": 1} and [o.name for o in second.outputs] == ["OUT"]
    assert templates.hits == 1


def test_binary_part_of_another_length_gets_the_full_decoders_error():
    templates = RequestTemplates()
    body, n = binary_body({"A": ("FP32", np.ones((1, 4), np.float32))})
    templates.decode("m", "", body, n)
    templates.decode("m", "", body, n)
    with pytest.raises(InvalidArgument, match="unexpected additional input data for model 'm': 3 bytes"):
        templates.decode("m", "", body + b"xyz", n)
    with pytest.raises(InvalidArgument, match="binary_data_size 16 overruns the request body"):
        templates.decode("m", "", body[:-4], n)
    assert templates.hits == 0
    same(templates.decode("m", "", body, n), decode_request("m", "", body, n))  # still served from the table
    assert templates.hits == 1


@pytest.mark.parametrize("case", ["timeout", "bytes", "json_data", "no_header_length", "too_long"])
def test_requests_that_are_not_kept(case):
    templates = RequestTemplates(max_json_bytes=4096)
    if case == "timeout":  # the deadline is relative to each request's arrival
        body, n = binary_body({"A": ("FP32", np.ones((1, 2), np.float32))}, parameters={"timeout": 5_000_000})
    elif case == "bytes":
        raw = b"\x02\x00\x00\x00hi"
        head = orjson.dumps({"inputs": [{"name": "S", "datatype": "BYTES", "shape": [1],
                                         "parameters": {"binary_data_size": len(raw)}}]})
        body, n = head + raw, len(head)
    elif case == "json_data":
        head = orjson.dumps({"inputs": [{"name": "A", "datatype": "FP32", "shape": [2], "data": [1, 2]}]})
        body, n = head, len(head)
    elif case == "no_header_length":
        body, n = orjson.dumps({"inputs": [{"name": "A", "datatype": "FP32", "shape": [1], "data": [1]}]}), None
    else:
        body, n = binary_body({"A": ("FP32", np.ones((1, 2), np.float32))}, parameters={"pad": "x" * 5000})
    results = [templates.decode("m", "", body, n) for _ in range(3)]
    assert templates.hits == 0
    if case == "timeout":
        assert all(r.deadline_s is not None for r in results) and results[0].deadline_s < results[2].deadline_s
    else:
        for r in results:
            same(r, decode_request("m", "", body, n))


def test_a_full_table_starts_over():
    templates = RequestTemplates(capacity=3)
    bodies = [binary_body({"A": ("FP32", np.ones((1, k + 1), np.float32))}) for k in range(4)]
    for body, n in bodies:
        templates.decode("m", "", body, n)
        templates.decode("m", "", body, n)  # learned when seen the second time
    templates.decode("m", "", *bodies[3])
    assert templates.hits == 1  # the 4th was kept in the fresh table
    for _ in range(2):
        templates.decode("m", "", *bodies[0])
    assert templates.hits == 1  # the 1st was dropped with the old table, and learned again
    templates.decode("m", "", *bodies[0])
    assert templates.hits == 2


def test_requests_that_never_repeat_build_no_skeleton():
    templates = RequestTemplates(capacity=4)
    for i in range(20):  # a fresh parameter every time
        body, n = binary_body({"A": ("FP32", np.ones((1, 2), np.float32))}, parameters={"tag": f"r{i}"})
        same(templates.decode("m", "", body, n), decode_request("m", "", body, n))
    assert templates.hits == 0 and templates.kept == 0


def test_each_request_keeps_its_own_plain_id_and_all_share_one_form():
    """perf_analyzer --async numbers its requests ("0", "1", ...); tritonclient users may give each its own id (a
    UUID): the form is keyed without the id, and each request gets its own."""
    templates = RequestTemplates()
    ids = ["0", "1", "17", "", "9999", "3f2b8a1e-7c4d-4e0f-9a6b-2d1c5e8f7a90", "a b:c/d<e>", "x" * 127]
    forms = []
    for i, request_id in enumerate(ids):
        a = np.full((1, 2), i, np.float32)
        body, n = binary_body({"A": ("FP32", a)}, outputs=[{"name": "OUT"}])
        body = body.replace(b'{"id":""', orjson.dumps({"id": request_id})[:-1], 1)
        n += len(orjson.dumps(request_id)) - 2
        got = templates.decode("m", "1", body, n)
        same(got, decode_request("m", "1", body, n))
        assert got.id == request_id and np.array_equal(got.inputs[0].data, a)
        forms.append(got.form)
    assert templates.kept == 1 and templates.hits == len(ids) - 2
    assert all(f is forms[2] for f in forms[2:])


@pytest.mark.parametrize("request_id", ['a"b', "a\\b", "caf\u00e9", "tab\there", "x" * 128, 5, None])
def test_an_id_that_is_not_plain_is_part_of_the_key(request_id):
    """An id with an escape, beyond ASCII or printable, too long, or not a string is never cut out of the key: each
    request has the id the full decoder reads, and a new id is a new form."""
    templates = RequestTemplates()
    for i in range(4):
        extra = {"id": request_id} if request_id is not None else {"id": "7", "parameters": {"id": i % 2}}
        head = orjson.dumps({**extra, "inputs": [{"name": "A", "datatype": "FP32", "shape": [1, 2],
                                                  "parameters": {"binary_data_size": 8}}]})
        body = head + np.full((1, 2), i, np.float32).tobytes()
        got = templates.decode("m", "1", body, len(head))
        same(got, decode_request("m", "1", body, len(head)))
    if request_id is None:  # another "id" in the JSON part: exact keys, two of them, each seen twice
        assert templates.hits == 0 and templates.kept == 2
    else:
        assert templates.hits == 2 and templates.kept == 1


def test_a_second_id_key_is_never_read_past():
    """JSON's last "id" wins: a JSON part with two is keyed exactly, so a later one never gets the first id."""
    templates = RequestTemplates()
    for first in ("1", "2", "3", "4"):
        head = b'{"id":"%s","inputs":[{"name":"A","datatype":"FP32","shape":[1,2],' \
               b'"parameters":{"binary_data_size":8}}],"id":"last"}' % first.encode()
        body = head + bytes(8)
        got = templates.decode("m", "1", body, len(head))
        assert got.id == "last"
        same(got, decode_request("m", "1", body, len(head)))


def test_empty_tensor_and_decompressed_bytearray_body():
    templates = RequestTemplates()
    body, n = binary_body({"A": ("FP32", np.zeros((0, 3), np.float32)), "B": ("INT32", np.arange(3, dtype=np.int32))})
    for payload in (body, body, bytearray(body), bytearray(body)):
        got = templates.decode("m", "", payload, n)
        assert got.inputs[0].data.shape == (0, 3) and np.array_equal(got.inputs[1].data, np.arange(3))
    assert templates.hits == 2


# ---- answers ----

def answer(outputs: list, model: str = "m", request_id: str = "", params: dict | None = None):
    from gt_serve.types import InferResponse
    return InferResponse(model, "1", request_id, outputs, params or {})


def asked(*outputs, **params):
    from gt_serve.types import InferRequest, RequestedOutput
    req = InferRequest("m", "1", "", [], [RequestedOutput(n, p) for n, p in outputs] if outputs else None, params)
    return req


def joined(parts) -> bytes:
    return b"".join(bytes(p) for p in parts)


def test_a_binary_answer_is_encoded_once_per_shape_and_request():
    from gt_serve.protocol.http_infer import encode_response
    from gt_serve.types import Tensor
    answers = AnswerTemplates()
    rng = np.random.default_rng(1)
    req = asked(("A", {"binary_data": True}), ("B", {"binary_data": True}))
    for i in range(4):
        outs = [Tensor("A", "FP32", (2, 3), rng.standard_normal((2, 3)).astype(np.float32)),
                Tensor("B", "INT64", (2,), np.arange(2, dtype=np.int64) + i)]
        parts, headers, _ = answers.encode(answer(outs), req)
        want, json_bytes = encode_response(answer(outs), req)
        assert joined(parts) == joined(want)
        assert headers == {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(json_bytes)}
    assert answers.hits == 3
    outs = [Tensor("A", "FP32", (1, 3), np.ones((1, 3), np.float32)), Tensor("B", "INT64", (1,), np.ones(1, np.int64))]
    parts, headers, _ = answers.encode(answer(outs), req)  # another shape: another JSON part
    assert joined(parts) == joined(encode_response(answer(outs), req)[0]) and answers.hits == 3
    parts, _, _ = answers.encode(answer(outs, request_id="r7"), req)  # the id is in the JSON part
    assert joined(parts) == joined(encode_response(answer(outs, request_id="r7"), req)[0]) and answers.hits == 3


@pytest.mark.parametrize("ids, hits", [(["0", "1", "2", "3"], 3), (["r7", "r8", "r9", "r1"], 3), (["", "", ""], 2),
                                       (["9", "10", "11", "100"], 1),  # one template per id length
                                       (["a\u00e9", "a\u00e9", "a\u00e8"], 1), (['q"1', 'q"1', 'q"2'], 1)])
def test_an_answer_puts_back_its_own_plain_id(ids, hits):
    """A plain id is put back in the kept JSON part (one per id length: the headers carry its length); any other id
    is part of the key."""
    from gt_serve.protocol.http_infer import encode_response
    from gt_serve.types import Tensor
    answers = AnswerTemplates()
    req = asked(("A", {"binary_data": True}))
    for i, request_id in enumerate(ids):
        outs = [Tensor("A", "FP32", (2,), np.arange(2, dtype=np.float32) + i)]
        parts, headers, heads = answers.encode(answer(outs, request_id=request_id), req)
        want, json_bytes = encode_response(answer(outs, request_id=request_id), req)
        assert joined(parts) == joined(want) and heads is not None
        assert headers["Inference-Header-Content-Length"] == str(json_bytes)
        assert orjson.loads(parts[0]).get("id", "") == request_id
    assert answers.hits == hits


@pytest.mark.parametrize("case", ["json_data", "bytes", "shm_other_params", "answer_params", "one_json_output"])
def test_answers_that_are_not_kept(case):
    from gt_serve.protocol.http_infer import encode_response
    from gt_serve.types import Tensor
    answers = AnswerTemplates()
    req = asked(("A", {"binary_data": True}))
    resp_params = None
    if case == "json_data":
        req = asked(("A", {}))
        outs = lambda i: [Tensor("A", "FP32", (2,), np.arange(2, dtype=np.float32) + i)]  # noqa: E731
    elif case == "bytes":
        outs = lambda i: [Tensor("A", "BYTES", (1,), np.array([b"x%d" % i], dtype=object))]  # noqa: E731
    elif case == "shm_other_params":
        outs = lambda i: [Tensor("A", "FP32", (2,), None, {"shared_memory_region": "r", "x": [i]})]  # noqa: E731
    elif case == "answer_params":
        resp_params = {"sequence_id": 3}
        outs = lambda i: [Tensor("A", "FP32", (2,), np.arange(2, dtype=np.float32) + i)]  # noqa: E731
    else:
        req = asked(("A", {"binary_data": True}), ("B", {"binary_data": False}))
        outs = lambda i: [Tensor("A", "FP32", (2,), np.zeros(2, np.float32)),  # noqa: E731
                          Tensor("B", "FP32", (2,), np.arange(2, dtype=np.float32) + i)]
    for i in range(3):
        parts, _, _ = answers.encode(answer(outs(i), params=resp_params), req)
        assert joined(parts) == joined(encode_response(answer(outs(i), params=resp_params), req)[0])
    assert answers.hits == 0


def test_outputs_written_to_shared_memory_are_kept_with_their_regions():
    from gt_serve.protocol.http_infer import encode_response
    from gt_serve.types import Tensor
    answers = AnswerTemplates()
    region = {"shared_memory_region": "r", "shared_memory_byte_size": 8}
    for i in range(3):
        for outs, req in (([Tensor("S", "FP32", (2,), None, region)], asked(("S", region))),  # JSON alone
                          ([Tensor("S", "FP32", (2,), None, region), Tensor("A", "INT32", (2,), np.arange(2, dtype=np.int32) + i)],
                           asked(("S", region), ("A", {"binary_data": True})))):
            parts, headers, _ = answers.encode(answer(outs), req)
            full, json_bytes = encode_response(answer(outs), req)
            assert joined(parts) == joined(full)
            assert headers == ({"Content-Type": "application/json"} if json_bytes is None else
                               {"Content-Type": "application/octet-stream",
                                "Inference-Header-Content-Length": str(json_bytes)})
    assert answers.hits == 4


def test_binary_data_output_and_empty_outputs():
    from gt_serve.protocol.http_infer import encode_response
    from gt_serve.types import Tensor
    answers = AnswerTemplates()
    req = asked(binary_data_output=True)
    for i in range(3):
        outs = [Tensor("E", "FP32", (0, 4), np.zeros((0, 4), np.float32)),
                Tensor("A", "INT32", (3,), np.arange(3, dtype=np.int32) * i)]
        parts, headers, _ = answers.encode(answer(outs), req)
        assert joined(parts) == joined(encode_response(answer(outs), req)[0]) and len(parts) == 2
    assert answers.hits == 2
    parts, headers, heads = answers.encode(answer(outs), asked())  # the default is JSON data: another key, not kept
    assert headers == {"Content-Type": "application/json"} and heads is None and answers.hits == 2


def test_any_json_value_as_a_binary_data_flag_is_read_as_its_truth():
    from gt_serve.protocol.http_infer import encode_response
    from gt_serve.types import Tensor
    answers = AnswerTemplates()
    outs = [Tensor("A", "FP32", (2,), np.arange(2, dtype=np.float32))]
    for flag in ([1], {"x": 1}, "yes", 1, [], 0):
        req = asked(("A", {"binary_data": flag}))
        parts, _, _ = answers.encode(answer(outs), req)
        assert joined(parts) == joined(encode_response(answer(outs), req)[0])
    assert answers.hits == 3  # [1], {"x": 1}, "yes" and 1 all mean binary: one key
