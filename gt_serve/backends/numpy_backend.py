"""Host (NumPy) implementation of `ArrayBackend`: the reference twin of every kernel in
`kernels/batching.cu`, and the CPU serving path.

Batch layout shared with the CUDA kernels: request i owns rows
`row_offsets[i]:row_offsets[i + 1]` of the batch, where `row_offsets` is the exclusive prefix
sum of the per-request row counts (length n + 1).
"""
from __future__ import annotations

import itertools

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

HOST_ALIGNMENT_BYTES = 64


def batch_signature(arrays: Sequence[Any]) -> tuple[np.dtype, tuple[int, ...], int]:
    """(dtype, trailing shape, total rows) of arrays that can be packed together.

    Raises ValueError when the list is empty, an array is 0-d, or dtypes / trailing shapes
    differ. Works on any array type exposing `.dtype` and `.shape` (numpy, cupy).
    """
    if len(arrays) == 0:
        raise ValueError("pack needs at least one array (or an `out` buffer)")
    first = arrays[0]
    dtype, trailing = first.dtype, tuple(first.shape[1:])
    total_rows = 0
    for array in arrays:
        shape = array.shape
        if len(shape) == 0:
            raise ValueError("cannot pack a 0-d array: axis 0 is the batch axis")
        if array.dtype != dtype or tuple(shape[1:]) != trailing:
            raise ValueError(
                f"cannot pack {array.dtype}{list(shape)} with {dtype}[n, *{list(trailing)}]"
            )
        total_rows += shape[0]
    return dtype, trailing, total_rows


def row_offsets(counts: Sequence[int]) -> np.ndarray:
    """Exclusive prefix sum of row counts, int64, length len(counts) + 1."""
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    if len(counts):
        np.cumsum(counts, out=offsets[1:])
    return offsets


def check_counts(counts: Sequence[int], batch_rows: int) -> np.ndarray:
    """Validate scatter counts against a batch of `batch_rows` rows; returns `row_offsets`."""
    offsets = row_offsets(counts)
    if len(counts) and int(np.min(counts)) < 0:
        raise ValueError(f"negative count in {list(counts)}")
    if offsets[-1] > batch_rows:
        raise ValueError(f"counts sum to {int(offsets[-1])} rows, batch has {batch_rows}")
    return offsets


def usable_out(out: Any, dtype: np.dtype, trailing: tuple[int, ...], rows: int) -> bool:
    """Whether `out` can hold `rows` rows of dtype[rows, *trailing].

    A wrong dtype or trailing shape is a programming error (ValueError); too few rows is a
    capacity miss (False), and the caller allocates a new array instead.
    """
    if out.dtype != dtype or tuple(out.shape[1:]) != trailing:
        raise ValueError(
            f"out buffer {out.dtype}{list(out.shape)} does not match {dtype}[n, *{list(trailing)}]"
        )
    return out.shape[0] >= rows


def padded_signature(
    arrays: Sequence[Any], length: int | None
) -> tuple[np.dtype, tuple[int, ...], int, int]:
    """(dtype, rest shape after axis 1, total rows, padded length) for `pack_pad`."""
    if len(arrays) == 0:
        raise ValueError("pack_pad needs at least one array")
    first = arrays[0]
    if len(first.shape) < 2:
        raise ValueError("pack_pad needs arrays shaped [n, L, ...]")
    dtype, rest = first.dtype, tuple(first.shape[2:])
    total_rows, max_len = 0, 0
    for array in arrays:
        shape = array.shape
        if len(shape) < 2 or array.dtype != dtype or tuple(shape[2:]) != rest:
            raise ValueError(
                f"cannot pad-pack {array.dtype}{list(shape)} with {dtype}[n, L, *{list(rest)}]"
            )
        total_rows += shape[0]
        max_len = max(max_len, shape[1])
    if length is not None:
        if length < max_len:
            raise ValueError(f"length {length} is shorter than the longest input ({max_len})")
        max_len = length
    return dtype, rest, total_rows, max_len


def aligned_host_bytes(nbytes: int, alignment_bytes: int = HOST_ALIGNMENT_BYTES) -> np.ndarray:
    """A 1-D uint8 host array of `nbytes` whose first byte is `alignment_bytes`-aligned."""
    raw = np.empty(nbytes + alignment_bytes, dtype=np.uint8)
    shift = (-raw.ctypes.data) % alignment_bytes
    return raw[shift : shift + nbytes]


