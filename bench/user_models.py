"""Models of the kinds users serve, beyond the sweep's mlp and convnet, as a Triton-style repository for
bench/perf_repo.py (issue #17: "we will run perf_analyzer ourselves ... with models and configs of our own").

    python bench/user_models.py DIR
    python bench/perf_repo.py --repository DIR --triton-venv /opt/triton-venv \\
        --model-pa-args "encoder_nocfg=--input-data zero --shape input_ids:128 --shape attention_mask:128" \\
        --model-pa-args "encoder_db=--input-data zero --shape input_ids:128 --shape attention_mask:128"

- `encoder_nocfg`, `encoder_db`: a BERT-sized text encoder (INT64 `input_ids`, `attention_mask` [B, S]; 2 layers,
  hidden 128, 4 heads, FFN 512; `logits` [B, 2] and `pooled` [B, 128]; ~60 operators). The first has no
  config.pbtxt (gt-serve completes it as Triton does: max_batch_size 4, no queue delay); the second has
  max_batch_size 16, dims [-1] and a 2 ms queue delay.
- `mobilenet`: a MobileNetV1-like classifier at width 0.5 (depthwise + pointwise convolutions), FP32 [B, 3, 224,
  224] -> `logits` [B, 1000], max_batch_size 8, `dynamic_batching { }`.
- `forest`: a random-forest classifier of tabular data as skl2onnx writes one with `zipmap` off (one ai.onnx.ml
  TreeEnsembleClassifier: 100 trees of depth 8), FP32 `X` [B, 20] -> INT64 `label` [B] and FP32 `probabilities`
  [B, 3]; no config.pbtxt (Triton completes `label` as dims [1] with an empty reshape). 6-16 us a batch-1 run: the
  server's own cost per request is nearly all of it.
- `pipeline`: an ensemble as Triton users build them, pre- and post-processing around a model: `normalise` ((X -
  mean) / std, FP32 [B, 256]) -> `classifier` (the sweep's mlp, 500 us queue delay) -> `softmax`, each step with
  max_batch_size 32 and dynamic batching; the ensemble's max_batch_size 32. Measure it alone
  (`--models pipeline`): its steps are models of the repository too.

- `mlp_bf16`: `classifier` (the sweep's mlp) with BF16 `INPUT` and `OUTPUT` (a Cast to FP32 first, one back to
  BF16 last), as models exported for bfloat16 clients are: onnxruntime's Python API takes and gives bfloat16 only
  as OrtValues (gt_serve/backends/ort_tensors.py). Triton's Python backend gets no BF16 model (its numpy tensors
  have no bfloat16): measure it with `--models mlp_bf16,classifier` and without --triton-venv.
- `mlp_packed`: `classifier` kept as Triton's onnxruntime backend takes a model with external data: a directory
  `1/model.onnx/` holding `model.onnx` and `weights.bin` (every initializer).
Both have classifier's config; classifier is their twin in the same run.

The encoder and the MobileNet are models of many small operators: the twenty-seventh pass found them slow while
onnxruntime's intra-op threads never spun. The forest's batches, all launched into onnxruntime's pool, waited longer
than they computed: the twenty-eighth pass lets them run on the loop (docs/DESIGN-NOTES.md). Weights and splits are
random (seeded); the numbers mean nothing.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HIDDEN, HEADS, FFN, LAYERS, VOCAB, MAX_SEQ = 128, 4, 512, 2, 8000, 512
FOREST_TREES, FOREST_DEPTH, FOREST_FEATURES, FOREST_CLASSES = 100, 8, 20, 3

ENCODER_DB_CONFIG = """name: "encoder_db"
platform: "onnxruntime_onnx"
max_batch_size: 16
input [
  { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] },
  { name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] }
]
output [
  { name: "logits" data_type: TYPE_FP32 dims: [ 2 ] },
  { name: "pooled" data_type: TYPE_FP32 dims: [ 128 ] }
]
dynamic_batching { max_queue_delay_microseconds: 2000 }
"""

MOBILENET_CONFIG = """name: "mobilenet"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "input" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
output [ { name: "logits" data_type: TYPE_FP32 dims: [ 1000 ] } ]
dynamic_batching { }
"""

PIPELINE_STEP_CONFIG = """name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 32
input [ {{ name: "{i}" data_type: TYPE_FP32 dims: [ {w_in} ] }} ]
output [ {{ name: "{o}" data_type: TYPE_FP32 dims: [ {w_out} ] }} ]
dynamic_batching {{ {delay} }}
"""

PIPELINE_CONFIG = """name: "pipeline"
platform: "ensemble"
max_batch_size: 32
input [ { name: "features" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "probabilities" data_type: TYPE_FP32 dims: [ 10 ] } ]
ensemble_scheduling { step [
  { model_name: "normalise" model_version: -1
    input_map { key: "X" value: "features" } output_map { key: "Y" value: "scaled" } },
  { model_name: "classifier" model_version: -1
    input_map { key: "INPUT" value: "scaled" } output_map { key: "OUTPUT" value: "logits" } },
  { model_name: "softmax" model_version: -1
    input_map { key: "L" value: "logits" } output_map { key: "P" value: "probabilities" } }
] }
"""


class Graph:
    """Nodes and initializers of one graph, with seeded random weights."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []

    def init(self, name: str, array) -> str:
        from onnx import numpy_helper

        array = np.asarray(array)
        self.inits.append(numpy_helper.from_array(array.astype(np.float32) if array.dtype == np.float64 else array,
                                                  name))
        return name

    def weight(self, name: str, shape, scale: float = 0.05) -> str:
        return self.init(name, self.rng.standard_normal(shape) * scale)

    def node(self, op: str, inputs: list[str], output: str, **attrs) -> str:
        from onnx import helper

        self.nodes.append(helper.make_node(op, inputs, [output], **attrs))
        return output

    def save(self, name: str, inputs: list, outputs: list, path: Path) -> None:
        import onnx
        from onnx import helper

        model = helper.make_model(helper.make_graph(self.nodes, name, inputs, outputs, initializer=self.inits),
                                  opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 9
        onnx.checker.check_model(model)
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(path))


