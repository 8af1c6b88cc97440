"""The documented air-gapped build: deploy/wheelhouse.sh on the connected side, then
`docker build --network none --build-arg WHEELHOUSE=wheelhouse` from a base that already has Python."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.container import images

pytestmark = [pytest.mark.container, pytest.mark.slow]

SOURCES = ("pyproject.toml", "setup.py", "README.md", "Dockerfile", ".dockerignore", "gt_serve", "kernels")


def test_network_none_build_from_a_wheelhouse(docker_available, base_image, tmp_path) -> None:
    context = tmp_path / "context"
    context.mkdir()
    for name in SOURCES:
        source = images.REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, context / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, context / name)
    done = subprocess.run(["bash", str(images.REPO_ROOT / "deploy" / "wheelhouse.sh"), "cluster",
                           str(context / "wheelhouse")], cwd=images.REPO_ROOT, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert any(context.joinpath("wheelhouse").glob("onnxruntime-*.whl"))

    images.build_python_base(images.PYTHON_BASE_IMAGE, base=base_image)  # carried over with docker save/load
    tag = f"{images.GT_IMAGE}-airgapped"
    images.build_image(tag, base=images.PYTHON_BASE_IMAGE, context=context,
                       extra_args=("--network", "none", "--build-arg", "WHEELHOUSE=wheelhouse"))
    try:
        out = docker_available.containers.run(
            tag, ["-c", "import gt_serve.app, onnxruntime, aiomqtt; print(onnxruntime.get_available_providers())"],
            entrypoint="python", remove=True, network_disabled=True)
        assert "CPUExecutionProvider" in out.decode()
    finally:
        docker_available.images.remove(tag, force=True)
