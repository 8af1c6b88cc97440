"""An inference request checked against the model's spec, before it is queued.

check_inputs: names, datatypes, shapes, batch size (the model's and the server's limit), UTF-8 of
BYTES, and shared-memory inputs read from their region; returns what the executor takes.
check_outputs: requested output names, `classification`, and output regions (checked, not written).
check_request: both, once per request form (InferRequest.form) and loaded model: a later request of that form is
not checked again (its data is all that differs), except that its inputs in shared memory are read and its
regions looked up again (a region may have been unregistered or truncated since).
Every failure is an InvalidArgument naming the tensor and the model.
"""
from __future__ import annotations

import numpy as np

from ..datatypes import array_from_raw, element_count
from ..errors import InvalidArgument
from ..types import InferRequest, RequestedOutput, Tensor
from .registry import LoadedModel
from .shared_memory import SystemSharedMemory


MAX_CHECKED_FORMS = 256  # per loaded model; a full table starts over


def check_request(model: LoadedModel, request: InferRequest, shm: SystemSharedMemory,
                  max_batch_size: int) -> tuple[dict, int, tuple, list[RequestedOutput] | None]:
    """(feeds by input name, batch size, shape key, requested outputs): check_inputs and check_outputs, or what
    they returned for an earlier request of the same form on this model."""
    form = request.form
    if form is not None:
        checked = model.checked_forms.get(form)
        if checked is not None:
            batch_size, shape_key, requested, in_shm = checked
            if in_shm:
                return _shm_feeds(model, request, shm), batch_size, shape_key, _recheck(requested, shm)
            return {t.name: t.data for t in request.inputs}, batch_size, shape_key, \
                None if requested is None else list(requested)
    feeds, batch_size, shape_key = check_inputs(model, request, shm, max_batch_size)
    requested = check_outputs(model, request.outputs, shm)
    if form is not None:
        forms = model.checked_forms
        if len(forms) >= MAX_CHECKED_FORMS:
            forms.clear()
        in_shm = any(t.data is None for t in request.inputs) or \
            (requested is not None and any(o.in_shared_memory for o in requested))
        forms[form] = (batch_size, shape_key, None if requested is None else tuple(requested), in_shm)
    return feeds, batch_size, shape_key, requested


def _shm_feeds(model: LoadedModel, request: InferRequest, shm: SystemSharedMemory) -> dict:
    """A checked form's feeds: its data, and its inputs in shared memory read from their regions."""
    feeds = {}
    for tensor in request.inputs:
        data = tensor.data
        if data is None:
            data = read_shm_input(tensor, shm)
            if model.spec.inputs[tensor.name].datatype == "BYTES":
                check_utf8(tensor.name, model.name, data)
        feeds[tensor.name] = data
    return feeds


def _recheck(requested: tuple[RequestedOutput, ...] | None, shm: SystemSharedMemory) -> list[RequestedOutput] | None:
    """A checked form's requested outputs, their regions looked up again."""
    if requested is None:
        return None
    for out in requested:
        if out.in_shared_memory:
            check_region(out, shm)
    return list(requested)


