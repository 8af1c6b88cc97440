"""CupyBackend's host-side launch code, checked without a GPU.

A stand-in `cupy` module keeps "device" arrays in host memory and runs Python emulations of
the `kernels/batching.cu` entry points, after checking every launch argument against the C
signature parsed from the .cu file (pointer vs. scalar, exact scalar width). That covers the
descriptor arrays, row offsets, byte sizes and grid shapes; the CUDA code itself is compared
with NumpyBackend in tests/gpu.
"""
from __future__ import annotations

import contextlib
import ctypes
import re
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from gt_serve.backends.numpy_backend import NumpyBackend

KERNELS_DIR = Path(__file__).resolve().parents[2] / "kernels"
C_SCALARS = {"int": np.int32, "long long": np.int64, "unsigned long long": np.uint64}


class FakeDeviceArray(np.ndarray):
    """Host memory posing as a cupy.ndarray (`.data.ptr`, `.get`, `.set`)."""

    @property
    def data(self) -> types.SimpleNamespace:  # type: ignore[override]
        ptr = self.ctypes.data

        def copy_from_host_async(src: int, nbytes: int, stream: object = None) -> None:
            assert nbytes <= self.nbytes
            ctypes.memmove(ptr, src, nbytes)

        return types.SimpleNamespace(ptr=ptr, copy_from_host_async=copy_from_host_async)

    def get(self, stream: object = None, out: np.ndarray | None = None) -> np.ndarray:
        if out is None:
            return np.array(self)
        out[...] = self
        return out

    def set(self, array: np.ndarray, stream: object = None) -> None:
        assert self.shape == array.shape
        self[...] = array


def _device(array: np.ndarray) -> FakeDeviceArray:
    return np.array(array).view(FakeDeviceArray)


def _signatures() -> dict[str, list[str]]:
    text = (KERNELS_DIR / "batching.cu").read_text()
    found = {}
    for name, params in re.findall(r'extern "C" __global__ void (gt_\w+)\(([^)]*)\)', text):
        kinds = []
        for param in params.split(","):
            decl = re.sub(r"\b(const|__restrict__)\b", " ", param).strip()
            c_type = " ".join(decl.split()[:-1])
            kinds.append("ptr" if c_type.endswith("*") else c_type)
        found[name] = kinds
    return found


def _read(ptr: int, nbytes: int) -> bytes:
    return ctypes.string_at(ptr, nbytes) if nbytes else b""


def _emulate(name: str) -> Callable[..., None]:
    def pack(ptrs, offsets, n, row_bytes, batch) -> None:  # noqa: ANN001
        for i in range(int(n)):
            nbytes = int(offsets[i + 1] - offsets[i]) * int(row_bytes)
            dst = batch.ctypes.data + int(offsets[i]) * int(row_bytes)
            ctypes.memmove(dst, int(ptrs[i]), nbytes)

    def scatter(ptrs, offsets, n, row_bytes, batch) -> None:  # noqa: ANN001
        for i in range(int(n)):
            nbytes = int(offsets[i + 1] - offsets[i]) * int(row_bytes)
            src = batch.ctypes.data + int(offsets[i]) * int(row_bytes)
            ctypes.memmove(int(ptrs[i]), src, nbytes)

    def pack_pad(ptrs, offsets, lens, n, max_len, inner, elem, pad, batch) -> None:  # noqa: ANN001
        pad_elem = int(pad).to_bytes(8, "little")[: int(elem)]
        dst_row = int(max_len) * int(inner)
        for i in range(int(n)):
            src_row = int(lens[i]) * int(inner)
            for row in range(int(offsets[i + 1] - offsets[i])):
                data = _read(int(ptrs[i]) + row * src_row, src_row)
                data += pad_elem * ((dst_row - src_row) // int(elem))
                dst = batch.ctypes.data + (int(offsets[i]) + row) * dst_row
                ctypes.memmove(dst, data, dst_row)

    return {"gt_pack": pack, "gt_scatter": scatter, "gt_pack_pad": pack_pad}[name]


class FakeKernel:
    def __init__(self, name: str, kinds: list[str], launches: list[tuple]) -> None:
        self._name, self._kinds, self._launches = name, kinds, launches

    def __call__(self, grid: tuple, block: tuple, args: tuple) -> None:
        assert len(args) == len(self._kinds), self._name
        for arg, kind in zip(args, self._kinds, strict=True):
            if kind == "ptr":
                assert isinstance(arg, FakeDeviceArray) and arg.flags.c_contiguous
            else:
                assert type(arg) is C_SCALARS[kind], (self._name, kind, type(arg))
        assert 1 <= grid[0] <= 2**31 - 1 and 1 <= grid[1] <= 65535 and 0 < block[0] <= 1024
        self._launches.append((self._name, grid, block))
        _emulate(self._name)(*args)


def _fake_cupy(launches: list[tuple]) -> types.ModuleType:
    signatures = _signatures()
    cp = types.ModuleType("cupy")
    cuda = types.SimpleNamespace()

    class Context:
        def __init__(self, *args: object, **kwargs: object) -> None:
            self.id = args[0] if args else 0

        def __enter__(self) -> Context:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def synchronize(self) -> None:
            return None

    class MemoryPool:
        def __init__(self) -> None:
            self.limit = 0

        def set_limit(self, size: int) -> None:
            self.limit = size

        def malloc(self, nbytes: int) -> None:
            return None

        def used_bytes(self) -> int:
            return 0

        total_bytes = n_free_blocks = used_bytes

        def get_limit(self) -> int:
            return self.limit

    class RawModule:
        def __init__(self, code: str, options: tuple = ()) -> None:
            self._code = code

        def get_function(self, name: str) -> FakeKernel:
            assert f"void {name}(" in self._code
            return FakeKernel(name, signatures[name], launches)

    @contextlib.contextmanager
    def using_allocator(malloc: object) -> Iterator[None]:
        yield

    class Event:
        def __init__(self, block: bool = False, disable_timing: bool = False) -> None:
            self.recorded = 0

        def record(self, stream: object = None) -> None:
            self.recorded += 1

        def synchronize(self) -> None:
            assert self.recorded, "synchronize on an event never recorded"

    cuda.Device, cuda.Stream, cuda.MemoryPool, cuda.Event = Context, Context, MemoryPool, Event
    cuda.using_allocator = using_allocator
    cuda.alloc_pinned_memory = bytearray
    cp.cuda, cp.RawModule, cp.ndarray, cp.uint64 = cuda, RawModule, FakeDeviceArray, np.uint64
    cp.asarray = lambda a: a if isinstance(a, FakeDeviceArray) else _device(a)
    cp.ascontiguousarray = lambda a: _device(np.ascontiguousarray(a))
    cp.empty = lambda shape, dtype: np.empty(shape, dtype).view(FakeDeviceArray)
    cp.float32 = np.float32
    return cp


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    recorded: list[tuple] = []
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(recorded))
    return recorded


