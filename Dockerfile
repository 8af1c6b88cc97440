# syntax=docker/dockerfile:1
#
# gt_serve container image: one Dockerfile for CPU hosts, x86_64 NVIDIA GPU hosts and Jetson (arm64).
#
# Build arguments
#   BASE_IMAGE   image for BOTH stages (the virtual environment built in the first stage is copied
#                into the second, so the interpreter must be the same). It needs Python >= 3.10;
#                Debian/Ubuntu images without python3 get it from apt automatically.
#                  python:3.11-slim (default)                               CPU, any arch
#                  nvcr.io/nvidia/cuda:12.6.3-cudnn-runtime-ubuntu22.04     x86_64 + NVIDIA GPU (python3 is apt-installed)
#                  nvcr.io/nvidia/l4t-jetpack:r36.4.0                       Jetson Orin, JetPack 6 (arm64)
#                  dustynv/l4t-ml:r36.2.0                                   Jetson with onnxruntime-gpu/cupy preinstalled
#   GT_EXTRAS    comma-separated pyproject extras: "" (default), "gpu", "cluster", "gpu,cluster".
#   GT_SYSTEM_SITE_PACKAGES   1 = the venv also sees the base image's site-packages (Jetson images that
#                ship onnxruntime-gpu / cupy builds which PyPI does not have for arm64). Default 0.
#   PIP_EXTRA_INDEX_URL       optional extra index, e.g. the Jetson AI Lab index for JetPack 6 wheels.
#
# Examples
#   docker build -t gt-serve:cpu .
#   docker build -t gt-serve:gpu --build-arg BASE_IMAGE=nvcr.io/nvidia/cuda:12.6.3-cudnn-runtime-ubuntu22.04 \
#       --build-arg GT_EXTRAS=gpu,cluster .
#   docker build -t gt-serve:jetson --platform linux/arm64 --build-arg BASE_IMAGE=dustynv/l4t-ml:r36.2.0 \
#       --build-arg GT_EXTRAS=gpu,cluster --build-arg GT_SYSTEM_SITE_PACKAGES=1 .
#
# Run
#   docker run --rm --init -p 8000-8002:8000-8002 gt-serve:cpu                  # bundled demo models
#   docker run --rm --init -p 8000-8002:8000-8002 -v "$PWD/models:/models:ro" gt-serve:cpu --model-repository /models
#   docker run --rm --init --gpus all ... gt-serve:gpu --model-repository /models --config /config/gpu-server.yaml

ARG BASE_IMAGE=python:3.11-slim

# ---------------------------------------------------------------- builder: wheel + virtual environment
FROM ${BASE_IMAGE} AS builder

ARG GT_EXTRAS=""
ARG GT_SYSTEM_SITE_PACKAGES=0
ARG PIP_EXTRA_INDEX_URL

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

# Bare CUDA / L4T images have no Python. Package versions are not pinned: the same line must work on
# Debian (python:*-slim), Ubuntu 22.04 (CUDA) and L4T, whose archives carry different versions.
# hadolint ignore=DL3008
RUN if ! python3 -c "import venv, ensurepip" >/dev/null 2>&1; then \
        apt-get update \
        && apt-get install -y --no-install-recommends python3 python3-venv python3-pip \
        && rm -rf /var/lib/apt/lists/*; \
    fi

RUN if [ "${GT_SYSTEM_SITE_PACKAGES}" = "1" ]; then \
        python3 -m venv --system-site-packages /opt/venv; \
    else \
        python3 -m venv /opt/venv; \
    fi

WORKDIR /src
COPY . /src

# pip builds the gt_serve wheel from the source tree (PEP 517) and installs it with its dependencies
# (and the requested extras) into /opt/venv; only /opt/venv reaches the runtime stage.
# On arm64 the package depends on PyPI's CPU-only "onnxruntime"; when a CUDA build ("onnxruntime-gpu",
# e.g. preinstalled in a Jetson base image and seen through GT_SYSTEM_SITE_PACKAGES=1) is visible too,
# the CPU copy would shadow it, so it is removed again.
RUN /opt/venv/bin/pip install --no-cache-dir "/src${GT_EXTRAS:+[${GT_EXTRAS}]}" \
    && if /opt/venv/bin/python -c "import importlib.metadata as m; m.version('onnxruntime-gpu'); m.version('onnxruntime')" \
            >/dev/null 2>&1; then \
           /opt/venv/bin/pip uninstall --yes onnxruntime; \
       fi \
    && /opt/venv/bin/gt-serve --help >/dev/null

# ---------------------------------------------------------------- runtime
FROM ${BASE_IMAGE} AS runtime

LABEL org.opencontainers.image.title="gt-serve" \
      org.opencontainers.image.description="KServe V2 / Triton-protocol inference server (HTTP + gRPC) for ONNX models"

# The interpreter the venv points at (see the builder stage for why versions are not pinned).
# hadolint ignore=DL3008
RUN if ! command -v python3 >/dev/null 2>&1; then \
        apt-get update \
        && apt-get install -y --no-install-recommends python3 \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && groupadd --system --gid 10001 gtserve \
    && useradd --system --no-log-init --uid 10001 --gid 10001 --home-dir /home/gtserve --create-home \
       --shell /usr/sbin/nologin gtserve \
    && mkdir -p /models /config \
    && chown 10001:10001 /models /config

COPY --from=builder /opt/venv /opt/venv

ENV PATH="/opt/venv/bin:${PATH}" \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HEALTHCHECK_URL="http://127.0.0.1:8000/v2/health/ready"

WORKDIR /home/gtserve
USER 10001:10001

# /models: a Triton-style model repository (mount read-only); /config: edge/node YAML files.
VOLUME ["/models", "/config"]

# 8000 HTTP (V2 REST), 8001 gRPC (inference.GRPCInferenceService), 8002 Prometheus metrics.
EXPOSE 8000 8001 8002

# No curl in slim images: the interpreter does the probe. Set HEALTHCHECK_URL when --http-port changes.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.build_opener(u.ProxyHandler({})).open(os.environ.get('HEALTHCHECK_URL', 'http://127.0.0.1:8000/v2/health/ready'), timeout=4)"]

ENTRYPOINT ["gt-serve"]
# Without arguments gt-serve serves its bundled demo repository (models "simple" and a small classifier).
# For your own models: docker run ... -v "$PWD/models:/models:ro" IMAGE --model-repository /models [--config /config/X.yaml]
CMD []
