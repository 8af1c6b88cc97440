"""Request skeletons for gRPC (protocol/request_forms.py): a ModelInferRequest whose fields other than
`raw_input_contents` are byte-for-byte those of an earlier one reuses that one's decoded skeleton.

Our own HTTP/2 transport hands ModelInfer its message as bytes. Clients serialize the fields in field-number
order, so `raw_input_contents` (field 7, the data) comes last: everything before its first entry (model name,
version, id, parameters, inputs, requested outputs: fields 1-6) is the key; a message without it (every input in
shared memory) is its own key. The top level of the message is
walked, not parsed: each field's tag and length. Any other layout (another wire type, an unknown field, a
field after the data, a length past the end) takes the full path (protobuf parse + grpc_codec.request_from_proto),
as does a key not seen before or data entries of other sizes, so that path names whatever is wrong. Decoding a
small request this way costs ~3.8 µs against ~7.6 µs for the full path (issue #17; best of 10 interleaved rounds).

Answers the same way (`GrpcAnswerTemplates`): a ModelInferResponse whose outputs all hold fixed-size data and
carry no parameters, or were written to shared memory (their regions' parameters then in the key), is its fields
1-5 (model, version, id, outputs' names, datatypes and shapes), serialized once per such key, followed by one
`raw_output_contents` entry per output: the bytes protobuf would have written, given as pieces (`encode_parts`:
the outputs' data as views, for a transport to write as they are).

Request ids (perf_analyzer `--async` numbers its requests; a tritonclient user may give each its own): a plain id
(request_forms.plain_id) is cut out of the key, field and all (`head_key`), and each request gets its own; an answer
with a plain id is keyed by the id's length, its head kept around the id, and the id put back in.
"""
from __future__ import annotations

import time

from tritonclient.grpc import service_pb2 as pb

from ..errors import Internal
from ..types import InferRequest, InferResponse
from .codec import raw_from_array
from .grpc_codec import request_from_proto, response_to_proto
from .h2.frames import varint
from .request_forms import SkeletonTable, answer_key, plain_id, with_id

_ID = 3
_RAW_INPUT_CONTENTS = 7
_RAW_OUTPUT_CONTENTS_TAG = b"\x32"  # field 6 of ModelInferResponse, length-delimited
_LENGTH_DELIMITED = 2
MAX_KEY_BYTES = 4096  # a larger head is decoded in full every time


def split_message(data) -> tuple[int, list[int], list[int], tuple | None] | None:
    """(where raw_input_contents begins, or the message's end without it; each entry's start and length; the id
    field's (start, value's start, value's end) or None) for the usual layout (one id field at most), else None."""
    n, pos, head_end = len(data), 0, -1
    id_field: tuple | None = None
    starts, sizes = [], []
    while pos < n:
        tag_at = pos
        tag = data[pos]
        if tag >= 0x80:  # fields 1-7 have one-byte tags
            return None
        pos += 1
        length = shift = 0
        while True:  # the varint length
            if pos >= n or shift > 35:
                return None
            b = data[pos]
            pos += 1
            length |= (b & 0x7F) << shift
            if b < 0x80:
                break
            shift += 7
        field = tag >> 3
        if tag & 7 != _LENGTH_DELIMITED or pos + length > n:
            return None
        if field == _RAW_INPUT_CONTENTS:
            if head_end < 0:
                head_end = tag_at
            starts.append(pos)
            sizes.append(length)
        elif head_end >= 0 or not 1 <= field < _RAW_INPUT_CONTENTS:
            return None
        elif field == _ID:
            if id_field is not None:
                return None
            id_field = (tag_at, pos, pos + length)
        pos += length
    if head_end < 0:  # no data in the message: every input in shared memory, or data in `contents`
        head_end = n
    return head_end, starts, sizes, id_field


def head_key(data, head_end: int, id_field: tuple | None) -> tuple[bytes, str | None]:
    """(the template key of a message's head, the message's id when the key leaves it out, else None): a plain id
    (request_forms.plain_id) is cut out of the key, field and all, so a message without an id field (the id "")
    has the same key; any other id is part of the key."""
    if id_field is None:
        return bytes(data[:head_end]), ""
    tag_at, start, end = id_field
    raw = bytes(data[start:end])
    if not plain_id(raw):
        return bytes(data[:head_end]), None
    return bytes(data[:tag_at]) + bytes(data[end:head_end]), raw.decode("ascii")


