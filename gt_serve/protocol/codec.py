"""Wire-format helpers shared by the HTTP and gRPC front ends.

The datatype tables and the raw tensor encoding live in gt_serve.datatypes (the data plane needs
them too, for shared memory); they are re-exported here for the front ends.

Bounded decoding (issue #11 finding 13): the work and memory spent on a tensor's data are bounded
by its declared shape before any Python object is built for an element.
- `bytes_array_from_raw`: BYTES in the binary form, decoded straight into a preallocated object
  array of the declared element count; too little / too much data is refused without building a list.
- `cut_data_arrays` + `array_from_json_span`: a large JSON document is parsed with every `"data": [...]`
  array cut out (the rest, the skeleton, must be small); each array is then counted in C (commas,
  quotes) against the declared shape and decoded in ~1 MiB chunks into a preallocated array, so the
  peak memory stays a small multiple of the body instead of ~30 bytes per JSON number.
"""
from __future__ import annotations

__all__ = ["BINARY_DATA_SIZE", "DATATYPES", "SHM_REGION", "array_from_json_span", "array_from_list", "array_from_raw",
           "bytes_array_from_raw", "check_shape", "count_bytes_elements", "cut_data_arrays", "element_count",
           "list_from_array", "numpy_dtype", "raw_from_array", "raw_view", "serialize_bytes", "v2_datatype"]

import re
import secrets
import struct

import numpy as np
import orjson

from ..datatypes import (  # noqa: E402  (re-exported)
    DATATYPES,
    array_from_list,
    array_from_raw,
    bytes_array_from_raw,
    check_shape,
    element_count,
    list_from_array,
    numpy_dtype,
    raw_from_array,
    raw_view,
    serialize_bytes,
    v2_datatype,
)
from ..errors import InvalidArgument, InvalidInput

# V2 tensor parameters both front ends read
SHM_REGION = "shared_memory_region"
BINARY_DATA_SIZE = "binary_data_size"

JSON_CHUNK_BYTES = 1 << 20  # numeric JSON data is decoded this many bytes at a time
_U32 = struct.Struct("<I")
# a "data" key (or an escaped '\\"data\\"' inside a string: told apart by the backslashes before it)
_DATA_KEY = re.compile(rb'"data"\s*:\s*\[')
# the inside of a JSON array: anything but '"{}' up to the first string, then steps of up to 4096
# strings that are not keys, each with what follows it up to the next '"', '{' or '}'
_ARRAY_HEAD = re.compile(rb'[^"{}]*+')
_ARRAY_STEP = re.compile(rb'(?:"[^"\\]*+(?:\\.[^"\\]*+)*+"(?![ \t\r\n]*+:)[^"{}]*+){1,4096}+', re.S)
_STRING = re.compile(rb'"[^"]*+"')  # in escape-free text
_ESCAPE = re.compile(rb"\\.", re.S)
_KEY = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"\s*:')
_BRACKETS_TO_SPACE = bytes.maketrans(b"[]", b"  ")


# ---- BYTES in the binary form (bytes_array_from_raw lives in datatypes: every raw path uses it) ----

def count_bytes_elements(raw, name: str) -> int:
    """The number of length-prefixed BYTES elements in `raw`, without building them."""
    mv = memoryview(raw)
    size, offset, count = len(mv), 0, 0
    unpack = _U32.unpack_from
    while offset < size:
        if offset + 4 > size:
            raise InvalidInput(name, "truncated BYTES element length")
        offset += 4 + unpack(mv, offset)[0]
        count += 1
    if offset > size:
        raise InvalidInput(name, "the last BYTES element overruns the tensor data")
    return count


# ---- large JSON documents ----

class JsonSpan:
    """One `data` array cut out of a JSON document: doc[start:end], not copied."""

    __slots__ = ("doc", "start", "end")

    def __init__(self, doc: bytes, start: int, end: int) -> None:
        self.doc, self.start, self.end = doc, start, end


