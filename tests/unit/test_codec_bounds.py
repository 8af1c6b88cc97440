"""Bounded tensor decoding (protocol/codec.py, http_infer) and the trace settings store (issue #11 finding 13)."""
from __future__ import annotations

import json

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gt_serve.errors import InvalidArgument, Unsupported
from gt_serve.protocol import codec, http_infer
from gt_serve.protocol.trace_settings import TraceSettings


@pytest.fixture
def small_cut(monkeypatch):
    """Every document takes the cut-and-count path, decoded in tiny chunks."""
    monkeypatch.setattr(http_infer, "LARGE_JSON_BYTES", 0)
    monkeypatch.setattr(codec, "JSON_CHUNK_BYTES", 64)


def _decode(doc) -> list:
    body = doc if isinstance(doc, bytes) else orjson.dumps(doc)
    return http_infer.decode_request("m", "", body, None).inputs


@settings(max_examples=40, deadline=None)
@given(dt=st.sampled_from(["FP32", "FP64", "INT8", "INT64", "UINT64", "BOOL", "BYTES"]),
       shape=st.lists(st.integers(1, 5), min_size=1, max_size=3), seed=st.integers(0, 2**31 - 1),
       nested=st.booleans(), indent=st.booleans())
def test_cut_path_decodes_like_the_plain_path(dt, shape, seed, nested, indent):
    rng = np.random.default_rng(seed)
    if dt == "BYTES":
        alphabet = ['a', '"', '\\', '}', '{', ']', '[', ':', ',', 'é', ' ']
        flat = ["".join(rng.choice(alphabet, size=int(rng.integers(0, 6)))) for _ in range(int(np.prod(shape)))]
        arr = np.array(flat, dtype=object).reshape(shape)
    elif dt == "BOOL":
        arr = rng.integers(0, 2, size=shape).astype(bool)
    else:
        arr = (rng.standard_normal(shape) * 100).astype(np.float64 if dt.startswith("FP") else np.int64)
        arr = np.abs(arr) if dt.startswith("U") else arr
        arr = np.clip(arr, -128, 127) if dt == "INT8" else arr
    data = arr.tolist() if nested else arr.reshape(-1).tolist()
    doc = {"id": "r", "inputs": [{"name": "A", "datatype": dt, "shape": shape, "data": data},
                                 {"name": "B", "datatype": "INT32", "shape": [2], "data": [1, 2]}]}
    body = orjson.dumps(doc, option=orjson.OPT_INDENT_2 if indent else 0)
    plain = http_infer.decode_request("m", "", body, None).inputs
    old = (http_infer.LARGE_JSON_BYTES, codec.JSON_CHUNK_BYTES)
    http_infer.LARGE_JSON_BYTES, codec.JSON_CHUNK_BYTES = 0, 16
    try:
        cut = http_infer.decode_request("m", "", body, None).inputs
    finally:
        http_infer.LARGE_JSON_BYTES, codec.JSON_CHUNK_BYTES = old
    for a, b in zip(plain, cut):
        assert a.shape == b.shape and a.data.dtype == b.data.dtype
        np.testing.assert_array_equal(a.data, b.data)


@pytest.mark.parametrize("doc, message", [
    (b'{"inputs":[{"name":"A","datatype":"FP32","shape":[3],"data":[1,2]}]}', "input 'A': expected 3 elements"),
    (b'{"inputs":[{"name":"A","datatype":"FP32","shape":[1],"data":[' + b"1," * 5000 + b'1]}]}',
     "input 'A': expected 1 elements for shape [1], got 5001"),
    (b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1],[2]}]}', "not a well-formed"),
    (b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1,2]]}]}', "not a well-formed"),
    (b'{"inputs":[{"name":"A","datatype":"INT32","shape":[2],"data":[1.5,2]}]}', "floating-point data"),
    (b'{"inputs":[{"name":"A","datatype":"INT8","shape":[2],"data":[1000,2]}]}', "out of range"),
    (b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":["a","b"]}]}', "not numeric"),
    (b'{"inputs":[{"name":"A","datatype":"FP32","shape":[3],"data":[1,,2]}]}', "failed to parse"),
    (b'{"inputs":[{"name":"A","datatype":"BYTES","shape":[1],"data":["","",""]}]}', "expected 1 elements"),
    (b'{"inputs":[{"name":"A","datatype":"BYTES","shape":[3],"data":["",1,"",""]}]}', "must be strings"),
    (b'{"inputs":[{"name":"A","datatype":"BYTES","shape":[1],"data":["a",' + b"[]," * 1000 + b'[]]}]}',
     "nests more lists"),
    (b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1,2],"parameters":{"data":[1]}}]}',
     "only as the data of its inputs"),
    (b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1,2', "unterminated"),
])
def test_cut_path_refuses_with_a_clear_message(small_cut, doc, message):
    with pytest.raises(InvalidArgument, match=message.replace("[", r"\[").replace("]", r"\]")):
        _decode(doc)


def test_a_forged_placeholder_is_just_a_string(small_cut):
    # the placeholder is random per request: a client's string that looks like one is not a span
    doc = {"inputs": [{"name": "A", "datatype": "FP32", "shape": [1], "data": "0000000000000000:0"},
                      {"name": "B", "datatype": "FP32", "shape": [1], "data": [5]}]}
    with pytest.raises(InvalidArgument, match="input 'A': data is not numeric"):
        _decode(doc)


