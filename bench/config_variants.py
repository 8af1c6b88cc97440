"""The sweep's `mlp` under the Triton configs users write, as a repository for bench/perf_repo.py (issue #17: "we
will run perf_analyzer ourselves ... with models and configs of our own"). The sweep's own config is `max_batch_size
32` with a 500 us queue delay; these change one thing each (the last, two):

    python bench/config_variants.py DIR
    python bench/perf_repo.py --repository DIR --triton-venv /opt/triton-venv --concurrency 1,16,64

- `mlp_d0`: `dynamic_batching { }`, Triton's most common form: no queue delay, so a batch is whatever waits when
  the lane is free (the delay 0 forbids waiting for the clients just answered: at 16 clients the batches alternate
  in halves).
- `mlp_nodb`: `max_batch_size: 32` without `dynamic_batching`: Triton then runs every request alone, and so does
  gt-serve (each launched into onnxruntime's pool).
- `mlp_pref`: `preferred_batch_size: [ 4, 8 ]` with the 500 us delay.
- `mlp_d10ms`: a 10 ms delay. Triton waits it out at one client; gt-serve's batcher does not wait for requests that
  cannot come (docs/MODEL-CONFIG.md).
- `mlp_b128`: `max_batch_size: 128`.
- `mlp_ig2`: `instance_group [ { count: 2 kind: KIND_CPU } ]` (Triton-py: two backend processes; gt-serve: the
  model on two lanes of the node's CPU lanes).
- `mlp_order`: `preserve_ordering: true` with the 500 us delay: answers in the order their requests were taken.
- `mlp_ig2_order`: two instances and `preserve_ordering: true`, where batches finish out of order (gt-serve needs two
  CPU lanes for that: `lanes: {cpu_lanes: 2}` in the node YAML, perf_sweep's --gt-config; one lane by default on
  two cores).

Each model is a copy of the same ONNX file (~5 MB). docs/PERFORMANCE.md ("Thirty-sixth pass") has a run.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from gt_serve.testing import model_builders as mb  # noqa: E402

from perf_sweep import CONFIG  # noqa: E402  (the sweep's config, which each variant changes in one place)

_DELAY = "dynamic_batching { max_queue_delay_microseconds: 500 }\n"
_ORDERED = "dynamic_batching { max_queue_delay_microseconds: 500 preserve_ordering: true }\n"
_TWO = ("instance_group [ { count: 1 kind: KIND_CPU } ]\n", "instance_group [ { count: 2 kind: KIND_CPU } ]\n")
# each variant: (the line of the sweep's config it replaces, what replaces it), or several such pairs
VARIANTS = {
    "mlp_d0": (_DELAY, "dynamic_batching { }\n"),
    "mlp_nodb": (_DELAY, ""),
    "mlp_pref": (_DELAY, "dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 500 }\n"),
    "mlp_d10ms": (_DELAY, "dynamic_batching { max_queue_delay_microseconds: 10000 }\n"),
    "mlp_b128": ("max_batch_size: 32\n", "max_batch_size: 128\n"),
    "mlp_ig2": _TWO,
    "mlp_order": (_DELAY, _ORDERED),
    "mlp_ig2_order": (_TWO, (_DELAY, _ORDERED)),
}


def config(name: str) -> str:
    """The config.pbtxt of variant `name`: the sweep's mlp config with the variant's change."""
    sweep = CONFIG.format(name=name, platform='platform: "onnxruntime_onnx"\n', dims="256")
    change = VARIANTS[name]
    for line, replacement in (change if isinstance(change[0], tuple) else (change,)):
        if line not in sweep:
            raise ValueError(f"{name}: the sweep's config no longer has {line.strip()!r}")
        sweep = sweep.replace(line, replacement)
    return sweep


def build(root: Path, names: list[str] | None = None) -> Path:
    """The variants (all, or `names`) under `root`, each NAME/config.pbtxt and NAME/1/model.onnx."""
    source = None
    for name in names or list(VARIANTS):
        onnx_path = root / name / "1" / "model.onnx"
        onnx_path.parent.mkdir(parents=True, exist_ok=True)
        if source is None:
            mb.mlp(onnx_path)
            source = onnx_path
        else:
            shutil.copyfile(source, onnx_path)
        (root / name / "config.pbtxt").write_text(config(name))
    return root


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python bench/config_variants.py DIR")
    print(build(Path(sys.argv[1])))
