"""V2 datatypes <-> numpy, and the raw (binary) tensor encoding: the foundation every layer shares.

Raw encoding: little-endian, row-major, no padding; BOOL is one byte; BYTES is, per element,
a uint32 little-endian length followed by the bytes. BF16 is ml_dtypes' bfloat16 (the type tritonclient gives and
takes for BF16): two bytes, the upper half of an FP32.
"""
from __future__ import annotations

import struct

import ml_dtypes
import numpy as np

from .errors import InvalidArgument, InvalidInput

_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "BYTES": np.dtype(object),
}

_U32 = struct.Struct("<I")

_BY_NUMPY: dict[np.dtype, str] = {v: k for k, v in _DTYPES.items() if k != "BYTES"}

DATATYPES = frozenset(_DTYPES)


def numpy_dtype(datatype: str) -> np.dtype:
    """numpy dtype for a V2 datatype; raises InvalidArgument naming an unknown one."""
    try:
        return _DTYPES[datatype]
    except KeyError:
        raise InvalidArgument(f"invalid datatype '{datatype}'") from None


def v2_datatype(dtype: np.dtype) -> str:
    """V2 datatype for a numpy dtype (object / str / bytes arrays are BYTES)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "OSU":
        return "BYTES"
    name = _BY_NUMPY.get(dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype)
    if name is None:
        raise InvalidArgument(f"numpy dtype {dtype} has no V2 datatype")
    return name


def element_count(shape: tuple[int, ...] | list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def check_shape(name: str, shape) -> tuple[int, ...]:
    """Validate a request shape: a list of non-negative ints."""
    if not isinstance(shape, (list, tuple)):
        raise InvalidInput(name, "shape must be a list of integers")
    out = []
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise InvalidInput(name, f"invalid shape {list(shape)}")
        out.append(d)
    return tuple(out)


def serialize_bytes(array: np.ndarray) -> bytes:
    """BYTES tensor -> length-prefixed raw form."""
    parts = []
    pack = struct.Struct("<I").pack
    for item in array.reshape(-1):
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, (bytes, bytearray, memoryview)):
            item = str(item).encode("utf-8")
        parts.append(pack(len(item)))
        parts.append(bytes(item))
    return b"".join(parts)


def bytes_array_from_raw(name: str, shape: tuple[int, ...], raw) -> np.ndarray:
    """Length-prefixed BYTES data -> object array of `shape`; refuses a count that differs from the
    shape's before building more than that many elements (4 bytes per element at least)."""
    count = element_count(shape)
    mv = memoryview(raw)
    size = len(mv)
    if 4 * count > size:
        raise InvalidInput(name, f"{size} bytes of BYTES data cannot hold the {count} elements "
                              f"of shape {list(shape)} (4 bytes of length prefix each)")
    out = np.empty(count, dtype=object)
    offset = 0
    unpack = _U32.unpack_from
    for i in range(count):
        if offset + 4 > size:
            raise InvalidInput(name, f"expected {count} BYTES elements for shape {list(shape)}, got {i}")
        (length,) = unpack(mv, offset)
        offset += 4
        end = offset + length
        if end > size:
            raise InvalidInput(name, f"BYTES element of {length} bytes overruns the tensor data")
        out[i] = bytes(mv[offset:end])
        offset = end
    if offset != size:
        raise InvalidInput(name, f"expected {count} BYTES elements for shape {list(shape)}, "
                              f"got {size - offset} bytes more data after them")
    return out.reshape(shape)


def array_from_raw(name: str, datatype: str, shape: tuple[int, ...], raw) -> np.ndarray:
    """Decode raw tensor bytes (zero-copy for fixed-size types) and check the size against the shape."""
    count = element_count(shape)
    if datatype == "BYTES":
        return bytes_array_from_raw(name, shape, raw)
    dtype = numpy_dtype(datatype)
    expected = count * dtype.itemsize
    nbytes = len(raw)
    if nbytes != expected:
        raise InvalidInput(
            name, f"got {nbytes} bytes of data, expected {expected} for shape {list(shape)} and datatype {datatype}"
        )
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def raw_from_array(array: np.ndarray, datatype: str) -> bytes | memoryview:
    """Encode an array in raw form (no copy when it is already contiguous little-endian)."""
    if datatype == "BYTES":
        return serialize_bytes(array)
    dtype = numpy_dtype(datatype)
    if array.dtype != dtype:
        array = array.astype(dtype)
    if array.size == 0:
        return b""
    return raw_view(np.ascontiguousarray(array))


def raw_view(array: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array, not copied (a bfloat16 array has no buffer format of its own: its bytes
    are viewed as uint8)."""
    return memoryview(array.view(np.uint8) if array.dtype.kind == "V" else array).cast("B")


def array_from_list(name: str, datatype: str, shape: tuple[int, ...], data) -> np.ndarray:
    """Decode JSON tensor data (flat or nested, row-major) into an array of `shape`."""
    count = element_count(shape)
    if datatype == "BYTES":
        flat = _flatten(data)
        if len(flat) != count:
            raise InvalidInput(name, f"expected {count} elements for shape {list(shape)}, got {len(flat)}")
        arr = np.empty(count, dtype=object)
        for i, item in enumerate(flat):
            if isinstance(item, str):
                arr[i] = item.encode("utf-8")
            elif isinstance(item, (bytes, bytearray)):
                arr[i] = bytes(item)
            else:
                raise InvalidInput(name, "BYTES data must be strings")
        return arr.reshape(shape)
    dtype = numpy_dtype(datatype)
    try:
        arr = np.asarray(data)
    except (ValueError, TypeError):
        arr = None
    if arr is None or arr.dtype == object:
        flat = _flatten(data)
        arr = np.asarray(flat)
    if arr.dtype.kind not in "biuf" or arr.size != count:
        if arr.size != count:
            raise InvalidInput(
                name, f"expected {count} elements for shape {list(shape)}, got {arr.size}"
            )
        raise InvalidInput(name, f"data is not numeric for datatype {datatype}")
    if datatype == "BOOL" and arr.dtype.kind != "b":
        raise InvalidInput(name, "BOOL data must be true/false")
    if dtype.kind in "iu" and arr.dtype.kind == "f":
        raise InvalidInput(name, f"got floating-point data for datatype {datatype}")
    try:
        with np.errstate(all="raise"):
            out = arr.astype(dtype, casting="unsafe").reshape(shape)
    except (OverflowError, FloatingPointError, ValueError) as exc:
        raise InvalidInput(name, f"data does not fit datatype {datatype}: {exc}") from None
    if dtype.kind in "iu" and not np.array_equal(out.reshape(-1), arr.reshape(-1)):
        raise InvalidInput(name, f"data out of range for datatype {datatype}")
    return out


def list_from_array(array: np.ndarray, datatype: str) -> list:
    """Flat JSON list for an output tensor."""
    if datatype == "BYTES":
        out = []
        for item in array.reshape(-1):
            if isinstance(item, (bytes, bytearray)):
                try:
                    out.append(bytes(item).decode("utf-8"))
                except UnicodeDecodeError:
                    out.append(bytes(item).decode("latin-1"))
            else:
                out.append(str(item))
        return out
    if datatype == "FP16" or datatype == "BF16":
        array = array.astype(np.float32)
    return array.reshape(-1).tolist()


def _flatten(data) -> list:
    if not isinstance(data, list):
        return [data]
    out: list = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out
