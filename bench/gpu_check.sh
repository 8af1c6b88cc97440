#!/usr/bin/env bash
# The one prepared check for a lent GPU machine (CuPy for CUDA 13, nvidia-ml-py, PyTorch and an
# onnxruntime whose CUDA provider is unverified). Installs nothing. Every step has its own time
# limit (about 5 minutes in all, worst case), a failing step does not stop the others, and a
# summary is printed at the end. Run from anywhere:  bash bench/gpu_check.sh
# If $OUT is set (device runner), each step's output is also saved there.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python3 || command -v python)}
LOG_DIR=${OUT:-}
# The kernels ship as package data (gt_serve.kernels, mapped from kernels/ by setup.py). A repository
# copy that was never installed (the lent machine's) has no such package: link it for this copy only.
if ! "${PY}" -c "import importlib.resources as r; r.files('gt_serve.kernels')" >/dev/null 2>&1; then
    ln -sfn ../kernels gt_serve/kernels && echo "linked gt_serve/kernels -> ../kernels (uninstalled copy)"
fi
SUMMARY=()
FAILED=0

step() {  # step NAME LIMIT_S COMMAND...
    local name=$1 limit_s=$2 started rc
    shift 2
    echo
    echo "=== ${name} (limit ${limit_s}s)"
    started=$(date +%s)
    if [ -n "${LOG_DIR}" ]; then
        timeout --kill-after=5 "${limit_s}" "$@" 2>&1 | tee "${LOG_DIR}/${name}.log"
        rc=${PIPESTATUS[0]}
    else
        timeout --kill-after=5 "${limit_s}" "$@" 2>&1
        rc=$?
    fi
    [ "${rc}" -eq 0 ] || FAILED=$((FAILED + 1))
    SUMMARY+=("$(printf '%-16s rc=%-4s %4ss' "${name}" "${rc}" "$(( $(date +%s) - started ))")")
}

step nvidia-smi 20 nvidia-smi

step ort-providers 40 "${PY}" - <<'PYEOF'
import onnxruntime as ort
print("onnxruntime", ort.__version__, "device", ort.get_device())
print("available providers:", ort.get_available_providers())
try:  # which provider does a real session actually obtain?
    import onnx
    from onnx import TensorProto, helper
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    print("session providers obtained:", session.get_providers())
except Exception as exc:
    print("session probe failed:", type(exc).__name__, exc)
PYEOF

step cupy-info 40 "${PY}" -c "
import cupy
props = cupy.cuda.runtime.getDeviceProperties(0)
print('cupy', cupy.__version__, 'runtime', cupy.cuda.runtime.runtimeGetVersion(),
      'driver', cupy.cuda.runtime.driverGetVersion())
print('device 0:', props['name'], 'cc', props['major'], props['minor'],
      'mem_bytes', props['totalGlobalMem'])
"

step nvcc-compile 90 "${PY}" -m pytest tests/unit/test_kernels_compile.py -q -p no:cacheprovider -rs

step gpu-tests 150 "${PY}" -m pytest -m gpu tests/gpu tests/unit/test_spill.py -q -p no:cacheprovider -rs

step bench-kernels 60 "${PY}" bench/bench_kernels.py --iterations 50

step stream-overlap 40 "${PY}" bench/stream_overlap.py

if [ -f bench/nvml_check.py ]; then
    step nvml-check 40 "${PY}" bench/nvml_check.py
else
    SUMMARY+=("nvml-check       skipped (bench/nvml_check.py absent)")
fi

echo
echo "=== summary (${FAILED} step(s) failed; rc 124/137 = time limit)"
printf '%s\n' "${SUMMARY[@]}"
exit 0