def check_inputs(model: LoadedModel, request: InferRequest, shm: SystemSharedMemory,
                 max_batch_size: int) -> tuple[dict, int, tuple]:
    """(feeds by input name, batch size, shape key); `max_batch_size` > 0 caps the model's own limit.
    Hot path: every check in one frame, on purpose."""
    spec = model.spec
    name = model.name
    mbs = spec.max_batch_size
    feeds: dict[str, np.ndarray] = {}
    batch_size = 1
    shape_key = []
    for tensor in request.inputs:
        ts = spec.inputs.get(tensor.name)
        if ts is None:
            raise InvalidArgument(f"unexpected inference input '{tensor.name}' for model '{name}'")
        if tensor.name in feeds:
            raise InvalidArgument(f"input '{tensor.name}' is given more than once for model '{name}'")
        if tensor.datatype != ts.datatype:
            raise InvalidArgument(f"inference input '{tensor.name}' data-type is '{tensor.datatype}', "
                                  f"but model '{name}' expects '{ts.datatype}'")
        shape = tuple(tensor.shape)
        dims = ts.dims
        body = shape[1:] if mbs > 0 else shape
        if len(body) != len(dims) or any(d != -1 and d != s for d, s in zip(dims, body)) or (mbs > 0 and not shape):
            expected = ([-1] if mbs > 0 else []) + list(dims)
            raise InvalidArgument(f"unexpected shape for input '{tensor.name}' for model '{name}'. "
                                  f"Expected {_dims(expected)}, got {_dims(shape)}")
        if mbs > 0:
            b = shape[0]
            if b < 1 or b > mbs or (max_batch_size and b > max_batch_size):
                limit = min(mbs, max_batch_size) if max_batch_size else mbs
                raise InvalidArgument(f"inference request batch-size must be <= {limit} for '{name}', "
                                      f"got {b} (input '{tensor.name}')")
            if feeds and b != batch_size:
                raise InvalidArgument(f"input '{tensor.name}' has batch size {b} but other inputs have "
                                      f"{batch_size} for model '{name}'")
            batch_size = b
        data = tensor.data
        if data is None:
            data = read_shm_input(tensor, shm)
        elif data.shape != shape:
            raise InvalidArgument(f"input '{tensor.name}': data holds {data.size} elements, "
                                  f"shape {list(shape)} needs {element_count(shape)}")
        if ts.datatype == "BYTES":
            check_utf8(tensor.name, name, data)
        feeds[tensor.name] = data
        shape_key.append(() if ts.ragged else body)  # a ragged input's shape does not keep requests apart
    if len(feeds) != len(spec.inputs):
        missing = [n for n in spec.input_order if n not in feeds and not spec.inputs[n].optional]
        if missing:
            raise InvalidArgument(f"expected {len(spec.inputs)} inputs but got {len(feeds)} inputs for model "
                                  f"'{name}'. Got input(s) {_names(sorted(feeds))}, but missing required input(s) "
                                  f"{_names(missing)}. Please provide all required input(s).")
    return feeds, batch_size, tuple(shape_key)


def read_shm_input(tensor: Tensor, shm: SystemSharedMemory) -> np.ndarray:
    """An input whose parameters name a system shared-memory region: its data, read from there."""
    p = tensor.parameters
    region = p.get("shared_memory_region")
    if not region:
        raise InvalidArgument(f"input '{tensor.name}' has no data")
    if "shared_memory_byte_size" not in p:
        raise InvalidArgument(f"input '{tensor.name}': 'shared_memory_byte_size' is required with a shared memory region")
    raw = shm.read(region, p.get("shared_memory_offset", 0), p["shared_memory_byte_size"], tensor.name)
    return array_from_raw(tensor.name, tensor.datatype, tuple(tensor.shape), raw)


def check_outputs(model: LoadedModel, outputs: list[RequestedOutput] | None,
                  shm: SystemSharedMemory) -> list[RequestedOutput] | None:
    """The requested outputs, checked (None: all of the model's, in its order)."""
    if outputs is None:
        return None
    spec = model.spec
    seen = set()
    for out in outputs:
        if out.name not in spec.outputs:
            raise InvalidArgument(f"unexpected inference output '{out.name}' for model '{model.name}'")
        if out.name in seen:
            raise InvalidArgument(f"output '{out.name}' is requested more than once for model '{model.name}'")
        seen.add(out.name)
        k = out.parameters.get("classification")
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise InvalidArgument(f"output '{out.name}': 'classification' must be a positive integer, got {k!r}")
        region = out.parameters.get("shared_memory_region")
        if k is not None and region:
            raise InvalidArgument(f"output '{out.name}': classification cannot be written to shared memory")
        if region:
            check_region(out, shm)
    return outputs


def check_region(out: RequestedOutput, shm: SystemSharedMemory) -> None:
    """An output's region, offset and size (the region registered, the extent inside it); nothing is written."""
    p = out.parameters
    shm.check(p["shared_memory_region"], p.get("shared_memory_offset", 0), p.get("shared_memory_byte_size"),
              f"output '{out.name}'")


def check_utf8(tensor: str, model: str, data: np.ndarray) -> None:
    """onnxruntime string tensors hold UTF-8 text: refuse other bytes instead of changing them."""
    for i, item in enumerate(data.reshape(-1)):
        if isinstance(item, (bytes, bytearray)):
            try:
                bytes(item).decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidArgument(f"input '{tensor}' element {i} is not valid UTF-8: model '{model}' takes "
                                      "BYTES as onnxruntime string tensors, which carry UTF-8 text only") from None


def _dims(dims) -> str:
    """Triton's DimsListToString: [-1,16]."""
    return "[" + ",".join(str(d) for d in dims) + "]"


def _names(names) -> str:
    """Triton's input-name lists: ['INPUT0','INPUT1']."""
    return "[" + ",".join(f"'{n}'" for n in names) + "]"
