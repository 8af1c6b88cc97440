"""Builds the images the container tests run, with the Docker CLI (BuildKit) and no registry.

    python3 -m tests.container.images        # what .ci/run does before the tests; prints the seconds each took

1. the Debian base (deploy/build-base.sh: debootstrap + docker import), kept once made;
2. the CPU image from the Dockerfile on that base (GT_EXTRAS=cluster, so the compose cluster runs it too),
   the broker image from deploy/mosquitto/Dockerfile; the engine's layer cache makes rebuilds cheap.

This host's package settings are handed to the build, never written into a committed file: the CA
bundle pip trusts (a TLS-intercepting proxy re-signs HTTPS) as the BuildKit secret "ca", and pip's
index / extra index when they are http(s) URLs (file:// indexes do not exist inside the build).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BASE_IMAGE = os.environ.get("GT_TEST_BASE_IMAGE", "gt-serve-base:bookworm")
PYTHON_BASE_IMAGE = f"{BASE_IMAGE}-python"  # the Dockerfile's "python" stage: base for air-gapped builds
GT_IMAGE = os.environ.get("GT_TEST_IMAGE", "gt-serve:cpu-test")
BROKER_IMAGE = os.environ.get("GT_TEST_BROKER_IMAGE", "gt-serve-mosquitto:bookworm")
BUILD_TIMEOUT_S = 900.0
# the source tree the image is built from (another checkout, e.g. to bisect an image regression)
BUILD_CONTEXT = Path(os.environ.get("GT_TEST_BUILD_CONTEXT", str(REPO_ROOT)))


class ImageBuildError(RuntimeError):
    """A build step failed; the message carries the tail of its output."""


def docker_cli() -> str | None:
    """A Docker client that builds with BuildKit: one with the buildx plugin, or a pre-23 client
    (built-in BuildKit with DOCKER_BUILDKIT=1). None when there is no such client."""
    candidates = [shutil.which("docker"), "/usr/bin/docker", "/usr/local/bin/docker"]
    for candidate in dict.fromkeys(c for c in candidates if c and Path(c).is_file()):
        if _ok([candidate, "buildx", "version"]):
            return candidate
        version = _output([candidate, "version", "--format", "{{.Client.Version}}"])
        major = version.split(".", 1)[0] if version else ""
        if major.isdigit() and int(major) < 23:
            return candidate
    return None


def host_ca_bundle() -> str | None:
    """The CA bundle this host's pip trusts (PIP_CERT, pip config, SSL_CERT_FILE, the system bundle)."""
    candidates = [os.environ.get("PIP_CERT"), _pip_config("global.cert"), os.environ.get("SSL_CERT_FILE"),
                  os.environ.get("REQUESTS_CA_BUNDLE"), "/etc/ssl/certs/ca-certificates.crt"]
    return next((c for c in candidates if c and Path(c).is_file()), None)


def host_index_args() -> list[str]:
    """--build-arg PIP_INDEX_URL / PIP_EXTRA_INDEX_URL from this host's pip settings (http(s) only)."""
    args: list[str] = []
    for env_name, key in (("PIP_INDEX_URL", "global.index-url"), ("PIP_EXTRA_INDEX_URL", "global.extra-index-url")):
        raw = os.environ.get(env_name) or _pip_config(key) or ""
        urls = [url for url in raw.split() if url.startswith(("http://", "https://"))]
        if urls:
            args += ["--build-arg", f"{env_name}={' '.join(urls)}"]
    return args


def image_exists(tag: str) -> bool:
    cli = docker_cli() or "docker"
    return _ok([cli, "image", "inspect", tag])


def build_base(tag: str = BASE_IMAGE) -> None:
    """The Debian base, made once (deploy/build-base.sh returns at once when `tag` exists)."""
    _run(["bash", str(REPO_ROOT / "deploy" / "build-base.sh"), tag], "Debian base")


def build_image(tag: str = GT_IMAGE, *, base: str = BASE_IMAGE, extras: str = "cluster",
                context: Path = BUILD_CONTEXT, extra_args: tuple[str, ...] = ()) -> None:
    """The gt_serve image from the Dockerfile (cached layers are reused)."""
    _run(_build_cmd(tag, context, ["--build-arg", f"BASE_IMAGE={base}", "--build-arg", f"GT_EXTRAS={extras}",
                                   *host_index_args(), *extra_args]), f"image {tag}")


def build_python_base(tag: str = PYTHON_BASE_IMAGE, *, base: str = BASE_IMAGE) -> None:
    """The Dockerfile's "python" stage alone: the base an air-gapped build starts from."""
    _run(_build_cmd(tag, REPO_ROOT, ["--target", "python", "--build-arg", f"BASE_IMAGE={base}"]), f"image {tag}")


def build_broker(tag: str = BROKER_IMAGE, *, base: str = BASE_IMAGE) -> None:
    _run(_build_cmd(tag, REPO_ROOT / "deploy", ["--build-arg", f"BASE_IMAGE={base}", "-f",
                                                 str(REPO_ROOT / "deploy" / "mosquitto" / "Dockerfile")]),
         f"image {tag}")


def ensure_all() -> dict[str, float]:
    """Base, gt_serve image, python base and broker; returns the seconds each step took."""
    timings: dict[str, float] = {}
    for name, step in (("base", build_base), ("image", build_image), ("python-base", build_python_base),
                       ("broker", build_broker)):
        start_s = time.monotonic()
        step()
        timings[name] = round(time.monotonic() - start_s, 1)
    return timings


# ---------------------------------------------------------------- subprocess plumbing


def _build_cmd(tag: str, context: Path, args: list[str]) -> list[str]:
    cli = docker_cli()
    if cli is None:
        raise ImageBuildError("no BuildKit-capable docker client (install the buildx plugin, or docker.io)")
    cmd = [cli, "build", "--progress=plain", "-t", tag, *args]
    ca = host_ca_bundle()
    if ca:
        cmd += ["--secret", f"id=ca,src={ca}"]
    return [*cmd, str(context)]


def _run(cmd: list[str], what: str, timeout_s: float = BUILD_TIMEOUT_S) -> None:
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    try:
        done = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except subprocess.TimeoutExpired as exc:
        raise ImageBuildError(f"{what}: no result within {timeout_s:.0f} s") from exc
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
        raise ImageBuildError(f"{what} failed (exit {done.returncode}):\n{tail}")


def _ok(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=60, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _output(cmd: list[str]) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _pip_config(key: str) -> str | None:
    value = _output([sys.executable, "-m", "pip", "config", "get", key])
    return value.strip("'\"") or None


if __name__ == "__main__":
    try:
        print("container images built in", ensure_all(), "seconds")
    except ImageBuildError as error:
        print(error, file=sys.stderr)
        sys.exit(1)
