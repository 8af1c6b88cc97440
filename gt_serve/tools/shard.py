"""Split an ONNX model into pipeline stages at named intermediate tensors.

    python -m gt_serve.tools.shard split MODEL.onnx --at TENSOR[,TENSOR2] --name NAME --out REPO_DIR
    python -m gt_serve.tools.shard tensors MODEL.onnx        # the tensors a model can be cut at

`--at a,b` cuts twice (three stages); `--at a+b` is one cut made of two tensors (a graph with a
branch that crosses the cut). Stage i becomes the repository model NAME_stage{i}: its inputs are
the tensors of the cut before it (stage 0: the graph inputs, plus any graph input a later stage
reads), its outputs the tensors of the cut after it (the last stage: the graph outputs). Each
stage gets a config.pbtxt that keeps the source model's max_batch_size (and the rest of its
config.pbtxt when the model sits in a repository); the YAML to serve the stages as one pipeline
is printed. Stages are written with onnx.utils.extract_model, which checks each one.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence


@dataclass(frozen=True)
class StagePlan:
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


class ShardError(ValueError):
    """The requested cut cannot split this model."""


def parse_cuts(text: str) -> list[tuple[str, ...]]:
    """'a,b+c' -> [('a',), ('b', 'c')]: cuts in graph order, each one or more tensors."""
    cuts = []
    for part in text.split(","):
        names = tuple(n.strip() for n in part.split("+") if n.strip())
        if not names:
            raise ShardError(f"empty cut in --at {text!r}")
        cuts.append(names)
    return cuts


def _graph_io(graph) -> tuple[list[str], list[str], set[str]]:
    initializers = {t.name for t in graph.initializer}
    inputs = [i.name for i in graph.input if i.name not in initializers]
    return inputs, [o.name for o in graph.output], initializers


def plan_stages(model, cuts: Sequence[Sequence[str]], name: str) -> list[StagePlan]:
    """Which tensors flow into and out of each stage; ShardError when a cut does not separate the graph."""
    graph = model.graph
    graph_inputs, graph_outputs, initializers = _graph_io(graph)
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output if out}
    for cut in cuts:
        for tensor in cut:
            if tensor not in producer:
                what = "a graph input" if tensor in graph_inputs else "not a tensor any node produces"
                raise ShardError(f"cannot cut at '{tensor}': it is {what} "
                                 "(see `python -m gt_serve.tools.shard tensors`)")
    boundaries = [tuple(graph_inputs), *(tuple(c) for c in cuts), tuple(graph_outputs)]
    flowing: set[str] = set(graph_inputs)  # tensors the pipeline holds before the stage runs
    earlier: set[int] = set()  # nodes that earlier stages run
    plans = []
    for i in range(len(boundaries) - 1):
        stop = set(boundaries[i]) | flowing | initializers
        nodes, needed = _reach(graph, producer, boundaries[i + 1], stop)
        crossing = [t for n in sorted(nodes - earlier) for t in graph.node[n].input
                    if t and producer.get(t) in earlier and t not in stop]
        if crossing:
            raise ShardError(f"the cut before stage {i} ({'+'.join(boundaries[i])}) does not separate the graph: "
                             f"stage {i} also reads '{crossing[0]}', computed by an earlier stage; add it to "
                             f"that cut (--at ...+{crossing[0]})")
        if not nodes or nodes & earlier:
            raise ShardError(f"stage {i} would be empty: cut '{'+'.join(boundaries[i + 1])}' is computed "
                             "before the cut in front of it (cuts go in graph order)")
        ordered = [*boundaries[i], *(t for b in boundaries[:i] for t in b)]
        inputs = list(dict.fromkeys(t for t in ordered if t in needed))
        plans.append(StagePlan(f"{name}_stage{i}", tuple(inputs), tuple(boundaries[i + 1])))
        earlier |= nodes
        flowing |= set(boundaries[i + 1])
    return plans


def _reach(graph, producer: dict[str, int], outputs: Sequence[str], stop: set[str]) -> tuple[set[int], set[str]]:
    """Nodes needed to compute `outputs` without looking past `stop`, and the `stop` tensors they read."""
    nodes: set[int] = set()
    needed: set[str] = set()
    todo = list(outputs)
    for _ in range(len(graph.node) * 8 + len(todo) + 1):  # each node is expanded once
        if not todo:
            break
        tensor = todo.pop()
        if tensor in stop:
            needed.add(tensor)
            continue
        index = producer.get(tensor)
        if index is None or index in nodes:
            continue
        nodes.add(index)
        todo.extend(t for t in graph.node[index].input if t)
    return nodes, needed


def source_config(model_path: Path):
    """The config.pbtxt of a repository model (MODEL_DIR/VERSION/model.onnx), or None."""
    from gt_serve.core.model_config import parse_pbtxt

    if not model_path.parent.name.isdigit():
        return None
    path = model_path.parent.parent / "config.pbtxt"
    return parse_pbtxt(path.read_text(), str(path)) if path.is_file() else None


def _batches(model) -> bool:
    """True when every graph input has a free leading dimension (a batch the server may merge)."""
    inputs, _, _ = _graph_io(model.graph)
    by_name = {i.name: i for i in model.graph.input}
    for name in inputs:
        dims = by_name[name].type.tensor_type.shape.dim
        if not dims or dims[0].HasField("dim_value"):
            return False
    return True


def stage_config(plan: StagePlan, source, max_batch_size: int):
    """The stage's config: the source's settings, the stage's name, its own inputs and outputs."""
    from tritonclient.grpc import model_config_pb2 as mc

    cfg = mc.ModelConfig()
    if source is not None:
        cfg.CopyFrom(source)
    cfg.name = plan.name
    if not cfg.backend:
        cfg.platform = cfg.platform or "onnxruntime_onnx"
    cfg.max_batch_size = max_batch_size
    keep_in = [t for t in cfg.input if t.name in plan.inputs]
    keep_out = [t for t in cfg.output if t.name in plan.outputs]
    del cfg.input[:]
    del cfg.output[:]
    cfg.input.extend(keep_in)
    cfg.output.extend(keep_out)
    return cfg