@pytest.fixture
def gpu(launches: list[tuple]):  # noqa: ANN201
    from gt_serve.backends.cupy_backend import CupyBackend

    return CupyBackend(memory_limit_bytes=1 << 20)


def _random(rng: np.random.Generator, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    return (rng.standard_normal(shape) * 100).astype(dtype)


def test_import_does_not_need_cupy() -> None:
    import gt_serve.backends.cupy_backend as module

    assert "cupy" not in vars(module)


def test_kernel_signatures_parsed() -> None:
    assert _signatures()["gt_pack"] == ["ptr", "ptr", "int", "long long", "ptr"]


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.float16])
@pytest.mark.parametrize("counts", [[1, 2], [3, 0, 5], [1] * 9, [0, 0]])
def test_pack_and_scatter_launches(gpu, launches, dtype, counts) -> None:  # noqa: ANN001
    rng = np.random.default_rng(1)
    host = [_random(rng, (n, 3, 2), dtype) for n in counts]
    packed = gpu.pack([_device(a) for a in host])
    expected = NumpyBackend().pack(host)
    np.testing.assert_array_equal(packed.get(), expected)
    pieces = gpu.scatter(packed, counts, copy=True)
    for piece, original in zip(pieces, host, strict=True):
        np.testing.assert_array_equal(piece.get(), original)
        assert not np.shares_memory(piece, packed)
    if sum(counts):
        assert [name for name, *_ in launches] == ["gt_pack", "gt_scatter"]


def test_pack_into_out_host_inputs_and_fallback(gpu, launches) -> None:  # noqa: ANN001
    out = _device(np.full((6, 2), -1, np.int64))
    arrays = [np.ones((2, 2), np.int64), _device(np.zeros((3, 2), np.int64))]
    packed = gpu.pack(arrays, out=out)
    assert np.shares_memory(packed, out) and packed.shape == (5, 2)
    assert out.get().tolist() == [[1, 1], [1, 1], [0, 0], [0, 0], [0, 0], [-1, -1]]
    host_only = gpu.pack([np.ones((4, 2), np.int64)] * 2, out=out)  # too big: new array
    assert host_only.shape == (8, 2) and not np.shares_memory(host_only, out)
    assert [name for name, *_ in launches] == ["gt_pack"]
    with pytest.raises(ValueError):
        gpu.pack(arrays, out=_device(np.zeros((8, 2, 2), np.int64))[:, :, 0])
    assert gpu.pack([], out=out).shape == (0, 2)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.float16, np.int8])
def test_pack_pad_launch(gpu, dtype) -> None:  # noqa: ANN001
    rng = np.random.default_rng(2)
    host = [_random(rng, s, dtype) for s in [(2, 3, 4), (1, 5, 4), (0, 2, 4), (3, 1, 4)]]
    pad = True if dtype == np.bool_ else np.array(-3, dtype=dtype).item()
    for length in (None, 7):
        packed = gpu.pack_pad([_device(a) for a in host], pad_value=pad, length=length)
        expected = NumpyBackend().pack_pad(host, pad_value=pad, length=length)
        np.testing.assert_array_equal(packed.get(), expected)


def test_transfers_and_statistics(gpu) -> None:  # noqa: ANN001
    host = np.arange(8, dtype=np.float32).reshape(4, 2)
    device = gpu.from_host(host, out=gpu.empty((6, 2), np.float32))
    back = np.zeros((6, 2), np.float32)
    assert np.shares_memory(gpu.to_host(device, out=back), back)
    np.testing.assert_array_equal(back[:4], host)
    assert gpu.alloc_host(100).shape == (100,)
    assert gpu.memory_statistics()["device_limit_bytes"] == 1 << 20
    assert gpu.name == "cupy"


def test_descriptor_ring_wraps_and_grows(gpu) -> None:  # noqa: ANN001
    """More launches than ring slots, with descriptors outgrowing a slot: every pack stays right."""
    rng = np.random.default_rng(3)
    ref = NumpyBackend()
    for step in range(20):
        counts = [1 + (i % 3) for i in range(1 + step * 40)]  # up to 761 requests: > one 4 KiB slot
        host = [_random(rng, (n, 2), np.float32) for n in counts]
        packed = gpu.pack([_device(a) for a in host])
        np.testing.assert_array_equal(np.asarray(packed), ref.pack(host))