class DataSpans:
    """The `data` arrays cut out of a JSON document, by the placeholder string left in their place."""

    __slots__ = ("by_marker", "used")

    def __init__(self) -> None:
        self.by_marker: dict[str, JsonSpan] = {}
        self.used = 0

    def take(self, value) -> JsonSpan | None:
        span = self.by_marker.get(value) if isinstance(value, str) else None
        if span is not None:
            self.used += 1
        return span


def cut_data_arrays(doc: bytes, max_skeleton_bytes: int) -> tuple[bytes, DataSpans]:
    """Replace every `"data": [...]` array of `doc` with a placeholder string (random per call, so a
    client cannot forge one); returns the remaining document (at most `max_skeleton_bytes`) and the spans.
    Linear in the document; long scans run in steps so that a worker thread running this yields the GIL."""
    cuts: list[tuple[int, int]] = []
    search_from = 0
    while (m := _DATA_KEY.search(doc, search_from)) is not None:
        search_from = m.end()
        if _backslashes_before(doc, m.start()) % 2:  # an escaped quote inside a string
            continue
        start = m.end() - 1
        search_from = _array_end(doc, start)
        cuts.append((start, search_from))
    if len(doc) - sum(end - start for start, end in cuts) > max_skeleton_bytes:
        raise InvalidArgument(f"the request JSON outside the inputs' 'data' arrays exceeds {max_skeleton_bytes} bytes")
    spans = DataSpans()
    nonce = secrets.token_hex(8)
    parts: list[bytes] = []
    pos = 0
    for start, end in cuts:
        marker = f"{nonce}:{len(spans.by_marker)}"
        spans.by_marker[marker] = JsonSpan(doc, start, end)
        parts += (doc[pos:start], b'"', marker.encode(), b'"')
        pos = end
    parts.append(doc[pos:])
    return b"".join(parts), spans


def _backslashes_before(doc: bytes, i: int) -> int:
    j = i
    while j > 0 and doc[j - 1] == 92:
        j -= 1
    return i - j


def _array_end(doc: bytes, start: int) -> int:
    """End (exclusive) of the JSON array opening at doc[start], assuming the document is well formed
    (a malformed one fails later, in the skeleton or in the array's own decoding)."""
    quote = doc.find(b'"', start)
    stop = len(doc) if quote < 0 else quote
    stop = min([i for i in (doc.find(b"{", start, stop), doc.find(b"}", start, stop)) if i >= 0] or [stop])
    end = doc.rfind(b"]", start, stop) + 1
    numeric = end > 0 and doc[end:stop].strip(b" \t\r\n") in (b"", b",")
    if not numeric or (stop == quote and _KEY.match(doc, quote) is None):
        # strings inside the array (BYTES data): step over them up to the next key or brace
        pos = _ARRAY_HEAD.match(doc, start).end()
        while (m := _ARRAY_STEP.match(doc, pos)) is not None:
            pos = m.end()
        end = doc.rfind(b"]", start, pos) + 1
    if end <= start:
        raise InvalidArgument("failed to parse the request JSON: unterminated 'data' array")
    return end


def array_from_json_span(name: str, datatype: str, shape: tuple[int, ...], span: JsonSpan) -> np.ndarray:
    """A `data` array cut by `cut_data_arrays` -> array of `shape`; the element count is checked
    (in C, without building elements) before any element is decoded, then ~1 MiB is decoded at a time."""
    count = element_count(shape)
    if datatype == "BYTES":
        return _bytes_from_json_span(name, shape, count, span)
    dtype = numpy_dtype(datatype)
    doc, start, end = span.doc, span.start, span.end
    if doc.find(b'"', start, end) >= 0 or doc.find(b"{", start, end) >= 0:
        raise InvalidInput(name, f"data is not numeric for datatype {datatype}")
    _check_brackets(name, doc, start, end)
    commas = doc.count(b",", start, end)
    got = commas + 1 if commas or doc[start:end].translate(None, b"[] \t\r\n") else 0
    if got != count:
        raise InvalidInput(name, f"expected {count} elements for shape {list(shape)}, got {got}")
    out = np.empty(count, dtype=dtype)
    filled, pos = 0, start
    while filled < count:
        cut = doc.find(b",", min(pos + JSON_CHUNK_BYTES, end), end)
        cut = end if cut < 0 else cut
        chunk = _loads(b"[" + doc[pos:cut].translate(_BRACKETS_TO_SPACE) + b"]")
        part = array_from_list(name, datatype, (len(chunk),), chunk)
        if filled + part.size > count:
            raise InvalidInput(name, f"expected {count} elements for shape {list(shape)}, got more")
        out[filled:filled + part.size] = part
        filled += part.size
        pos = cut + 1
    return out.reshape(shape)