def _embeddings(g: Graph) -> str:
    """Token plus position embeddings, normalized: [B, S, HIDDEN]."""
    g.weight("emb", (VOCAB, HIDDEN))
    g.weight("pos", (MAX_SEQ, HIDDEN))
    g.node("Gather", ["emb", "input_ids"], "tok")
    g.node("Shape", ["input_ids"], "ids_shape")
    g.init("one_i", np.array([1], np.int64))
    g.init("two_i", np.array([2], np.int64))
    g.init("zero_i", np.array([0], np.int64))
    g.node("Slice", ["ids_shape", "one_i", "two_i"], "seq_len")
    g.node("Slice", ["pos", "zero_i", "seq_len"], "pos_s")
    g.node("Add", ["tok", "pos_s"], "x0")
    return g.node("LayerNormalization", ["x0", g.init("ln_g", np.ones(HIDDEN)), g.init("ln_b", np.zeros(HIDDEN))],
                  "x_in", axis=-1, epsilon=1e-12)


def _mask_bias(g: Graph) -> None:
    """`bias` [B, 1, 1, S]: 0 where attention_mask is 1, -10000 where it is 0."""
    g.node("Cast", ["attention_mask"], "mask_f", to=1)  # FLOAT
    g.node("Sub", [g.init("one_f", np.array(1.0, np.float32)), "mask_f"], "inv")
    g.node("Mul", ["inv", g.init("neg", np.array(-10000.0, np.float32))], "bias2")
    g.node("Unsqueeze", ["bias2", g.init("ax12", np.array([1, 2], np.int64))], "bias")
    g.init("hshape", np.array([0, 0, HEADS, HIDDEN // HEADS], np.int64))
    g.init("mshape", np.array([0, 0, HIDDEN], np.int64))
    g.init("scale", np.array(1.0 / np.sqrt(HIDDEN // HEADS), np.float32))


def _dense(g: Graph, x: str, name: str, n_in: int, n_out: int) -> str:
    m = g.node("MatMul", [x, g.weight(name + "_w", (n_in, n_out))], name + "_m")
    return g.node("Add", [m, g.weight(name + "_b", (n_out,))], name + "_a")


def _norm(g: Graph, x: str, name: str) -> str:
    scale, bias = g.init(name + "_g", np.ones(HIDDEN)), g.init(name + "_b", np.zeros(HIDDEN))
    return g.node("LayerNormalization", [x, scale, bias], name, axis=-1)


def _layer(g: Graph, x: str, p: str) -> str:
    """One encoder layer: multi-head self-attention, then the feed-forward block, each with residual and norm."""
    heads = []
    for n, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        r = g.node("Reshape", [_dense(g, x, p + n, HIDDEN, HIDDEN), "hshape"], p + n + "_r")
        heads.append(g.node("Transpose", [r], p + n + "_t", perm=perm))
    s = g.node("Mul", [g.node("MatMul", heads[:2], p + "s"), "scale"], p + "ss")
    probs = g.node("Softmax", [g.node("Add", [s, "bias"], p + "sb")], p + "p", axis=-1)
    c = g.node("Transpose", [g.node("MatMul", [probs, heads[2]], p + "c")], p + "ct", perm=[0, 2, 1, 3])
    c = g.node("Reshape", [c, "mshape"], p + "cr")
    x1 = _norm(g, g.node("Add", [x, _dense(g, c, p + "o", HIDDEN, HIDDEN)], p + "r1"), p + "n1")
    f = g.node("Relu", [_dense(g, x1, p + "f1", HIDDEN, FFN)], p + "fr")
    return _norm(g, g.node("Add", [x1, _dense(g, f, p + "f2", FFN, HIDDEN)], p + "r2"), p + "n2")


def encoder(path: Path, seed: int = 0) -> None:
    """The BERT-sized text classifier described above, written to `path`."""
    from onnx import TensorProto, helper

    g = Graph(seed)
    x = _embeddings(g)
    _mask_bias(g)
    for layer in range(LAYERS):
        x = _layer(g, x, f"l{layer}_")
    cls = g.node("Gather", [x, g.init("idx0", np.array(0, np.int64))], "cls", axis=1)
    g.node("Tanh", [_dense(g, cls, "pool", HIDDEN, HIDDEN)], "pooled")
    g.node("Identity", [_dense(g, "pooled", "cls_head", HIDDEN, 2)], "logits")
    ins = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])
           for n in ("input_ids", "attention_mask")]
    outs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2]),
            helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", HIDDEN])]
    g.save("encoder", ins, outs, path)


def _conv(g: Graph, x: str, cin: int, cout: int, k: int, stride: int, group: int, name: str) -> str:
    fan_in = cin // group * k * k
    w = g.init(name + "_w", g.rng.standard_normal((cout, cin // group, k, k)) * np.sqrt(2.0 / fan_in))
    conv = g.node("Conv", [x, w, g.init(name + "_b", np.zeros(cout))], name, kernel_shape=[k, k],
                  strides=[stride, stride], pads=[k // 2] * 4, group=group)
    return g.node("Relu", [conv], name + "_r")


def mobilenet(path: Path, seed: int = 0) -> None:
    """The MobileNetV1-like classifier described above, written to `path`."""
    from onnx import TensorProto, helper

    g = Graph(seed)
    x, c = _conv(g, "input", 3, 16, 3, 2, 1, "c0"), 16
    blocks = [(32, 1), (64, 2), (64, 1), (128, 2), (128, 1), (256, 2)] + [(256, 1)] * 5 + [(512, 2), (512, 1)]
    for i, (cout, stride) in enumerate(blocks):
        x = _conv(g, _conv(g, x, c, c, 3, stride, c, f"dw{i}"), c, cout, 1, 1, 1, f"pw{i}")
        c = cout
    flat = g.node("Flatten", [g.node("GlobalAveragePool", [x], "gap")], "flat", axis=1)
    g.node("Gemm", [flat, g.weight("fc_w", (c, 1000), 0.01), g.init("fc_b", np.zeros(1000))], "logits")
    g.save("mobilenet", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 224, 224])],
           [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1000])], path)


def forest(path: Path, seed: int = 0) -> None:
    """The random-forest classifier described above, written to `path`: complete trees of random splits, each leaf
    voting for one class, as skl2onnx writes a forest with `zipmap` off."""
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    keys = ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_values", "nodes_modes", "nodes_truenodeids",
            "nodes_falsenodeids", "class_treeids", "class_nodeids", "class_ids", "class_weights")
    attrs: dict[str, list] = {key: [] for key in keys}
    splits = 2 ** FOREST_DEPTH - 1
    for tree in range(FOREST_TREES):
        for node in range(2 * splits + 1):
            leaf = node >= splits
            for key, value in (("nodes_treeids", tree), ("nodes_nodeids", node),
                               ("nodes_featureids", 0 if leaf else int(rng.integers(FOREST_FEATURES))),
                               ("nodes_values", 0.0 if leaf else float(rng.standard_normal())),
                               ("nodes_modes", "LEAF" if leaf else "BRANCH_LEQ"),
                               ("nodes_truenodeids", 0 if leaf else 2 * node + 1),
                               ("nodes_falsenodeids", 0 if leaf else 2 * node + 2)):
                attrs[key].append(value)
            if leaf:
                for key, value in (("class_treeids", tree), ("class_nodeids", node),
                                   ("class_ids", int(rng.integers(FOREST_CLASSES))),
                                   ("class_weights", 1.0 / FOREST_TREES)):
                    attrs[key].append(value)
    trees = helper.make_node("TreeEnsembleClassifier", ["X"], ["label", "probabilities"], domain="ai.onnx.ml",
                             classlabels_int64s=list(range(FOREST_CLASSES)), post_transform="NONE", **attrs)
    graph = helper.make_graph(
        [trees], "forest", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", FOREST_FEATURES])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]),
         helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", FOREST_CLASSES])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def pipeline(root: Path, seed: int = 0) -> None:
    """The ensemble described above under `root`: `normalise` ((X - mean) / std, FP32 [B, 256]), `classifier` (the
    sweep's mlp, 256-1024-1024-10, with its 500 us queue delay), `softmax` (FP32 [B, 10]), and `pipeline` over them."""
    from onnx import TensorProto, helper

    from gt_serve.testing import model_builders as mb

    def fp32(name: str, width: int):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", width])

    g = Graph(seed)
    g.node("Div", [g.node("Sub", ["X", g.weight("mean", 256, 1.0)], "centred"),
                   g.init("std", g.rng.uniform(0.5, 1.5, 256))], "Y")
    g.save("normalise", [fp32("X", 256)], [fp32("Y", 256)], root / "normalise" / "1" / "model.onnx")
    g = Graph(seed)
    g.node("Softmax", ["L"], "P", axis=-1)
    g.save("softmax", [fp32("L", 10)], [fp32("P", 10)], root / "softmax" / "1" / "model.onnx")
    mb.mlp(root / "classifier" / "1" / "model.onnx", seed=seed)
    for name, i, o, w_in, w_out, delay in (("normalise", "X", "Y", 256, 256, ""), ("softmax", "L", "P", 10, 10, ""),
                                           ("classifier", "INPUT", "OUTPUT", 256, 10,
                                            "max_queue_delay_microseconds: 500")):
        (root / name / "config.pbtxt").write_text(
            PIPELINE_STEP_CONFIG.format(name=name, i=i, o=o, w_in=w_in, w_out=w_out, delay=delay))
    (root / "pipeline" / "1").mkdir(parents=True, exist_ok=True)
    (root / "pipeline" / "config.pbtxt").write_text(PIPELINE_CONFIG)


def mlp_bf16(path: Path, seed: int = 0) -> None:
    """The sweep's mlp between a Cast of its BF16 INPUT to FP32 and a Cast of its OUTPUT to BF16."""
    import onnx
    from onnx import TensorProto, helper

    from gt_serve.testing import model_builders as mb

    mb.mlp(path, seed=seed)
    model = onnx.load(str(path))
    graph = model.graph
    for node in graph.node:
        node.input[:] = ["INPUT_fp32" if n == "INPUT" else n for n in node.input]
        node.output[:] = ["OUTPUT_fp32" if n == "OUTPUT" else n for n in node.output]
    graph.node.insert(0, helper.make_node("Cast", ["INPUT"], ["INPUT_fp32"], to=TensorProto.FLOAT))
    graph.node.append(helper.make_node("Cast", ["OUTPUT_fp32"], ["OUTPUT"], to=TensorProto.BFLOAT16))
    for tensor in (graph.input[0], graph.output[0]):
        tensor.type.tensor_type.elem_type = TensorProto.BFLOAT16
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def build(root: Path) -> Path:
    """The models above as a Triton-style repository under `root`."""
    from gt_serve.testing import model_builders as mb
    from gt_serve.testing.feature_models import move_weights_out

    encoder(root / "encoder_nocfg" / "1" / "model.onnx")
    encoder(root / "encoder_db" / "1" / "model.onnx")
    (root / "encoder_db" / "config.pbtxt").write_text(ENCODER_DB_CONFIG)
    mobilenet(root / "mobilenet" / "1" / "model.onnx")
    (root / "mobilenet" / "config.pbtxt").write_text(MOBILENET_CONFIG)
    forest(root / "forest" / "1" / "model.onnx")
    pipeline(root)
    mlp_bf16(root / "mlp_bf16" / "1" / "model.onnx")
    mb.mlp(root / "mlp_packed" / "1" / "model.onnx" / "model.onnx")
    move_weights_out(root / "mlp_packed" / "1" / "model.onnx" / "model.onnx")
    for name in ("mlp_bf16", "mlp_packed"):
        (root / name / "config.pbtxt").write_text(
            PIPELINE_STEP_CONFIG.format(name=name, i="INPUT", o="OUTPUT", w_in=256, w_out=10,
                                        delay="max_queue_delay_microseconds: 500"))
    (root / "mlp_bf16" / "config.pbtxt").write_text((root / "mlp_bf16" / "config.pbtxt").read_text()
                                                    .replace("TYPE_FP32", "TYPE_BF16"))
    return root


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python bench/user_models.py DIR")
    print(build(Path(sys.argv[1])))
