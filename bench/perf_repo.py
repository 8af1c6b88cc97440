"""bench/perf_sweep.py over a model repository of your own: every ONNX model in it (or --models), served by gt-serve
and, with --triton-venv, by Triton 2.51 running the same ONNX file in its Python backend, against raw onnxruntime,
in one run (issue #17: "we will run perf_analyzer ourselves ... with models and configs of our own").

    python bench/perf_repo.py --repository DIR [--models a,b] [--pa-args "--input-data zero"]
                              [--model-pa-args 'encoder=--shape input_ids:128 --shape attention_mask:128']
                              [--protocols http,grpc] [--concurrency 1,16,64] [--triton-venv /opt/triton-venv]
                              [--runs 3]

The repository is Triton's layout (NAME/VERSION/model.onnx, config.pbtxt or none). Each model's config is the one
gt-serve completes from the file and the ONNX graph (GET /v2/models/NAME/config, from a first short start); Triton
gets that config with `backend: "python"` and bench/triton_onnx_model.py beside the same ONNX file (any inputs and
outputs, batched as gt-serve batches), so both servers batch the same way. An ensemble (a config.pbtxt of `platform:
"ensemble"`) is measured as one model, without a raw baseline; Triton runs it in its own ensemble scheduler, over its
step models in the Python backend. Raw onnxruntime runs the highest version's
file with zeros for integer and boolean inputs (an index of 0 is in range for any Gather) and normal noise for
floating-point ones, at batch 1 and at batch 8 and max_batch_size (none for a model that does not batch); a
variable dimension takes its size from a `--shape NAME:DIMS` in its perf_analyzer arguments, else 1. --pa-args go
to every perf_analyzer call; `--model-pa-args MODEL=ARGS` (repeatable) go after them to that model's calls only.
perf_analyzer sends random data unless told otherwise: an integer input used as an index wants `--input-data zero`.
BYTES inputs: no raw baseline, and no Triton side: the Python backend stub of the nvidia-pytriton 0.7.0 wheel dies
decoding a BYTES input ("unpack_from requires a buffer of at least ... bytes" in deserialize_bytes_tensor;
perf_analyzer then reads "Stub process is not healthy"), whatever model.py does with it.

Prints what perf_sweep prints: JSON lines per point (also appended to --jsonl), a table per run and, with --runs,
the medians of the same-run ratios.
"""
from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import perf_sweep  # noqa: E402
import sweep_servers  # noqa: E402

from gt_serve.core.ensemble import is_ensemble  # noqa: E402
from gt_serve.core.model_config import parse_pbtxt  # noqa: E402
from gt_serve.core.model_dir import version_model_files  # noqa: E402
from gt_serve.testing.launcher import launch  # noqa: E402


def repository_models(repo: Path) -> list[str]:
    """The models of a Triton-style repository that have an ONNX file in a numbered version folder, and its
    ensembles (a config.pbtxt of `platform: "ensemble"`)."""
    return sorted(d.name for d in repo.iterdir()
                  if d.is_dir() and (version_model_files(d, "model.onnx") or ensemble_config(d) is not None))


def ensemble_config(model_dir: Path):
    """The model's config.pbtxt (a ModelConfig) if it declares an ensemble, else None."""
    path = model_dir / "config.pbtxt"
    if not path.is_file():
        return None
    cfg = parse_pbtxt(path.read_text(), str(path))
    return cfg if is_ensemble(cfg) else None


def with_steps(repo: Path, models: list[str]) -> list[str]:
    """`models` and, for each ensemble among them, its step models (nested ensembles too), in first-seen order."""
    out: list[str] = []
    todo = list(models)
    while todo:
        name = todo.pop(0)
        if name in out:
            continue
        out.append(name)
        cfg = ensemble_config(repo / name)
        if cfg is not None:
            todo += [step.model_name for step in cfg.ensemble_scheduling.step]
    return out


def explicit_loads(models: list[str]) -> list[str]:
    """gt-serve's arguments that load just `models` of the repository (Triton gets a mirror of those alone)."""
    return ["--model-control-mode", "explicit", *[arg for m in models for arg in ("--load-model", m)]]


def completed_configs(repo: Path, models: list[str], workdir: Path, gt_config: str | None) -> dict[str, dict]:
    """Each model's config as gt-serve completes it (its /v2/models/NAME/config), from one short start; an
    ensemble's step models' too (gt-serve loads them with it, as Triton does)."""
    args = ["--model-repository", str(repo), *explicit_loads(models)] + (["--config", gt_config] if gt_config else [])
    server = launch(args, workdir=workdir)
    try:
        configs = {}
        for name in with_steps(repo, models):
            with sweep_servers.LOOPBACK.open(f"http://127.0.0.1:{server.ports['http']}/v2/models/{name}/config",
                                             timeout=30) as r:
                configs[name] = json.load(r)
        return configs
    finally:
        server.stop()


def model_config(config: dict):
    """`config` (a model config as JSON, gt-serve's /v2/models/NAME/config) as a ModelConfig."""
    from google.protobuf import json_format
    from tritonclient.grpc import model_config_pb2 as mc

    return json_format.ParseDict(config, mc.ModelConfig(), ignore_unknown_fields=True)


