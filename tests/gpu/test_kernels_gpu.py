"""CupyBackend kernels against their NumpyBackend twins, on random and edge-case inputs."""
from __future__ import annotations

import numpy as np
import pytest

from gt_serve.backends.base import ArrayBackend
from gt_serve.backends.numpy_backend import NumpyBackend

pytestmark = pytest.mark.gpu

DTYPES = [np.float32, np.int64, np.bool_, np.float16, np.uint8, np.float64, np.int8]
COUNTS = [[1], [3, 0, 5], [1] * 33, [0, 0, 2], [257, 1, 64], [0]]
TRAILING = [(), (1,), (3,), (4, 4), (7, 3), (1, 1, 5)]


@pytest.fixture(scope="module")
def gpu(cp):  # noqa: ANN001, ANN201
    from gt_serve.backends.cupy_backend import CupyBackend

    return CupyBackend(memory_limit_bytes=2 << 30)


@pytest.fixture(scope="module")
def ref() -> NumpyBackend:
    return NumpyBackend()


def _random(rng: np.random.Generator, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    return (rng.standard_normal(shape) * 100).astype(dtype)


def test_protocol_and_name(gpu) -> None:  # noqa: ANN001
    assert isinstance(gpu, ArrayBackend) and gpu.name == "cupy"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("counts", COUNTS)
@pytest.mark.parametrize("trailing", TRAILING)
def test_pack_scatter_parity(cp, gpu, ref, dtype, counts, trailing) -> None:  # noqa: ANN001
    rng = np.random.default_rng(len(counts) * 31 + len(trailing))
    host = [_random(rng, (n, *trailing), dtype) for n in counts]
    device = [cp.asarray(a) for a in host]
    expected = ref.pack(host)
    packed = gpu.pack(device)
    gpu.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(packed), expected)
    pieces = gpu.scatter(packed, counts, copy=True)
    gpu.synchronize()
    for piece, original in zip(pieces, host, strict=True):
        assert piece.size == 0 or piece.data.ptr != packed.data.ptr
        np.testing.assert_array_equal(cp.asnumpy(piece), original)


@pytest.mark.parametrize("offset_elems", [0, 1, 3])
def test_pack_unaligned_views(cp, gpu, ref, offset_elems) -> None:  # noqa: ANN001
    """Sources at odd addresses take the narrow-word paths of gt_copy_bytes."""
    rng = np.random.default_rng(5)
    host_base = _random(rng, (40, 5), np.uint8)
    base = cp.asarray(host_base)
    device = [base.ravel()[offset_elems : offset_elems + 15].reshape(3, 5), base[10:17]]
    host = [cp.asnumpy(a) for a in device]
    out = cp.zeros((20, 5), dtype=np.uint8)
    packed = gpu.pack(device, out=out[1:])  # an unaligned destination as well
    np.testing.assert_array_equal(cp.asnumpy(packed), ref.pack(host))


def test_pack_into_out_and_fallback(cp, gpu) -> None:  # noqa: ANN001
    out = cp.full((10, 2), -1, dtype=cp.int64)
    arrays = [cp.ones((2, 2), cp.int64), cp.zeros((3, 2), cp.int64)]
    packed = gpu.pack(arrays, out=out)
    assert packed.data.ptr == out.data.ptr and packed.shape == (5, 2)
    assert int(out[5:].min()) == -1
    bigger = gpu.pack(arrays * 3, out=out)
    assert bigger.shape == (15, 2) and bigger.data.ptr != out.data.ptr
    single = cp.arange(4)
    assert gpu.pack([single]) is single
    with pytest.raises(ValueError):
        gpu.pack(arrays, out=cp.zeros((10, 2), cp.float32))