def test_escaped_data_key_inside_a_string_is_not_cut(small_cut):
    body = b'{"id": "\\"data\\": [1, 2]", "inputs": [{"name": "A", "datatype": "FP32", "shape": [2], "data": [3, 4]}]}'
    req = http_infer.decode_request("m", "", body, None)
    assert req.id == '"data": [1, 2]'
    np.testing.assert_array_equal(req.inputs[0].data, [3, 4])


def test_large_skeleton_is_refused(monkeypatch):
    monkeypatch.setattr(http_infer, "LARGE_JSON_BYTES", 0)
    monkeypatch.setattr(http_infer, "MAX_JSON_SKELETON_BYTES", 1000)
    doc = {"parameters": {"x": [[]] * 1000}, "inputs": [{"name": "A", "datatype": "FP32", "shape": [1], "data": [1]}]}
    with pytest.raises(InvalidArgument, match="outside the inputs' 'data' arrays exceeds 1000 bytes"):
        _decode(doc)


def test_binary_bytes_are_bounded_by_the_shape():
    def raw(items):
        return b"".join(len(x).to_bytes(4, "little") + x for x in items)

    arr = codec.bytes_array_from_raw("S", (2, 2), memoryview(raw([b"a", b"", b"xyz", b"\0"])))
    assert arr.shape == (2, 2) and arr.reshape(-1).tolist() == [b"a", b"", b"xyz", b"\0"]
    with pytest.raises(InvalidArgument, match="input 'S': expected 1 BYTES elements for shape \\[1\\], got 4000 bytes more"):
        codec.bytes_array_from_raw("S", (1,), raw([b""] * 1001))
    with pytest.raises(InvalidArgument, match="cannot hold the 1000 elements"):
        codec.bytes_array_from_raw("S", (1000,), raw([b"abc"]))  # refused before any element is built
    with pytest.raises(InvalidArgument, match="expected 3 BYTES elements for shape \\[3\\], got 2"):
        codec.bytes_array_from_raw("S", (3,), raw([b"ab", b"cd"]))
    with pytest.raises(InvalidArgument, match="overruns"):
        codec.bytes_array_from_raw("S", (1,), b"\x09\0\0\0abc")
    assert codec.count_bytes_elements(raw([b""] * 7 + [b"ab"]), "S") == 8
    with pytest.raises(InvalidArgument, match="overruns"):
        codec.count_bytes_elements(b"\x09\0\0\0abc", "S")


def test_binary_bytes_input_in_a_request_names_the_input():
    blob = b"\0\0\0\0" * 100
    head = json.dumps({"inputs": [{"name": "S", "datatype": "BYTES", "shape": [1],
                                   "parameters": {"binary_data_size": len(blob)}}]}).encode()
    with pytest.raises(InvalidArgument, match="input 'S': expected 1 BYTES elements"):
        http_infer.decode_request("m", "", head + blob, len(head))


# ---- trace settings ----

def test_trace_settings_per_model_and_global():
    ts = TraceSettings(max_models=2)
    assert ts.get()["trace_level"] == ["OFF"] and ts.get("m")["trace_rate"] == "1000"
    got = ts.update("m", {"trace_level": ["TENSORS", "TIMESTAMPS"], "trace_rate": "07", "log_frequency": 3})
    assert got["trace_level"] == ["TIMESTAMPS", "TENSORS"] and got["trace_rate"] == "7" and got["log_frequency"] == "3"
    assert ts.get()["trace_rate"] == "1000"
    ts.update("", {"trace_count": "5"})
    assert ts.get("m")["trace_count"] == "5"  # the model inherits what it does not set
    ts.update("m", {"trace_level": None, "trace_rate": None, "log_frequency": None})
    assert ts.model_count == 0  # nothing of its own left: no entry kept
    ts.update("", {"trace_count": None})
    assert ts.get()["trace_count"] == "-1"


def test_trace_settings_bounded_count_and_values():
    ts = TraceSettings(max_models=2)
    ts.update("a", {"trace_rate": "1"})
    ts.update("b", {"trace_rate": "1"})
    with pytest.raises(InvalidArgument, match="2 models already have their own settings"):
        ts.update("c", {"trace_rate": "1"})
    assert ts.update("c", {"trace_rate": None})["trace_rate"] == "1000"  # a clear creates nothing
    assert ts.model_count == 2
    for doc, match in [({"trace_level": ["TENSORS"] * 9}, "list of 1 to 8"), ({"trace_level": []}, "list of 1 to 8"),
                       ({"trace_level": ["OFF", "TENSORS"]}, "only one trace level 'OFF'"),
                       ({"trace_level": ["LOUD"]}, "unknown trace level"), ({"trace_rate": "9" * 10_000}, "Unable to parse"),
                       ({"trace_rate": 2**32}, "out of range"), ({"trace_count": "-2"}, "out of range"),
                       ({"trace_rate": True}, "Unable to parse"), ({"x" * 10_000: 1}, "unknown trace setting")]:
        with pytest.raises(InvalidArgument, match=match) as info:
            ts.update("a", doc)
        assert len(info.value.message) < 300
    with pytest.raises(Unsupported, match="trace_file"):
        ts.update("", {"trace_file": "/tmp/x"})
    # all or nothing: a bad key leaves the good ones unapplied
    with pytest.raises(InvalidArgument):
        ts.update("a", {"trace_rate": "3", "bogus": 1})
    assert ts.get("a")["trace_rate"] == "1"