def split_model(model_path: Path, cuts: Sequence[Sequence[str]], name: str, out_dir: Path,
                max_batch_size: int | None = None) -> list[StagePlan]:
    """Write NAME_stage{i}/1/model.onnx and NAME_stage{i}/config.pbtxt under `out_dir`."""
    import onnx
    from google.protobuf import text_format

    from gt_serve.core.model_config import DEFAULT_MAX_BATCH_SIZE

    model_path, out_dir = Path(model_path), Path(out_dir)
    model = onnx.load(str(model_path), load_external_data=False)
    plans = plan_stages(model, cuts, name)
    source = source_config(model_path)
    if max_batch_size is None:
        if source is not None:
            max_batch_size = int(source.max_batch_size)
        else:
            max_batch_size = DEFAULT_MAX_BATCH_SIZE if _batches(model) else 0
    for plan in plans:
        stage_dir = out_dir / plan.name
        if stage_dir.exists():
            raise ShardError(f"'{stage_dir}' exists already: remove it or choose another --name")
    for out in source.output if source is not None else ():  # refused before anything is written
        if out.label_filename:
            _confined(model_path.parent.parent, out.label_filename, name)
    for plan in plans:
        stage_dir = out_dir / plan.name
        (stage_dir / "1").mkdir(parents=True)
        onnx.utils.extract_model(str(model_path), str(stage_dir / "1" / "model.onnx"), list(plan.inputs),
                                 list(plan.outputs), check_model=True)
        cfg = stage_config(plan, source, max_batch_size)
        (stage_dir / "config.pbtxt").write_text(text_format.MessageToString(cfg))
        for out in cfg.output:  # labels of a kept output travel with it
            if out.label_filename and source is not None:
                _copy_labels(model_path.parent.parent, stage_dir, out.label_filename, plan.name)
    return plans


def _copy_labels(source_dir: Path, stage_dir: Path, label_filename: str, stage: str) -> None:
    """Copy a label file that lies inside the source model's directory to the same place in the stage's."""
    src = _confined(source_dir, label_filename, stage)
    dst = _confined(stage_dir, label_filename, stage)
    if src.is_file():
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)


def _confined(directory: Path, label_filename: str, model: str) -> Path:
    from gt_serve.core.repository_paths import confine
    from gt_serve.errors import PathNotAllowed

    try:
        return confine(directory, label_filename, model=model, what="label_filename")
    except PathNotAllowed as exc:
        raise ShardError(str(exc)) from None


def pipeline_yaml(name: str, plans: Sequence[StagePlan]) -> str:
    stages = ", ".join(p.name for p in plans)
    return f"pipelines:\n  {name}:\n    stages: [{stages}]\n"


def cut_candidates(model) -> list[str]:
    """Intermediate tensors in graph order: the names `--at` takes."""
    _, outputs, _ = _graph_io(model.graph)
    return [t for node in model.graph.node for t in node.output if t and t not in outputs]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gt_serve.tools.shard", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    split = sub.add_parser("split", help="split MODEL into pipeline stages")
    split.add_argument("model", type=Path)
    split.add_argument("--at", required=True, help="cut tensors: 'a,b' cuts twice; 'a+b' is one cut of two tensors")
    split.add_argument("--name", required=True, help="pipeline name; stages are NAME_stage0, NAME_stage1, ...")
    split.add_argument("--out", required=True, type=Path, help="model repository to write the stages into")
    split.add_argument("--max-batch-size", type=int, default=None,
                       help="default: the source config.pbtxt's, else %(prog)s picks as the server would")
    tensors = sub.add_parser("tensors", help="list the tensors MODEL can be cut at")
    tensors.add_argument("model", type=Path)
    args = parser.parse_args(argv)
    import onnx

    try:
        if args.command == "tensors":
            for name in cut_candidates(onnx.load(str(args.model), load_external_data=False)):
                print(name)
            return 0
        plans = split_model(args.model, parse_cuts(args.at), args.name, args.out, args.max_batch_size)
    except (ShardError, OSError, onnx.checker.ValidationError) as exc:
        print(f"gt_serve.tools.shard: {exc}", file=sys.stderr)
        return 2
    for plan in plans:
        print(f"# {plan.name}: {', '.join(plan.inputs)} -> {', '.join(plan.outputs)}", file=sys.stderr)
    print(pipeline_yaml(args.name, plans), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
