"""What the build ships (issue #12, "homes for everything"): kernels/ becomes the package
gt_serve.kernels without a symlink, the tools live in gt_serve.tools and their command lines work.

The build runs setuptools' build_py (what a wheel and the Dockerfile's `pip install /src` hold) on
a copy of the sources, offline: no index, no build isolation, nothing written into the checkout.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

try:
    import tomllib  # Python 3.11+
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    tomllib = None

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 120
CLI_TIMEOUT_S = 60
SOURCES = ("pyproject.toml", "setup.py", "README.md", "gt_serve", "kernels")


@pytest.fixture(scope="module")
def build_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, src / name)
    out = src / "build_lib"
    done = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(out)], cwd=src,
                          capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return out / "gt_serve"


def test_no_symlink_into_the_package() -> None:
    links = [str(p.relative_to(ROOT)) for p in (ROOT / "gt_serve").rglob("*") if p.is_symlink()]
    assert not links, links


def test_the_build_ships_kernels_as_gt_serve_kernels(build_lib: Path) -> None:
    sources = sorted((ROOT / "kernels").glob("*.cu"))
    assert {p.name for p in sources} >= {"batching.cu", "scoring.cu"}
    for source in sources:
        assert (build_lib / "kernels" / source.name).read_bytes() == source.read_bytes(), source.name


def test_the_build_ships_every_module_and_the_tools(build_lib: Path) -> None:
    wanted = {p.relative_to(ROOT / "gt_serve").as_posix() for p in (ROOT / "gt_serve").rglob("*.py")}
    shipped = {p.relative_to(build_lib).as_posix() for p in build_lib.rglob("*.py")}
    assert not wanted - shipped, sorted(wanted - shipped)
    assert (build_lib / "tools" / "sim" / "scenarios" / "hetero.yaml").is_file()
    assert not (build_lib / "sim").exists() and not (build_lib / "shard.py").exists()


def test_console_scripts_name_real_functions() -> None:
    if tomllib is None:
        pytest.skip("reading pyproject.toml needs tomllib (Python 3.11+)")
    import importlib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert {"gt-serve", "gt-serve-sim", "gt-serve-shard"} <= set(scripts)
    for target in scripts.values():
        module, _, function = target.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), target


@pytest.mark.parametrize("tool", ["gt_serve.tools.sim", "gt_serve.tools.shard"])
def test_tool_command_lines(tool: str) -> None:
    done = subprocess.run([sys.executable, "-m", tool, "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"python -m {tool}" in done.stdout
