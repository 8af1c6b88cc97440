"""CuPy implementation of `ArrayBackend`: the kernels of `kernels/batching.cu` on one device
and one stream (one backend per execution lane).

CuPy is imported lazily in the constructor, so importing this module never needs it. Device
allocations come from a private `cupy.cuda.MemoryPool` (optionally capped with
`memory_limit_bytes`); host staging memory (`alloc_host`) is page-locked.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.resources
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import DTypeLike

from gt_serve.backends.numpy_backend import (
    NumpyBackend,
    batch_signature,
    check_counts,
    padded_signature,
    row_offsets,
    usable_out,
)

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

KERNELS_PACKAGE = "gt_serve.kernels"  # the top-level kernels/ folder, as installed (setup.py)
KERNEL_FAMILY = "batching"
KERNEL_NAMES = ("gt_pack", "gt_scatter", "gt_pack_pad")
MAX_GRID_Y = 65535
MAX_GRID_X = 1024


def find_kernels_dir(explicit: Path | None = None) -> Traversable:
    """Where the .cu sources are: `explicit` when given, else the package `gt_serve.kernels`, which
    the build makes of the top-level kernels/ folder (setup.py) in wheels and editable installs
    alike. A source tree that was never installed has no such package: `pip install -e .`."""
    if explicit is not None:
        return explicit
    try:
        return importlib.resources.files(KERNELS_PACKAGE)
    except ModuleNotFoundError as exc:
        raise FileNotFoundError(
            f"CUDA kernel sources not found: {KERNELS_PACKAGE} is not installed (it is the repository's "
            "kernels/ folder once gt_serve is installed: pip install -e . from the repository)") from exc


def kernel_source(family: str, kernels_dir: Path | None = None) -> str:
    return (find_kernels_dir(kernels_dir) / f"{family}.cu").read_text(encoding="utf-8")


def pad_bits(pad_value: float | int | bool, dtype: np.dtype) -> np.uint64:
    """The bytes of `pad_value` as `dtype`, little-endian, in the low bytes of a uint64."""
    raw = np.zeros(8, dtype=np.uint8)
    encoded = np.array(pad_value, dtype=dtype).astype(dtype.newbyteorder("<")).tobytes()
    raw[: len(encoded)] = np.frombuffer(encoded, dtype=np.uint8)
    return raw.view("<u8")[0].astype(np.uint64)


class DescriptorRing:
    """Kernel descriptors (pointers, row offsets) go to the device through a few pinned host
    slots and device slots, with an asynchronous copy on the lane's stream: a copy from pageable
    memory would first wait for everything queued on the stream, so back-to-back packs could not
    overlap. A slot is rewritten only after the event recorded behind its last copy has passed;
    its device half is reused in stream order, after the kernel that read it."""

    def __init__(self, cp: Any, stream: Any, slots: int = 8) -> None:
        self._cp = cp
        self._stream = stream
        self._slots: list[list[Any] | None] = [None] * slots
        self._next = 0

    def upload(self, host: np.ndarray) -> Any:
        """The bytes of `host` (int64) on the device, as an int64 array; asynchronous."""
        cp = self._cp
        nbytes = host.nbytes
        index = self._next
        self._next = (index + 1) % len(self._slots)
        slot = self._slots[index]
        if slot is None or slot[0].nbytes < nbytes:
            capacity = max(4096, 1 << (max(nbytes, 1) - 1).bit_length())
            pinned = np.frombuffer(cp.cuda.alloc_pinned_memory(capacity), dtype=np.uint8, count=capacity)
            if slot is not None and slot[2] is not None:
                slot[2].synchronize()  # the old slot may still be copying
            slot = self._slots[index] = [pinned, cp.empty(capacity, dtype=np.uint8), None]
        pinned, device, done = slot
        if done is not None:
            done.synchronize()  # normally long passed
        else:
            done = slot[2] = cp.cuda.Event(block=False, disable_timing=True)
        pinned[:nbytes] = host.view(np.uint8)
        device.data.copy_from_host_async(pinned.ctypes.data, nbytes, self._stream)
        done.record(self._stream)
        return device[:nbytes].view(np.int64)


class CupyBackend:
    """`ArrayBackend` on one CUDA device and stream. Use one instance per lane thread."""

    def __init__(
        self,
        stream: Any | None = None,
        device_id: int | None = None,
        memory_limit_bytes: int | None = None,
        kernels_dir: Path | None = None,
        block_threads: int = 256,
        memory_pool: Any | None = None,
    ) -> None:
        """`memory_pool`: a `cupy.cuda.MemoryPool` shared with the device's other lanes (then
        `memory_limit_bytes`, if given, is applied to it); by default a private one."""
        cp = importlib.import_module("cupy")
        self._cp = cp
        self._device = cp.cuda.Device(device_id) if device_id is not None else cp.cuda.Device()
        self._block_threads = block_threads
        self._host = NumpyBackend()
        with self._device:
            self._stream = stream if stream is not None else cp.cuda.Stream(non_blocking=True)
            self._pool = memory_pool if memory_pool is not None else cp.cuda.MemoryPool()
            if memory_limit_bytes is not None:
                self._pool.set_limit(size=memory_limit_bytes)
            module = cp.RawModule(
                code=kernel_source(KERNEL_FAMILY, kernels_dir), options=("--std=c++17",)
            )
            self._kernels = {name: module.get_function(name) for name in KERNEL_NAMES}
        self._ring = DescriptorRing(cp, self._stream)

    @property
    def name(self) -> str:
        return "cupy"

    @property
    def stream(self) -> Any:
        return self._stream

    @property
    def device_id(self) -> int:
        return int(self._device.id)

    @contextlib.contextmanager
    def _on_lane(self) -> Iterator[None]:
        """Device, stream and allocator of this lane (all thread-local in CuPy)."""
        with self._device, self._stream, self._cp.cuda.using_allocator(self._pool.malloc):
            yield

    def _device_arrays(self, arrays: Sequence[Any]) -> list[Any]:
        cp = self._cp
        device = cp.ndarray
        return [a if isinstance(a, device) and a.flags.c_contiguous else cp.ascontiguousarray(cp.asarray(a))
                for a in arrays]

    def _descriptor(self, arrays: Sequence[Any], offsets: np.ndarray, extra: Sequence[int] = ()) -> tuple[Any, ...]:
        """(device uint64 pointers, device int64 row offsets[, device int64 extra]) in one
        asynchronous host-to-device copy through the descriptor ring."""
        n = len(arrays)
        desc = np.empty(2 * n + 1 + len(extra), dtype=np.int64)
        desc[:n] = [a.data.ptr for a in arrays]
        desc[n:2 * n + 1] = offsets
        desc[2 * n + 1:] = extra
        desc_dev = self._ring.upload(desc)
        parts = (desc_dev[:n].view(self._cp.uint64), desc_dev[n:2 * n + 1])
        return (*parts, desc_dev[2 * n + 1:]) if len(extra) else parts

    def _grid(self, n_requests: int, max_work: int, per_block: int) -> tuple[int, int]:
        blocks_x = max(1, min(MAX_GRID_X, -(-max_work // per_block)))
        return blocks_x, max(1, min(MAX_GRID_Y, n_requests))

    def _target(self, out: Any | None, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        """`out[:rows]` (must be C-contiguous: kernels write raw bytes) or a new array."""
        if out is None:
            return self._cp.empty(shape, dtype=dtype)
        target = out[: shape[0]]
        if not target.flags.c_contiguous:
            raise ValueError("out buffer must be C-contiguous")
        return target

    def pack(self, arrays: Sequence[Any], out: Any | None = None) -> Any:
        """Same contract as `NumpyBackend.pack`; host (numpy) inputs are packed on the host
        and copied to the device once."""
        if len(arrays) == 0 and out is not None:
            return out[:0]
        dtype, trailing, total_rows = batch_signature(arrays)
        fits = out is not None and usable_out(out, dtype, trailing, total_rows)
        if not any(isinstance(a, self._cp.ndarray) for a in arrays):
            return self.from_host(self._host.pack(arrays), out if fits else None)
        with self._on_lane():
            if out is None and len(arrays) == 1:
                return self._cp.asarray(arrays[0])
            target = self._target(out if fits else None, (total_rows, *trailing), dtype)
            self._launch_copy("gt_pack", self._device_arrays(arrays), target)
            return target

    def scatter(self, batch: Any, counts: Sequence[int], copy: bool = False) -> list[Any]:
        """Same contract as `NumpyBackend.scatter`; `copy=True` allocates one buffer per request
        and fills them all with a single `gt_scatter` launch."""
        offsets = check_counts(counts, batch.shape[0])
        bounds = offsets.tolist()
        if not copy:
            return [batch[bounds[i] : bounds[i + 1]] for i in range(len(counts))]
        with self._on_lane():
            batch = self._cp.ascontiguousarray(batch)
            trailing = tuple(batch.shape[1:])
            pieces = [self._cp.empty((int(c), *trailing), dtype=batch.dtype) for c in counts]
            if pieces:
                self._launch_copy("gt_scatter", pieces, batch)
            return pieces

    def _launch_copy(self, kernel: str, requests: Sequence[Any], batch: Any) -> None:
        counts = [a.shape[0] for a in requests]
        offsets = row_offsets(counts)
        row_bytes = int(batch.dtype.itemsize * int(np.prod(batch.shape[1:], dtype=np.int64)))
        max_bytes = max(counts) * row_bytes
        if max_bytes == 0:
            return
        ptrs, offsets_dev = self._descriptor(requests, offsets)
        grid = self._grid(len(requests), max_bytes, self._block_threads * 16)
        args = (ptrs, offsets_dev, np.int32(len(requests)), np.int64(row_bytes), batch)
        self._kernels[kernel](grid, (self._block_threads,), args)

    def pack_pad(
        self,
        arrays: Sequence[Any],
        pad_value: float | int | bool = 0,
        out: Any | None = None,
        length: int | None = None,
    ) -> Any:
        """Same contract as `NumpyBackend.pack_pad`, one `gt_pack_pad` launch."""
        dtype, rest, total_rows, max_len = padded_signature(arrays, length)
        trailing = (max_len, *rest)
        with self._on_lane():
            fits = out is not None and usable_out(out, dtype, trailing, total_rows)
            target = self._target(out if fits else None, (total_rows, *trailing), dtype)
            if target.size == 0:
                return target
            requests = self._device_arrays(arrays)
            offsets = row_offsets([a.shape[0] for a in requests])
            ptrs, offsets_dev, lens_dev = self._descriptor(requests, offsets, [a.shape[1] for a in requests])
            inner_bytes = dtype.itemsize * int(np.prod(rest, dtype=np.int64))
            grid = self._grid(len(requests), max(a.shape[0] for a in requests), 1)
            args = (
                ptrs, offsets_dev, lens_dev, np.int32(len(requests)), np.int64(max_len),
                np.int64(inner_bytes), np.int32(dtype.itemsize), pad_bits(pad_value, dtype),
                target,
            )
            self._kernels["gt_pack_pad"](grid, (self._block_threads,), args)
            return target

    def empty(self, shape: Sequence[int], dtype: DTypeLike) -> Any:
        with self._on_lane():
            return self._cp.empty(tuple(shape), dtype=dtype)

    def alloc_host(self, nbytes: int) -> np.ndarray:
        """Page-locked host memory (CuPy's pinned allocator), as a 1-D uint8 array."""
        with self._device:
            memory = self._cp.cuda.alloc_pinned_memory(max(nbytes, 1))
        return np.frombuffer(memory, dtype=np.uint8, count=nbytes)

    def from_host(self, array: np.ndarray, out: Any | None = None) -> Any:
        with self._on_lane():
            if out is None:
                return self._cp.asarray(array)
            target = out[: array.shape[0]]
            target.set(np.ascontiguousarray(array), stream=self._stream)
            return target

    def to_host(self, array: Any, out: np.ndarray | None = None) -> np.ndarray:
        """Device to host on this lane's stream; blocks until the copy is done."""
        with self._on_lane():
            if not isinstance(array, self._cp.ndarray):
                return self._host.to_host(array, out)
            target = None if out is None else out[: array.shape[0]]
            return array.get(stream=self._stream, out=target)

    def synchronize(self) -> None:
        self._stream.synchronize()

    def memory_statistics(self) -> dict[str, int]:
        return {
            "device_used_bytes": int(self._pool.used_bytes()),
            "device_total_bytes": int(self._pool.total_bytes()),
            "device_limit_bytes": int(self._pool.get_limit()),
            "device_free_blocks": int(self._pool.n_free_blocks()),
        }
