#
# gt_serve container image: one Dockerfile for CPU hosts, x86_64 NVIDIA GPU hosts and Jetson (arm64).
# Needs BuildKit (default since Docker 23; `DOCKER_BUILDKIT=1` on Docker 20.10). No line needs a
# registry except BASE_IMAGE: no `# syntax=` frontend image is pulled.
#
# Build arguments
#   BASE_IMAGE   image for ALL stages (the virtual environment built in the builder stage is copied
#                into the runtime stage, so the interpreter must be the same). It needs Python >= 3.10;
#                Debian/Ubuntu images without python3 get it from apt automatically.
#                  python:3.11-slim (default)                               CPU, any arch
#                  gt-serve-base:bookworm (deploy/build-base.sh)            CPU, made locally without a registry
#                  nvcr.io/nvidia/cuda:12.6.3-cudnn-runtime-ubuntu22.04     x86_64 + NVIDIA GPU (python3 is apt-installed)
#                  nvcr.io/nvidia/l4t-jetpack:r36.4.0                       Jetson Orin, JetPack 6 (arm64)
#                  dustynv/l4t-ml:r36.2.0                                   Jetson with onnxruntime-gpu/cupy preinstalled
#   GT_EXTRAS    comma-separated pyproject extras: "" (default: CPU onnxruntime), "cluster", "gpu", "gpu,cluster";
#                "s3", "gcs" for model repositories in object storage.
#                "gpu" swaps the CPU onnxruntime for onnxruntime-gpu (both ship the same module).
#   GT_SYSTEM_SITE_PACKAGES   1 = the venv also sees the base image's site-packages (Jetson images that
#                ship onnxruntime-gpu / cupy builds which PyPI does not have for arm64). Default 0.
#   WHEELHOUSE   air-gapped build: a folder in the build context holding gt_serve's wheel and every
#                dependency (deploy/wheelhouse.sh makes it); pip then installs with --no-index from it only.
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL   optional package index / mirror (e.g. the Jetson AI Lab index).
#
# Secrets (optional, never stored in a layer)
#   --secret id=ca,src=FILE   a CA bundle for a TLS-intercepting proxy: apt and pip trust it during the build.
#
# Examples
#   docker build -t gt-serve:cpu .
#   docker build -t gt-serve:cpu --secret id=ca,src=/etc/ssl/certs/ca-certificates.crt .        # behind a proxy
#   docker build -t gt-serve:cpu --network none --build-arg BASE_IMAGE=... --build-arg WHEELHOUSE=wheelhouse .
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

# ---------------------------------------------------------------- python: the interpreter all stages share
FROM ${BASE_IMAGE} AS python

# Bare Debian / CUDA / L4T images have no Python. Package versions are not pinned: the same line must
# work on Debian, Ubuntu 22.04 (CUDA) and L4T, whose archives carry different versions.
# hadolint ignore=DL3008
RUN --mount=type=secret,id=ca \
    if ! python3 -c "import venv, ensurepip" >/dev/null 2>&1; then \
        if [ -s /run/secrets/ca ]; then set -- -o Acquire::https::CAInfo=/run/secrets/ca; else set --; fi; \
        apt-get "$@" update \
        && DEBIAN_FRONTEND=noninteractive apt-get "$@" install -y --no-install-recommends python3 python3-venv \
        && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin; \
    fi

# ---------------------------------------------------------------- builder: wheel + virtual environment
FROM python AS builder

ARG GT_EXTRAS=""
ARG GT_SYSTEM_SITE_PACKAGES=0
ARG WHEELHOUSE=""
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN if [ "${GT_SYSTEM_SITE_PACKAGES}" = "1" ]; then \
        python3 -m venv --system-site-packages /opt/venv; \
    else \
        python3 -m venv /opt/venv; \
    fi

# Dependencies first, in a layer keyed by pyproject.toml (and the wheelhouse) only: a change to the
# sources rebuilds the last layer, not the ~300 MB of dependencies. The stub project has the real
# dependency list and no code; the empty README stands in for the real one (project.readme).
COPY pyproject.toml /deps/pyproject.toml
COPY wheelhouse* /wheelhouse/