def _bytes_from_json_span(name: str, shape: tuple[int, ...], count: int, span: JsonSpan) -> np.ndarray:
    text = span.doc[span.start:span.end]
    plain = _unescaped(text) if b"\\" in text else text  # escapes out of the way: quotes delimit strings
    got = plain.count(b'"') // 2
    if got != count:
        raise InvalidInput(name, f"expected {count} elements for shape {list(shape)}, got {got}")
    structure = _without_strings(plain)
    if structure.translate(None, b"[], \t\r\n"):
        raise InvalidInput(name, "BYTES data must be strings")
    if structure.count(b"[") > _max_lists(shape):
        raise InvalidInput(name, f"data nests more lists than shape {list(shape)} has")
    del plain
    return array_from_list(name, "BYTES", shape, _loads(text))


def _without_strings(plain: bytes) -> bytes:
    """Escape-free JSON text without its strings, ~1 MiB per step (a step never ends inside a string)."""
    parts, pos = [], 0
    while pos < len(plain):
        cut = min(pos + JSON_CHUNK_BYTES, len(plain))
        if plain.count(b'"', pos, cut) % 2:
            close = plain.find(b'"', cut)
            cut = len(plain) if close < 0 else close + 1
        parts.append(_STRING.sub(b"", plain[pos:cut]))
        pos = cut
    return b"".join(parts)


def _max_lists(shape: tuple[int, ...]) -> int:
    """Lists in the fullest nesting of `shape` (one per row of every leading dimension, plus the outer one)."""
    total, rows = 1, 1
    for d in shape[:-1]:
        rows *= d
        total += rows
    return total


def _unescaped(text: bytes) -> bytes:
    """`text` without its backslash escapes, ~1 MiB per step (a step never ends inside an escape)."""
    parts, pos = [], 0
    while pos < len(text):
        cut = min(pos + JSON_CHUNK_BYTES, len(text))
        while cut < len(text) and text[cut - 1] == 92:
            cut += 1
        parts.append(_ESCAPE.sub(b"", text[pos:cut]))
        pos = cut
    return b"".join(parts)


def _check_brackets(name: str, doc: bytes, start: int, end: int) -> None:
    """doc[start:end] is one array: it opens at start, closes at end - 1 and its depth stays above 0
    in between. Checked 4 MiB at a time on a zero-copy view."""
    depth = 0
    for pos in range(start, end, 4 * JSON_CHUNK_BYTES):
        n = min(4 * JSON_CHUNK_BYTES, end - pos)
        codes = np.frombuffer(doc, dtype=np.uint8, count=n, offset=pos)
        brackets = codes[(codes == 91) | (codes == 93)]
        if not brackets.size:
            continue
        levels = depth + np.cumsum(np.where(brackets == 91, np.int8(1), np.int8(-1)), dtype=np.int64)
        inner = levels[:-1] if pos + n == end else levels
        if inner.size and inner.min() <= 0:
            break
        depth = int(levels[-1])
    else:
        if depth == 0:
            return
    raise InvalidInput(name, "'data' is not a well-formed (nested) JSON list")


def _loads(text: bytes):
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument(f"failed to parse the request JSON: {exc}") from None
