"""Every kernels/*.cu compiles with nvcc (PTX for sm_80) and exports its gt_* entry points.

CuPy compiles the same sources with NVRTC at run time, so they must not rely on nvcc-only
features (host headers, implicit toolkit include paths).
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

KERNELS_DIR = Path(__file__).resolve().parents[2] / "kernels"
SOURCES = sorted(KERNELS_DIR.glob("*.cu"))
COMPILE_TIMEOUT_S = 120


def _nvcc() -> str:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed: CUDA sources were not compile-checked")
    return nvcc


def test_kernel_sources_exist() -> None:
    assert any(p.name == "batching.cu" for p in SOURCES)


@pytest.mark.parametrize("source", SOURCES, ids=[p.name for p in SOURCES])
def test_kernel_compiles_to_ptx(source: Path, tmp_path: Path) -> None:
    nvcc = _nvcc()
    ptx_path = tmp_path / f"{source.stem}.ptx"
    result = subprocess.run(
        [nvcc, "--ptx", "-arch=sm_80", "-std=c++17", "-o", str(ptx_path), str(source)],
        capture_output=True,
        text=True,
        timeout=COMPILE_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    declared = set(re.findall(r'extern\s+"C"\s+__global__\s+void\s+(gt_\w+)', source.read_text()))
    exported = set(re.findall(r"\.entry\s+(gt_\w+)", ptx_path.read_text()))
    assert declared, f"{source.name} declares no extern \"C\" gt_* kernels"
    assert declared == exported


def test_batching_source_uses_no_headers() -> None:
    """NVRTC (used by CuPy) has no host standard library and no toolkit include path unless one
    is passed: the batching kernels need neither."""
    assert "#include" not in (KERNELS_DIR / "batching.cu").read_text()


def test_cupy_backend_loads_every_batching_kernel() -> None:
    from gt_serve.backends.cupy_backend import KERNEL_NAMES, find_kernels_dir, kernel_source

    installed = find_kernels_dir()  # the package gt_serve.kernels: kernels/ as the build ships it
    for source in SOURCES:
        assert (installed / source.name).read_text(encoding="utf-8") == source.read_text(encoding="utf-8")
    text = kernel_source("batching")
    for name in KERNEL_NAMES:
        assert f"void {name}(" in text


def test_an_explicit_kernels_dir_wins(tmp_path: Path) -> None:
    from gt_serve.backends.cupy_backend import find_kernels_dir, kernel_source

    (tmp_path / "batching.cu").write_text('extern "C" __global__ void gt_pack() {}\n', encoding="utf-8")
    assert find_kernels_dir(tmp_path) == tmp_path
    assert kernel_source("batching", tmp_path).startswith('extern "C"')