# pip installs the dependencies (and the requested extras) into /opt/venv; only /opt/venv reaches the
# runtime. WHEELHOUSE=wheelhouse: from the copied wheelhouse only (--no-index), for --network none.
# onnxruntime and onnxruntime-gpu ship the same "onnxruntime" module: when the gpu extra (or a Jetson
# base image's system site-packages) brings onnxruntime-gpu, the CPU distribution is removed and
# onnxruntime-gpu reinstalled over the files the removal took away.
RUN --mount=type=secret,id=ca \
    set -eu; \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    [ -n "${PIP_INDEX_URL:-}" ] || unset PIP_INDEX_URL; \
    [ -n "${PIP_EXTRA_INDEX_URL:-}" ] || unset PIP_EXTRA_INDEX_URL; \
    case "${WHEELHOUSE}" in \
        "") set -- ;; \
        wheelhouse) set -- --no-index --find-links /wheelhouse ;; \
        *) echo "WHEELHOUSE must be empty or 'wheelhouse' (the folder in the build context)" >&2; exit 2 ;; \
    esac; \
    mkdir -p /deps/gt_serve && touch /deps/README.md; \
    /opt/venv/bin/pip install --no-cache-dir "$@" "/deps${GT_EXTRAS:+[${GT_EXTRAS}]}"; \
    /opt/venv/bin/pip uninstall --yes --quiet gt_serve; \
    where_gpu="$(/opt/venv/bin/python -c "import importlib.metadata as m, sys; \
m.version('onnxruntime'); d = m.distribution('onnxruntime-gpu'); \
print('venv' if str(d.locate_file('')).startswith(sys.prefix) else 'system')" 2>/dev/null || true)"; \
    if [ -n "${where_gpu}" ]; then \
        gpu_version="$(/opt/venv/bin/python -c "import importlib.metadata as m; print(m.version('onnxruntime-gpu'))")"; \
        /opt/venv/bin/pip uninstall --yes onnxruntime; \
        if [ "${where_gpu}" = "venv" ]; then \
            /opt/venv/bin/pip install --no-cache-dir --no-deps --force-reinstall "$@" "onnxruntime-gpu==${gpu_version}"; \
        fi; \
    fi

# The package itself: pip builds its wheel from the sources (PEP 517; setuptools comes from the
# index, or from the wheelhouse offline) and installs it without touching the dependencies.
WORKDIR /src
COPY . /src
RUN --mount=type=secret,id=ca \
    set -eu; \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    [ -n "${PIP_INDEX_URL:-}" ] || unset PIP_INDEX_URL; \
    [ -n "${PIP_EXTRA_INDEX_URL:-}" ] || unset PIP_EXTRA_INDEX_URL; \
    if [ -n "${WHEELHOUSE}" ]; then set -- --no-index --find-links /wheelhouse; else set -- ; fi; \
    /opt/venv/bin/pip install --no-cache-dir --no-deps "$@" /src \
    && /opt/venv/bin/gt-serve --help >/dev/null

# What the server never runs stays out of the image (~60 MB): pip and setuptools (nothing is installed
# at run time), NumPy's test suites and ONNX's backend test data.
RUN /opt/venv/bin/python -m pip uninstall --yes --quiet pip setuptools \
    && find /opt/venv/lib -depth -type d -name tests -path "*/site-packages/numpy/*" -exec rm -rf {} + \
    && rm -rf /opt/venv/lib/python3*/site-packages/onnx/backend/test/data \
    && /opt/venv/bin/gt-serve --help >/dev/null

# ---------------------------------------------------------------- runtime
FROM python AS runtime

LABEL org.opencontainers.image.title="gt-serve" \
      org.opencontainers.image.description="KServe V2 / Triton-protocol inference server (HTTP + gRPC) for ONNX models"

RUN groupadd --system --gid 10001 gtserve \
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
