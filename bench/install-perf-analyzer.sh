#!/usr/bin/env bash
# Installs NVIDIA's perf_analyzer (the binary the tritonclient 2.34.0 manylinux wheel carries; later wheels
# no longer do) into a cache dir, without touching the project environment (its tritonclient stays as is).
# Idempotent: a second run only prints the path. Prints the path of a wrapper that sets LD_LIBRARY_PATH
# (libcudart.so.12 from nvidia-cuda-runtime-cu12, installed with pip --target) and execs the binary.
# Needs libb64-0d from apt (installed when missing). Used by .ci/run, tests/tools/ and bench/.
set -euo pipefail

TRITONCLIENT_VERSION="2.34.0"
CUDART_SPEC="nvidia-cuda-runtime-cu12"
dest="${XDG_CACHE_HOME:-$HOME/.cache}/gt_serve/perf_analyzer"
wrapper="$dest/perf_analyzer"
binary="$dest/bin/perf_analyzer"
cudart_dir="$dest/cudart"

log() { echo "install-perf-analyzer: $*" >&2; }

need_libb64() { ! ldconfig -p 2>/dev/null | grep -q 'libb64\.so\.0d'; }

if need_libb64; then
    SUDO=""
    if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
    log "installing libb64-0d (apt)"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends libb64-0d >/dev/null \
        || { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
             $SUDO apt-get install -y -qq --no-install-recommends libb64-0d >/dev/null; }
fi

mkdir -p "$dest"
if [ ! -x "$binary" ]; then
    work="$(mktemp -d "$dest/.download.XXXXXX")"
    trap 'rm -rf "$work"' EXIT
    log "downloading tritonclient==$TRITONCLIENT_VERSION (for its perf_analyzer binary)"
    python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
        --platform manylinux1_x86_64 --python-version 3 -d "$work" "tritonclient==$TRITONCLIENT_VERSION"
    wheel="$(ls "$work"/tritonclient-*.whl)"
    python3 - "$wheel" "$work/perf_analyzer" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as zf:
    names = [n for n in zf.namelist() if n.endswith("/data/bin/perf_analyzer")]
    if not names:
        sys.exit(f"no perf_analyzer binary in {wheel}")
    with zf.open(names[0]) as src, open(out, "wb") as dst:
        dst.write(src.read())
PY
    mkdir -p "$dest/bin"
    chmod 0755 "$work/perf_analyzer"
    mv "$work/perf_analyzer" "$binary"
fi

if ! ls "$cudart_dir"/nvidia/cuda_runtime/lib/libcudart.so.12 >/dev/null 2>&1; then
    log "installing $CUDART_SPEC into $cudart_dir"
    python3 -m pip install -q --disable-pip-version-check --no-deps --target "$cudart_dir" "$CUDART_SPEC"
fi

cat >"$wrapper.tmp" <<WRAP
#!/usr/bin/env bash
# perf_analyzer from tritonclient $TRITONCLIENT_VERSION with its CUDA runtime (written by bench/install-perf-analyzer.sh)
export LD_LIBRARY_PATH="$cudart_dir/nvidia/cuda_runtime/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "$binary" "\$@"
WRAP
chmod 0755 "$wrapper.tmp"
mv "$wrapper.tmp" "$wrapper"
# it has no --help/--version that exits 0: it runs when it prints its usage (not a loader error)
usage="$("$wrapper" --help 2>&1 || true)"
if [[ "$usage" != *--service-kind* ]]; then
    printf '%s\n' "${usage:0:500}" >&2
    log "the installed binary does not run"
    exit 1
fi
echo "$wrapper"