def triton_pbtxt(config: dict) -> str:
    """`config` (a model config as JSON) as config.pbtxt for Triton's Python backend: the same inputs, outputs and
    batching, `backend: "python"`, CPU instances (a count of 0, gt-serve's "fill in", becomes 1), no warm-up. An
    ensemble stays as it is (Triton's own ensemble scheduler runs it)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    cfg = model_config(config)
    if is_ensemble(cfg):
        return text_format.MessageToString(cfg)
    cfg.platform = ""
    cfg.backend = "python"
    cfg.default_model_filename = ""
    cfg.ClearField("model_warmup")
    for group in cfg.instance_group:
        group.kind = mc.ModelInstanceGroup.KIND_CPU
        group.count = group.count or 1
        del group.gpus[:]
    return text_format.MessageToString(cfg)


def triton_mirror(repo: Path, out: Path, configs: dict[str, dict]) -> Path:
    """`out`: each model's config for the Python backend, and its versions' ONNX files with triton_onnx_model.py;
    an ensemble's config and an empty version folder (Triton wants one)."""
    for name, config in configs.items():
        (out / name).mkdir(parents=True)
        (out / name / "config.pbtxt").write_text(triton_pbtxt(config))
        if is_ensemble(model_config(config)):
            (out / name / "1").mkdir()
            continue
        for version in version_model_files(repo / name, "model.onnx"):
            (out / name / str(version)).mkdir()
            for entry in (repo / name / str(version)).iterdir():  # model.onnx (a file or a directory), its data
                (out / name / str(version) / entry.name).symlink_to(entry.resolve())
            shutil.copy(HERE / "triton_onnx_model.py", out / name / str(version) / "model.py")
    return out


def shapes_given(pa_args: list[str]) -> dict[str, list[int]]:
    """perf_analyzer's `--shape NAME:D1,D2` arguments, by input name."""
    shapes = {}
    for i, arg in enumerate(pa_args):
        value = pa_args[i + 1] if arg == "--shape" and i + 1 < len(pa_args) else (
            arg.split("=", 1)[1] if arg.startswith("--shape=") else None)
        if value and ":" in value:
            name, _, dims = value.rpartition(":")
            shapes[name] = [int(d) for d in dims.split(",") if d]
    return shapes


def raw_inputs(config: dict, shapes: dict[str, list[int]]) -> tuple[Callable[[int], dict], tuple[int, ...]] | None:
    """(a feed for a batch size, the batch sizes of the best batched point) for raw onnxruntime, or None for a model
    with a BYTES input and for an ensemble (no one ONNX file to run)."""
    from gt_serve.datatypes import numpy_dtype

    if is_ensemble(model_config(config)):
        return None
    max_batch = int(config.get("max_batch_size", 0))
    specs = []
    for t in config["input"]:
        datatype = t["data_type"].removeprefix("TYPE_")
        if datatype == "STRING":
            return None
        dims = [int(d) for d in t.get("dims", [])]
        given = shapes.get(t["name"])
        if given is not None and len(given) == len(dims):
            dims = [g if d < 0 else d for d, g in zip(dims, given)]
        specs.append((t["name"], numpy_dtype(datatype), [1 if d < 0 else d for d in dims]))

    def feed(batch: int) -> dict:
        rng = np.random.default_rng(0)
        out = {}
        for name, dtype, dims in specs:
            shape = [batch, *dims] if max_batch > 0 else dims
            out[name] = (rng.standard_normal(shape).astype(dtype) if dtype.kind in "fV"  # V: BF16
                         else np.zeros(shape, dtype))
        return out

    batches = tuple(sorted({min(8, max_batch), max_batch})) if max_batch > 0 else (1,)
    return feed, batches


def model_pa_args(given: list[str], models: list[str], error: Callable[[str], None]) -> dict[str, list[str]]:
    """`--model-pa-args MODEL=ARGS` values as {model: [args]}; a model not measured is an error."""
    out: dict[str, list[str]] = {}
    for item in given:
        model, sep, args = item.partition("=")
        if not sep or model not in models:
            error(f"--model-pa-args {item!r}: expected MODEL=ARGS with MODEL one of {models}")
        out.setdefault(model, []).extend(shlex.split(args))
    return out


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repository", required=True, type=Path, help="a Triton-style repository of ONNX models")
    p.add_argument("--models", default="", help="default: every model of the repository with an ONNX file")
    p.add_argument("--pa-args", default="", help="more perf_analyzer arguments, one string (shell quoting)")
    p.add_argument("--model-pa-args", action="append", default=[], metavar="MODEL=ARGS",
                   help="more perf_analyzer arguments for one model, after --pa-args (repeatable)")
    perf_sweep.sweep_arguments(p)
    a = p.parse_args()
    a.repository = a.repository.resolve()
    known = repository_models(a.repository)
    a.models = [m for m in a.models.split(",") if m] or known
    unknown = set(a.models) - set(known)
    if unknown or not a.models:
        p.error(f"no ONNX model {sorted(unknown)} in {a.repository}; it has {known}")
    a.pa_args = shlex.split(a.pa_args)
    a.model_pa_args = model_pa_args(a.model_pa_args, a.models, p.error)
    a.gt_args = explicit_loads(a.models)
    return perf_sweep.sweep_settings(a)


def main() -> None:
    a = parse_args()
    pa = perf_sweep.perf_analyzer_path(a.perf_analyzer)
    tmp = Path(tempfile.mkdtemp(prefix="gt_perf_repo_"))
    configs = completed_configs(a.repository, a.models, tmp, a.gt_config)
    triton_repo = triton_mirror(a.repository, tmp / "triton_repo", configs) if a.triton_venv else None
    inputs = {m: raw_inputs(configs[m], shapes_given([*a.pa_args, *a.model_pa_args.get(m, ())])) for m in a.models}
    perf_sweep.run_sweeps(a, pa, a.repository, triton_repo, tmp,
                          {"sweep": "perf_repo", "repository": str(a.repository), "pa_args": a.pa_args,
                           "model_pa_args": a.model_pa_args}, inputs)


if __name__ == "__main__":
    main()
