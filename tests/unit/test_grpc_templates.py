"""gRPC request skeletons (protocol/grpc_templates.py): a ModelInferRequest that repeats an earlier one's fields
apart from raw_input_contents is decoded from that one's skeleton, with the same result and the same errors as
the full path (protobuf parse + grpc_codec.request_from_proto)."""
from __future__ import annotations

import time

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from gt_serve.errors import GtServeError, Internal, InvalidArgument
from gt_serve.protocol.grpc_codec import request_from_proto, response_to_proto
from gt_serve.protocol.grpc_templates import GrpcAnswerTemplates, GrpcRequestTemplates, split_message
from gt_serve.types import InferResponse, Tensor
from tests.unit.test_http_templates import same  # the two decoders' results compared field by field


def message(arrays: dict[str, tuple[str, np.ndarray]], *, outputs=("OUT",), priority: int | None = 2,
            **params) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="m", model_version="1", id="req")
    for name, (datatype, array) in arrays.items():
        msg.inputs.add(name=name, datatype=datatype, shape=array.shape)
        msg.raw_input_contents.append(array.tobytes())
    for name in outputs:
        msg.outputs.add(name=name)
    if priority is not None:
        msg.parameters["priority"].int64_param = priority
    for key, value in params.items():
        if isinstance(value, str):
            msg.parameters[key].string_param = value
        else:
            msg.parameters[key].int64_param = value
    return msg


def test_the_usual_layout_splits_at_the_data():
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(4, dtype=np.int64).reshape(1, 4)
    data = message({"A": ("FP32", a), "B": ("INT64", b)}).SerializeToString()
    head_end, starts, sizes, id_field = split_message(data)
    assert sizes == [a.nbytes, b.nbytes]
    assert data[id_field[0]] == 0x1a and data[id_field[1]:id_field[2]] == b"req"  # field 3, its value
    assert data[starts[0]:starts[0] + sizes[0]] == a.tobytes() and data[starts[1]:starts[1] + sizes[1]] == b.tobytes()
    assert pb.ModelInferRequest.FromString(data[:head_end]).raw_input_contents == []  # the head holds no data


def test_a_message_without_data_entries_is_its_own_key():
    for data in (b"", message({}).SerializeToString()):
        assert split_message(data)[:3] == (len(data), [], [])


@pytest.mark.parametrize("data", [
    message({"A": ("FP32", np.zeros(2, np.float32))}).SerializeToString() + b"\x0a\x01m",  # a field after the data
    b"\x40\x01" + message({"A": ("FP32", np.zeros(2, np.float32))}).SerializeToString(),  # field 8, a varint
    b"\x0a\x05ab",  # a length past the end
    b"\x0a\xff\xff\xff\xff\xff\xff\x01",  # a length that does not end
])
def test_any_other_layout_is_not_split(data):
    assert split_message(data) is None


def test_a_repeated_request_is_decoded_from_its_skeleton_with_its_own_data():
    templates = GrpcRequestTemplates()
    rng = np.random.default_rng(0)
    forms = []
    for i in range(5):
        a = rng.standard_normal((2, 3)).astype(np.float32)
        b = np.arange(4, dtype=np.int64).reshape(1, 4) + i
        msg = message({"A": ("FP32", a), "B": ("INT64", b)}, tag="x")
        got = templates.decode(msg.SerializeToString())
        same(got, request_from_proto(msg))
        assert np.array_equal(got.inputs[0].data, a) and np.array_equal(got.inputs[1].data, b)
        assert got.priority == 2 and got.parameters == {"tag": "x"} and got.deadline_s is None
        forms.append(got.form)
    assert templates.hits == 3  # learned when seen the second time
    assert forms[:2] == [None, None] and all(f is forms[2] for f in forms[2:]) and forms[2] is not None
    # each request has its own parameters and outputs list
    first, second = (templates.decode(message({"A": ("FP32", a), "B": ("INT64", b)}, tag="x").SerializeToString())
                     for _ in range(2))
    first.parameters["gt_hops"] = 1
    first.outputs.append(None)
    assert second.parameters == {"tag": "x"} and len(second.outputs) == 1


def test_the_calls_deadline_applies_to_each_request():
    templates = GrpcRequestTemplates()
    data = message({"A": ("FP32", np.zeros((1, 2), np.float32))}).SerializeToString()
    for _ in range(3):
        before_s = time.monotonic()
        got = templates.decode(data, time_remaining_s=5.0)
        assert before_s + 5.0 <= got.deadline_s <= time.monotonic() + 5.0
    assert templates.hits == 1
    assert templates.decode(data).deadline_s is None


