"""NumpyBackend: the reference pack / scatter / pack_pad every GPU kernel is compared with."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gt_serve.backends.base import ArrayBackend
from gt_serve.backends.numpy_backend import NumpyBackend, aligned_host_bytes, row_offsets

DTYPES = [np.float32, np.int64, np.bool_, np.float16, np.uint8, np.float64]


@pytest.fixture
def backend() -> NumpyBackend:
    return NumpyBackend()


def _random(rng: np.random.Generator, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    return (rng.standard_normal(shape) * 100).astype(dtype)


def test_satisfies_protocol(backend: NumpyBackend) -> None:
    assert isinstance(backend, ArrayBackend)
    assert backend.name == "numpy"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("counts", [[1], [3, 0, 5], [1] * 17, [0, 0, 2]])
def test_pack_then_scatter_roundtrip(backend: NumpyBackend, dtype: type, counts: list[int]) -> None:
    rng = np.random.default_rng(7)
    arrays = [_random(rng, (n, 3, 2), dtype) for n in counts]
    batch = backend.pack(arrays)
    assert batch.shape == (sum(counts), 3, 2) and batch.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(batch, np.concatenate(arrays))
    for piece, original in zip(backend.scatter(batch, counts), arrays, strict=True):
        np.testing.assert_array_equal(piece, original)


def test_single_array_without_out_is_zero_copy(backend: NumpyBackend) -> None:
    array = np.arange(6, dtype=np.float32).reshape(3, 2)
    assert backend.pack([array]) is array


def test_pack_into_out_buffer_reuses_it(backend: NumpyBackend) -> None:
    out = np.full((10, 2), -1, dtype=np.int64)
    first = backend.pack([np.ones((2, 2), np.int64), np.zeros((3, 2), np.int64)], out=out)
    assert first.base is out or np.shares_memory(first, out)
    assert first.shape == (5, 2)
    np.testing.assert_array_equal(out[5:], -1)  # rows past the batch are untouched
    second = backend.pack([np.full((4, 2), 7, np.int64)], out=out)
    assert np.shares_memory(second, out) and second.shape == (4, 2)
    np.testing.assert_array_equal(out[:4], 7)


def test_pack_with_too_small_out_allocates(backend: NumpyBackend) -> None:
    out = np.zeros((2, 3), dtype=np.float32)
    arrays = [np.ones((2, 3), np.float32), np.ones((1, 3), np.float32)]
    result = backend.pack(arrays, out=out)
    assert result.shape == (3, 3) and not np.shares_memory(result, out)
    np.testing.assert_array_equal(out, 0)


def test_pack_out_with_wrong_layout_is_an_error(backend: NumpyBackend) -> None:
    with pytest.raises(ValueError):
        backend.pack([np.ones((2, 3), np.float32)], out=np.zeros((8, 3), np.float64))
    with pytest.raises(ValueError):
        backend.pack([np.ones((2, 3), np.float32)], out=np.zeros((8, 4), np.float32))


def test_pack_empty_list(backend: NumpyBackend) -> None:
    out = np.zeros((4, 2), np.float32)
    assert backend.pack([], out=out).shape == (0, 2)
    with pytest.raises(ValueError):
        backend.pack([])


@pytest.mark.parametrize(
    "arrays",
    [
        [np.ones((2, 3), np.float32), np.ones((2, 3), np.float64)],
        [np.ones((2, 3), np.float32), np.ones((2, 4), np.float32)],
        [np.ones((2, 3), np.float32), np.ones((2, 3, 1), np.float32)],
        [np.float32(1.0) * np.ones(())],
    ],
)
def test_pack_rejects_mismatched_inputs(backend: NumpyBackend, arrays: list[np.ndarray]) -> None:
    with pytest.raises(ValueError):
        backend.pack(arrays)


def test_pack_one_dimensional_and_zero_rows(backend: NumpyBackend) -> None:
    arrays = [np.arange(n, dtype=np.int64) for n in (3, 0, 2)]
    np.testing.assert_array_equal(backend.pack(arrays), [0, 1, 2, 0, 1])
    assert backend.pack([np.zeros((0, 4), np.float16)] * 3).shape == (0, 4)


def test_pack_non_contiguous_inputs(backend: NumpyBackend) -> None:
    base = np.arange(40, dtype=np.float32).reshape(4, 10)
    arrays = [base[:, ::2], base[1:3, 1::2]]
    np.testing.assert_array_equal(backend.pack(arrays), np.concatenate(arrays))


def test_scatter_views_and_copies(backend: NumpyBackend) -> None:
    batch = np.arange(12, dtype=np.float32).reshape(6, 2)
    views = backend.scatter(batch, [2, 4])
    assert all(np.shares_memory(v, batch) for v in views)
    copies = backend.scatter(batch, [2, 4], copy=True)
    batch[:] = -1  # the batch buffer is reused for the next batch
    np.testing.assert_array_equal(copies[0], [[0, 1], [2, 3]])
    np.testing.assert_array_equal(views[0], -1)
    assert not any(np.shares_memory(c, batch) for c in copies)


def test_scatter_ignores_padding_rows_and_checks_counts(backend: NumpyBackend) -> None:
    batch = np.arange(8, dtype=np.int64)  # 5 real rows, padded to the preferred size 8
    pieces = backend.scatter(batch, [2, 0, 3])
    assert [p.tolist() for p in pieces] == [[0, 1], [], [2, 3, 4]]
    assert backend.scatter(batch, []) == []
    with pytest.raises(ValueError):
        backend.scatter(batch, [5, 4])
    with pytest.raises(ValueError):
        backend.scatter(batch, [3, -1])


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.float16])
def test_pack_pad(backend: NumpyBackend, dtype: type) -> None:
    rng = np.random.default_rng(3)
    arrays = [_random(rng, shape, dtype) for shape in [(2, 3, 4), (1, 5, 4), (3, 1, 4)]]
    pad = np.array(1, dtype=dtype).item()
    batch = backend.pack_pad(arrays, pad_value=pad)
    assert batch.shape == (6, 5, 4) and batch.dtype == np.dtype(dtype)
    row = 0
    for array in arrays:
        n, length = array.shape[:2]
        np.testing.assert_array_equal(batch[row : row + n, :length], array)
        np.testing.assert_array_equal(batch[row : row + n, length:], pad)
        row += n


def test_pack_pad_fixed_length_and_out(backend: NumpyBackend) -> None:
    out = np.full((8, 6), 9, dtype=np.int64)
    arrays = [np.ones((1, 2), np.int64), np.full((2, 4), 2, np.int64)]
    batch = backend.pack_pad(arrays, pad_value=0, out=out, length=6)
    assert np.shares_memory(batch, out) and batch.shape == (3, 6)
    assert batch.tolist() == [[1, 1, 0, 0, 0, 0], [2, 2, 2, 2, 0, 0], [2, 2, 2, 2, 0, 0]]
    with pytest.raises(ValueError):
        backend.pack_pad(arrays, length=3)
    with pytest.raises(ValueError):
        backend.pack_pad([np.ones(3, np.int64)])


def test_host_transfers_and_alloc(backend: NumpyBackend) -> None:
    array = np.arange(4, dtype=np.float32)
    assert backend.from_host(array) is array
    assert backend.to_host(array) is array
    out = np.zeros(8, np.float32)
    assert np.shares_memory(backend.to_host(array, out=out), out)
    np.testing.assert_array_equal(backend.from_host(array, out=out), array)
    raw = backend.alloc_host(1000)
    assert raw.dtype == np.uint8 and raw.shape == (1000,) and raw.ctypes.data % 64 == 0
    assert backend.empty((2, 3), np.int64).shape == (2, 3)
    backend.synchronize()
    assert backend.memory_statistics() == {}


def test_aligned_host_bytes_zero_and_alignment() -> None:
    assert aligned_host_bytes(0).shape == (0,)
    assert aligned_host_bytes(17, 128).ctypes.data % 128 == 0


def test_row_offsets() -> None:
    assert row_offsets([]).tolist() == [0]
    assert row_offsets([2, 0, 3]).tolist() == [0, 2, 2, 5]


@st.composite
def ragged_requests(draw: st.DrawFn) -> list[np.ndarray]:
    dtype = draw(st.sampled_from([np.float32, np.int64, np.bool_, np.float16, np.int8]))
    trailing = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=4))
    counts = draw(st.lists(st.integers(0, 5), min_size=1, max_size=8))
    elements = hnp.from_dtype(np.dtype(dtype), allow_nan=False)
    return [
        draw(hnp.arrays(dtype, (n, *trailing), elements=elements)) for n in counts
    ]


@settings(max_examples=75, deadline=None)
@given(arrays=ragged_requests(), spare_rows=st.integers(0, 3), copy=st.booleans())
def test_property_pack_scatter_roundtrip(
    arrays: list[np.ndarray], spare_rows: int, copy: bool
) -> None:
    backend = NumpyBackend()
    total = sum(a.shape[0] for a in arrays)
    out = np.empty((total + spare_rows, *arrays[0].shape[1:]), dtype=arrays[0].dtype)
    batch = backend.pack(arrays, out=out)
    assert batch.shape[0] == total
    pieces = backend.scatter(out, [a.shape[0] for a in arrays], copy=copy)
    for piece, original in zip(pieces, arrays, strict=True):
        assert piece.dtype == original.dtype and piece.shape == original.shape
        np.testing.assert_array_equal(piece, original)