class NumpyBackend:
    """Reference `ArrayBackend` on host memory. Stateless and thread-safe."""

    @property
    def name(self) -> str:
        return "numpy"

    def pack(self, arrays: Sequence[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        """Concatenate along axis 0. With `out` large enough the result is the view
        `out[:total]`; otherwise a new array, or the single input itself (zero copy) when one
        array and no `out` are given. Mismatched dtypes or trailing shapes raise ValueError."""
        if len(arrays) == 0:
            if out is None:
                raise ValueError("pack needs at least one array (or an `out` buffer)")
            return out[:0]
        first = arrays[0]
        if first.ndim == 0:
            raise ValueError("cannot pack a 0-d array: axis 0 is the batch axis")
        target = None
        if out is None:
            if len(arrays) == 1:
                return first
        else:
            try:
                total_rows = sum([a.shape[0] for a in arrays])
            except IndexError:
                raise ValueError("cannot pack a 0-d array: axis 0 is the batch axis") from None
            if usable_out(out, first.dtype, first.shape[1:], total_rows):
                target = out[:total_rows]
        try:  # numpy checks dtypes (casting="no": the first's, where there is no target) and trailing shapes in C
            return np.concatenate(arrays, axis=0, out=target, casting="no")
        except (TypeError, ValueError) as exc:
            batch_signature(arrays)  # raises the descriptive ValueError
            raise ValueError(str(exc)) from exc

    def scatter(
        self, batch: np.ndarray, counts: Sequence[int], copy: bool = False
    ) -> list[np.ndarray]:
        """Split `batch` along axis 0 into pieces of `counts[i]` rows; rows past sum(counts)
        (padding) are ignored. With `copy=False` the pieces are views of `batch`: copy them (or
        pass `copy=True`, which makes one copy of the used rows and returns views of it) before
        the batch buffer is reused for the next batch."""
        bounds = [0, *itertools.accumulate(counts)]  # plain ints: this runs once per output per batch
        if bounds[-1] > batch.shape[0] or (counts and min(counts) < 0):
            check_counts(counts, batch.shape[0])  # raises the descriptive ValueError
        if copy:  # one copy per batch; the pieces are views of it, never of `batch`
            batch = batch[: bounds[-1]].copy()
        return [batch[bounds[i] : bounds[i + 1]] for i in range(len(counts))]

    def pack_pad(
        self,
        arrays: Sequence[np.ndarray],
        pad_value: float | int | bool = 0,
        out: np.ndarray | None = None,
        length: int | None = None,
    ) -> np.ndarray:
        """Pack arrays shaped [n_i, L_i, *rest] into [sum(n_i), length, *rest], where `length`
        defaults to max(L_i); positions past L_i are set to `pad_value`."""
        dtype, rest, total_rows, max_len = padded_signature(arrays, length)
        trailing = (max_len, *rest)
        if out is not None and usable_out(out, dtype, trailing, total_rows):
            result = out[:total_rows]
        else:
            result = np.empty((total_rows, *trailing), dtype=dtype)
        row = 0
        for array in arrays:
            rows, array_len = array.shape[0], array.shape[1]
            result[row : row + rows, :array_len] = array
            result[row : row + rows, array_len:] = pad_value
            row += rows
        return result

    def empty(self, shape: Sequence[int], dtype: DTypeLike) -> np.ndarray:
        return np.empty(tuple(shape), dtype=dtype)

    def alloc_host(self, nbytes: int) -> np.ndarray:
        """Host staging memory: a 64-byte aligned uint8 array (pageable on this backend)."""
        return aligned_host_bytes(nbytes)

    def from_host(self, array: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if out is None:
            return array
        target = out[: array.shape[0]]
        target[...] = array
        return target

    def to_host(self, array: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if out is None:
            return np.asarray(array)
        target = out[: array.shape[0]]
        target[...] = array
        return target

    def synchronize(self) -> None:
        return None

    def memory_statistics(self) -> dict[str, int]:
        """Device pool statistics; a host backend has no device pool."""
        return {}