def test_data_of_another_size_gets_the_full_paths_error():
    templates = GrpcRequestTemplates()
    good = message({"A": ("FP32", np.zeros((1, 4), np.float32))})
    for _ in range(2):
        templates.decode(good.SerializeToString())
    bad = message({"A": ("FP32", np.zeros((1, 4), np.float32))})
    bad.raw_input_contents[0] = b"\x00" * 12
    with pytest.raises(GtServeError, match="got 12 bytes of data, expected 16") as info:
        templates.decode(bad.SerializeToString())
    with pytest.raises(GtServeError) as full:
        request_from_proto(bad)
    assert info.value.message == full.value.message
    assert templates.hits == 0


def test_a_message_that_does_not_parse_is_the_calls_internal_error():
    templates = GrpcRequestTemplates()
    with pytest.raises(Internal, match="error parsing request message"):
        templates.decode(b"\x0a\x05ab")
    with pytest.raises(Internal, match="error parsing request message"):
        templates.decode(b"\x3a\x02ab\x0a")  # split fails: the full parse names it


def test_inputs_in_shared_memory_are_kept_with_their_regions_and_no_data():
    """perf_analyzer --shared-memory system: every input in a region (no raw_input_contents at all), or some."""
    templates = GrpcRequestTemplates()
    a = np.arange(2, dtype=np.float32).reshape(1, 2)
    for raw in ({}, {"A": ("FP32", a)}):
        msg = message(raw)
        s = msg.inputs.add(name="S", datatype="FP32", shape=[1, 2])
        s.parameters["shared_memory_region"].string_param = "r"
        s.parameters["shared_memory_byte_size"].int64_param = 8
        data = msg.SerializeToString()
        hits = templates.hits
        for _ in range(3):
            got = templates.decode(data)
            same(got, request_from_proto(msg))
            assert got.inputs[-1].data is None
            assert got.inputs[-1].parameters == {"shared_memory_region": "r", "shared_memory_byte_size": 8}
        assert templates.hits == hits + 1 and got.form is not None
        if raw:
            assert np.array_equal(got.inputs[0].data, a)


@pytest.mark.parametrize("case", ["timeout", "bytes", "no raw"])
def test_requests_that_are_not_kept(case):
    templates = GrpcRequestTemplates()
    if case == "timeout":
        msg = message({"A": ("FP32", np.zeros((1, 2), np.float32))}, timeout=1000000)
    elif case == "bytes":
        msg = message({})
        msg.inputs.add(name="S", datatype="BYTES", shape=[1])
        msg.raw_input_contents.append(b"\x02\x00\x00\x00hi")
    else:
        msg = message({})
        msg.inputs.add(name="A", datatype="FP32", shape=[1, 2]).contents.fp32_contents.extend([1.0, 2.0])
    data = msg.SerializeToString()
    for _ in range(3):
        same_or_none = templates.decode(data)
        assert same_or_none.form is None
    assert templates.hits == 0


def test_a_wrong_request_is_never_kept():
    templates = GrpcRequestTemplates()
    msg = message({"A": ("FP32", np.zeros((1, 2), np.float32))})
    msg.inputs[0].shape[:] = [-1, 2]
    for _ in range(2):
        with pytest.raises(InvalidArgument, match="invalid shape"):
            templates.decode(msg.SerializeToString())
    assert templates.hits == 0


# ---- answers -------------------------------------------------------------------------------------------------

def encoded(answers: GrpcAnswerTemplates, resp: InferResponse) -> bytes:
    """The answer's bytes as a transport writes them: its pieces, one after the other."""
    return b"".join(answers.encode_parts(resp))


def answer(*outputs: Tensor, params: dict | None = None, request_id: str = "req") -> InferResponse:
    return InferResponse("m", "1", request_id, list(outputs), params or {})


def test_an_answer_is_the_bytes_protobuf_writes_with_its_head_serialized_once():
    answers = GrpcAnswerTemplates()
    rng = np.random.default_rng(1)
    for rows in (1, 1, 3, 3, 3, 0, 0, 700):  # 0 rows: empty entries; 700 x 8 x 4 bytes: a 3-byte length
        a = rng.standard_normal((rows, 8)).astype(np.float32)
        b = (np.arange(rows * 2, dtype=np.int64).reshape(rows, 2) - 3)
        resp = answer(Tensor("A", "FP32", a.shape, a), Tensor("B", "INT64", b.shape, b))
        got = encoded(answers, resp)
        assert got == response_to_proto(resp).SerializeToString()
        back = pb.ModelInferResponse.FromString(got)
        assert back.raw_output_contents[0] == a.tobytes() and back.raw_output_contents[1] == b.tobytes()
    assert answers.hits == 4  # 1, 3, 3, 0 again