class GrpcRequestTemplates:
    """One gRPC front end's table of ModelInferRequest skeletons (touched on the event loop only)."""

    def __init__(self, capacity: int = 256) -> None:
        self._table = SkeletonTable(capacity)

    @property
    def hits(self) -> int:
        return self._table.hits

    def decode(self, data, time_remaining_s: float | None = None) -> InferRequest:
        """As request_from_proto(ModelInferRequest.FromString(data), time_remaining_s): same result, same errors
        (a message that does not parse: Internal 'error parsing request message: ...')."""
        split = split_message(data)
        if split is None or split[0] > MAX_KEY_BYTES:
            return request_from_proto(parse_request(data), time_remaining_s)
        head_end, starts, sizes, id_field = split
        key, request_id = head_key(data, head_end, id_field)
        skeleton = self._table.get(key)
        if skeleton is None or tuple(sizes) != skeleton.sizes:
            msg = parse_request(data)
            request = request_from_proto(msg, time_remaining_s)
            if skeleton is None and "timeout" not in msg.parameters:  # a call's deadline is each call's own
                self._table.learn(key, request, sizes)
            return request
        self._table.hits += 1
        request = skeleton.request(skeleton.model_name, skeleton.version, data, starts, request_id)
        if time_remaining_s is not None:
            request.deadline_s = time.monotonic() + time_remaining_s
        return request


class MessageNotParsed(Internal):
    """A ModelInferRequest's bytes that protobuf cannot parse: the call's INTERNAL status."""


def parse_request(data) -> pb.ModelInferRequest:
    """The message as protobuf; a decode error as the call's INTERNAL status, in grpcio's words."""
    try:
        return pb.ModelInferRequest.FromString(data)
    except Exception as exc:  # noqa: BLE001 - protobuf decode error: the call's status
        raise MessageNotParsed(f"error parsing request message: {exc}") from None


class GrpcAnswerTemplates:
    """One gRPC front end's table of serialized answer heads (touched on the event loop only): (the head before the
    id, after it or None when the head is whole); a plain id is put back in each answer, any other is in the key."""

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self._heads: dict[tuple, tuple[bytes, bytes | None]] = {}
        self.hits = 0

    @staticmethod
    def templated(resp: InferResponse) -> bool:
        """Whether `resp`'s answers are encoded from a head kept once per kind (`encode_parts`)."""
        return answer_key(resp) is not None

    def template(self, resp: InferResponse) -> tuple | None:
        """The head kept for answers like `resp` (after `encode_parts` encoded one)."""
        key = answer_key(resp)
        return None if key is None else self._heads.get(key)

    def encode_parts(self, resp: InferResponse) -> list:
        """response_to_proto(resp).SerializeToString(), byte for byte once joined, as the pieces it is made of (the
        outputs' data not copied: a transport writes them as they are)."""
        key = answer_key(resp)
        if key is None:
            return [response_to_proto(resp).SerializeToString()]
        known = self._heads.get(key)
        if known is None:
            msg = response_to_proto(resp)
            body = msg.SerializeToString()
            del msg.raw_output_contents[:]
            around = _around_id(msg, isinstance(key[2], int))
            if around is not None:
                if len(self._heads) >= self.capacity:
                    self._heads.clear()
                self._heads[key] = around
            return [body]
        self.hits += 1
        before, after = known
        parts = [with_id(before, after, resp.id)]
        for t in resp.outputs:
            if t.data is None:  # written to shared memory: an empty entry, as response_to_proto writes it
                parts += (_RAW_OUTPUT_CONTENTS_TAG, b"\x00")
                continue
            raw = raw_from_array(t.data, t.datatype)
            parts += (_RAW_OUTPUT_CONTENTS_TAG, varint(len(raw)), raw)
        return parts


def _around_id(msg: pb.ModelInferResponse, plain: bool) -> tuple[bytes, bytes | None] | None:
    """(the serialized answer head up to a plain id's value, after it) of an answer with a plain id; (the head,
    None) for one with another id, or none; None if the id is not where protobuf writes it (after fields 1-2)."""
    head = msg.SerializeToString()
    request_id = msg.id
    if not plain or not request_id:
        return head, None
    raw = request_id.encode()
    before = pb.ModelInferResponse(model_name=msg.model_name, model_version=msg.model_version).SerializeToString()
    before += b"\x1a" + varint(len(raw))
    if not head.startswith(before + raw):
        return None
    return before, head[len(before) + len(raw):]
