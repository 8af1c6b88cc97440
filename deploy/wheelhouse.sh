#!/usr/bin/env bash
# Air-gapped image builds, step 1, on a machine with package access: every wheel the image installs,
# for the TARGET's platform, into one folder. Step 2, on the air-gapped machine (or anywhere):
#
#   deploy/wheelhouse.sh [EXTRAS] [OUT]          # default EXTRAS "cluster", OUT ./wheelhouse
#   docker build --network none --build-arg WHEELHOUSE=wheelhouse \
#       --build-arg BASE_IMAGE=<a base that already has python3 + venv> -t gt-serve:cpu .
#
# (an OUT other than ./wheelhouse must be copied there: the Dockerfile reads the folder "wheelhouse"
# of the build context). The wheelhouse holds gt_serve's own wheel, its dependencies with EXTRAS, and
# the build backend (setuptools, wheel), so pip needs no index at all inside the build.
#
# Environment
#   TARGET_ARCH      x86_64 or aarch64 (default: this machine's)
#   PYTHON_VERSION   the target interpreter (default 3.11: Debian bookworm, python:3.11-slim)
# pip's own settings (index, mirror, CA bundle: pip.conf / PIP_* variables) apply as usual.
set -euo pipefail
cd "$(dirname "$0")/.."

extras="${1:-cluster}"
out="${2:-wheelhouse}"
python_version="${PYTHON_VERSION:-3.11}"
case "${TARGET_ARCH:-$(uname -m)}" in
    x86_64 | amd64) arch=x86_64 ;;
    aarch64 | arm64) arch=aarch64 ;;
    *) echo "wheelhouse: unsupported TARGET_ARCH ${TARGET_ARCH:-$(uname -m)}" >&2; exit 2 ;;
esac

mkdir -p "$out"
python3 -m pip wheel --quiet --no-deps --wheel-dir "$out" .
wheel="$(ls -t "$out"/gt_serve-*.whl | head -n 1)"

platforms=()
for tag in manylinux_2_36 manylinux_2_34 manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014; do
    platforms+=(--platform "${tag}_${arch}")
done
python3 -m pip download --quiet --dest "$out" --only-binary=:all: --implementation cp \
    --python-version "$python_version" "${platforms[@]}" \
    "${wheel}${extras:+[${extras}]}" "setuptools>=68" wheel
echo "wheelhouse: $(ls "$out" | wc -l) wheels in $out for cp${python_version/./} ${arch}"