@pytest.mark.parametrize("resp", [
    answer(Tensor("A", "FP32", (1,), np.zeros(1, np.float32)), params={"tag": "x"}),
    answer(Tensor("S", "BYTES", (1,), np.array([b"ab"], dtype=object))),
    answer(Tensor("A", "FP32", (1,), None, {"shared_memory_region": "r", "other": [1]})),
])
def test_answers_that_are_not_kept_are_still_right(resp):
    answers = GrpcAnswerTemplates()
    for _ in range(2):
        assert encoded(answers, resp) == response_to_proto(resp).SerializeToString()
    assert answers.hits == 0


def test_outputs_written_to_shared_memory_are_kept_with_their_regions():
    answers = GrpcAnswerTemplates()
    region = {"shared_memory_region": "r", "shared_memory_byte_size": 4, "shared_memory_offset": 8}
    for i in range(3):
        for shm_out in (Tensor("S", "FP32", (1,), None, region),
                        Tensor("S", "FP32", (1,), None, {**region, "shared_memory_offset": 0})):  # another key
            resp = answer(Tensor("A", "INT32", (2,), np.arange(2, dtype=np.int32) + i), shm_out)
            got = encoded(answers, resp)
            assert got == response_to_proto(resp).SerializeToString()
            back = pb.ModelInferResponse.FromString(got)
            assert list(back.raw_output_contents) == [(np.arange(2, dtype=np.int32) + i).tobytes(), b""]
            assert back.outputs[1].parameters["shared_memory_offset"].int64_param == shm_out.parameters[
                "shared_memory_offset"]
    assert answers.hits == 4


# ---- request ids: a plain one is kept out of the keys and put back ----

def test_each_message_keeps_its_own_plain_id_and_all_share_one_form():
    """perf_analyzer --async numbers its requests ("0", "1", ...): the form is keyed without the id field, and a
    message without one (the id "") shares it."""
    templates = GrpcRequestTemplates()
    ids = ["0", "1", "", "17", "9999", "3f2b8a1e-7c4d-4e0f-9a6b-2d1c5e8f7a90", "a b:c/d<e>", "x" * 127]
    forms = []
    for i, request_id in enumerate(ids):
        msg = message({"A": ("FP32", np.full((1, 2), i, np.float32))})
        msg.id = request_id
        got = templates.decode(msg.SerializeToString())
        same(got, request_from_proto(msg))
        assert got.id == request_id and got.inputs[0].data[0, 0] == i
        forms.append(got.form)
    assert templates.hits == len(ids) - 2 and all(f is forms[2] for f in forms[2:])


@pytest.mark.parametrize("request_id", ["caf\u00e9", "tab\there", "x" * 128, "\x7f"])
def test_an_id_that_is_not_plain_is_part_of_the_key(request_id):
    templates = GrpcRequestTemplates()
    for i in range(4):
        msg = message({"A": ("FP32", np.full((1, 2), i, np.float32))})
        msg.id = request_id if i < 3 else request_id + "!"
        got = templates.decode(msg.SerializeToString())
        same(got, request_from_proto(msg))
    assert templates.hits == 1  # the third; the fourth is another id, so another key


def test_a_message_with_two_id_fields_takes_the_full_path():
    """protobuf's last field wins: a message with two is never split, so a later one never gets the first id."""
    templates = GrpcRequestTemplates()
    for i in range(4):
        msg = message({"A": ("FP32", np.full((1, 2), i, np.float32))})
        head_end = split_message(msg.SerializeToString())[0]
        data = msg.SerializeToString()
        data = data[:head_end] + b"\x1a\x04last" + data[head_end:]  # a second id, before the data
        assert split_message(data) is None
        got = templates.decode(data)
        assert got.id == "last" and got.form is None


@pytest.mark.parametrize("ids, hits", [(["0", "1", "2", "3"], 3), (["", "", ""], 2), (["9", "10", "11", "100"], 1),
                                       (['q"1', 'q"1', 'q"2'], 1), (["\u00e9", "\u00e9", "\u00e8"], 1)])
def test_an_answer_puts_back_its_own_plain_id(ids, hits):
    answers = GrpcAnswerTemplates()
    for i, request_id in enumerate(ids):
        resp = answer(Tensor("A", "INT32", (2,), np.arange(2, dtype=np.int32) + i), request_id=request_id)
        got = encoded(answers, resp)
        assert got == response_to_proto(resp).SerializeToString()
        assert pb.ModelInferResponse.FromString(got).id == request_id
    assert answers.hits == hits
