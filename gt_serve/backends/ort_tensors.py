"""Tensors that onnxruntime's Python API takes or gives otherwise than gt_serve's data plane holds them.

Strings: the data plane's BYTES elements are bytes; onnxruntime takes str (it would str() a bytes object).

bfloat16, which has no numpy type in onnxruntime's Python API: a model with a bfloat16 input or output runs with
OrtValues: each bfloat16 feed (an ml_dtypes.bfloat16 array, as gt_serve.datatypes decodes BF16) becomes an OrtValue
of element type BFLOAT16 over the same bytes, every other feed an OrtValue of its array, and each output comes back
as an array: a bfloat16 one copied out of its OrtValue's buffer into an ml_dtypes.bfloat16 array. Only such models
take this path (OnnxRunner picks it at load); their runs never go through IO binding or RunAsync.
"""
from __future__ import annotations

import ctypes
from typing import Any, Callable

import ml_dtypes
import numpy as np

from ..errors import InvalidArgument

BFLOAT16_TYPE = "tensor(bfloat16)"
_ONNX_BFLOAT16 = 16  # onnx.TensorProto.BFLOAT16
_BF16 = np.dtype(ml_dtypes.bfloat16)


def uses_bfloat16(session: Any) -> bool:
    return any(t.type == BFLOAT16_TYPE for t in (*session.get_inputs(), *session.get_outputs()))


def bfloat16_run(ort: Any, session: Any) -> Callable[[list[str], dict, Any], list[np.ndarray]]:
    """`session.run`'s signature and results (names None: every output), for a session with bfloat16 tensors."""
    if any(t.type == "tensor(string)" for t in (*session.get_inputs(), *session.get_outputs())):
        raise InvalidArgument("a model with both bfloat16 and string tensors is not supported (onnxruntime's Python "
                              "API makes no string OrtValue from an array)")
    bf16_inputs = frozenset(i.name for i in session.get_inputs() if i.type == BFLOAT16_TYPE)
    every_output = [o.name for o in session.get_outputs()]
    as_value, as_typed_value = ort.OrtValue.ortvalue_from_numpy, ort.OrtValue.ortvalue_from_numpy_with_onnx_type

    def run(names: list[str] | None, feeds: dict, run_options: Any = None) -> list[np.ndarray]:
        names = names or every_output
        values = {}
        for name, array in feeds.items():
            if name in bf16_inputs:
                bits = np.ascontiguousarray(array, dtype=_BF16).view(np.uint16)
                values[name] = as_typed_value(bits, _ONNX_BFLOAT16)
            else:
                values[name] = as_value(np.ascontiguousarray(array))
        return [_as_array(value) for value in session.run_with_ort_values(names, values, run_options)]

    return run


def _as_array(value: Any) -> np.ndarray:
    if value.data_type() != BFLOAT16_TYPE:
        return value.numpy()
    if value.device_name().lower() != "cpu":  # Run gives host outputs; a device pointer must never reach memmove
        raise RuntimeError(f"a bfloat16 output came back on {value.device_name()}, not in host memory")
    shape = tuple(value.shape())
    out = np.empty(shape, dtype=_BF16)
    if out.size:
        ctypes.memmove(out.ctypes.data, value.data_ptr(), out.nbytes)
    return out


def as_str_array(array: np.ndarray) -> np.ndarray:
    """A BYTES array as onnxruntime takes it: each element decoded from UTF-8 (the data plane has refused anything
    else)."""
    flat = array.reshape(-1)
    out = np.empty(flat.shape[0], dtype=object)
    for i, item in enumerate(flat):
        if isinstance(item, (bytes, bytearray)):
            item = bytes(item).decode("utf-8")
        out[i] = item
    return out.reshape(array.shape)
