"""Fixtures of the GPU tests (skipped, with the reason, where CuPy has no device)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def cp():  # noqa: ANN201 - cupy module
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except Exception as exc:  # noqa: BLE001 - any driver error means no usable device
        pytest.skip(f"no CUDA device: {exc}")
    return cupy