def test_pack_host_inputs_and_mixed(cp, gpu, ref) -> None:  # noqa: ANN001
    rng = np.random.default_rng(9)
    host = [_random(rng, (n, 3), np.float32) for n in (2, 5, 1)]
    np.testing.assert_array_equal(cp.asnumpy(gpu.pack(host)), ref.pack(host))
    mixed = [host[0], cp.asarray(host[1]), host[2]]
    np.testing.assert_array_equal(cp.asnumpy(gpu.pack(mixed)), ref.pack(host))


def test_scatter_views_and_padding(cp, gpu) -> None:  # noqa: ANN001
    batch = cp.arange(16, dtype=cp.float32).reshape(8, 2)
    views = gpu.scatter(batch, [2, 3])
    assert views[0].data.ptr == batch.data.ptr
    copies = gpu.scatter(batch, [2, 0, 3], copy=True)
    batch[:] = -1
    assert cp.asnumpy(copies[2]).tolist() == [[4, 5], [6, 7], [8, 9]]
    assert copies[1].shape == (0, 2)
    with pytest.raises(ValueError):
        gpu.scatter(batch, [9])


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.float16, np.int8])
@pytest.mark.parametrize("length", [None, 9])
def test_pack_pad_parity(cp, gpu, ref, dtype, length) -> None:  # noqa: ANN001
    rng = np.random.default_rng(11)
    shapes = [(2, 3, 4), (1, 5, 4), (3, 1, 4), (0, 7, 4), (4, 0, 4)]
    host = [_random(rng, s, dtype) for s in shapes]
    pad = np.array(-3, dtype=dtype).item() if dtype != np.bool_ else True
    expected = ref.pack_pad(host, pad_value=pad, length=length)
    packed = gpu.pack_pad([cp.asarray(a) for a in host], pad_value=pad, length=length)
    np.testing.assert_array_equal(cp.asnumpy(packed), expected)


def test_host_device_transfers_and_memory(cp, gpu) -> None:  # noqa: ANN001
    pinned = gpu.alloc_host(4096)
    assert pinned.dtype == np.uint8 and pinned.shape == (4096,)
    host = pinned[:64].view(np.float32).reshape(4, 4)
    host[:] = np.arange(16, dtype=np.float32).reshape(4, 4)
    device = gpu.empty((8, 4), np.float32)
    moved = gpu.from_host(host, out=device)
    back = np.zeros((8, 4), np.float32)
    result = gpu.to_host(moved, out=back)
    assert np.shares_memory(result, back)
    np.testing.assert_array_equal(back[:4], host)
    stats = gpu.memory_statistics()
    assert stats["device_limit_bytes"] == 2 << 30
    assert 0 < stats["device_used_bytes"] <= stats["device_total_bytes"]


def test_host_pool_with_pinned_allocator(cp, gpu) -> None:  # noqa: ANN001
    from gt_serve.execution.memory_pool import HostBufferPool

    pool = HostBufferPool(gpu.alloc_host)
    with pool.acquire(shape=(16, 8), dtype=np.float32) as buffer:
        buffer.array((16, 8), np.float32)[:] = 2.0
        device = gpu.from_host(buffer.array((16, 8), np.float32))
        assert float(device.sum()) == 256.0
    with pool.acquire(512):
        pass
    assert pool.statistics()["allocations"] == 1


def test_memory_limit_is_enforced(cp) -> None:  # noqa: ANN001
    from gt_serve.backends.cupy_backend import CupyBackend

    small = CupyBackend(memory_limit_bytes=1 << 20)
    with pytest.raises(cp.cuda.memory.OutOfMemoryError):
        small.empty((1 << 20,), np.float32)


def test_separate_stream(cp) -> None:  # noqa: ANN001
    from gt_serve.backends.cupy_backend import CupyBackend

    stream = cp.cuda.Stream(non_blocking=True)
    lane = CupyBackend(stream=stream)
    assert lane.stream is stream
    packed = lane.pack([cp.ones((3, 2)), cp.zeros((1, 2))])
    lane.synchronize()
    assert float(packed.sum()) == 6.0
