"""Small ONNX models built with the onnx helper API: the bundled demo repository and the tests use them.

Kept in the package (not in tests/) so `gt-serve` with no flags can write its demo repository.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

OPSET = 17
IR_VERSION = 9


def save_model(graph, path: Path, domains: tuple[str, ...] = (), opset: int = OPSET) -> None:
    """`domains`: custom-operator domains the graph uses (version 1 of each)."""
    import onnx
    from onnx import helper

    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def simple_add_sub(path: Path, batch: bool = True, size: int = 16) -> None:
    """INT32 INPUT0, INPUT1 [B, size] -> OUTPUT0 = sum, OUTPUT1 = difference (Triton's `simple`)."""
    from onnx import TensorProto, helper

    dims = ["batch", size] if batch else [size]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT32, dims) for n in ("INPUT0", "INPUT1")]
    outputs = [helper.make_tensor_value_info(n, TensorProto.INT32, dims) for n in ("OUTPUT0", "OUTPUT1")]
    nodes = [
        helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
        helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
    ]
    save_model(helper.make_graph(nodes, "simple", inputs, outputs), path)


def scale(path: Path, factor: float = 2.0, width: int = 4) -> None:
    """FP32 INPUT [B, width] -> OUTPUT = INPUT * factor."""
    from onnx import TensorProto, helper

    inp = helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["batch", width])
    out = helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, ["batch", width])
    k = helper.make_tensor("k", TensorProto.FLOAT, [], [factor])
    node = helper.make_node("Mul", ["INPUT", "k"], ["OUTPUT"])
    save_model(helper.make_graph([node], "scale", [inp], [out], initializer=[k]), path)


def sine_sum(path: Path, rounds: int = 32) -> None:
    """FP32 INPUT [B, N], N any -> OUTPUT [B, 1] = the sum over N of sin applied `rounds` times: a run as long as its
    rows are wide (the preserve_ordering tests' long and short requests)."""
    from onnx import TensorProto, helper

    inp = helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["batch", "n"])
    out = helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, ["batch", 1])
    names = ["INPUT"] + [f"sin{i}" for i in range(rounds)]
    nodes = [helper.make_node("Sin", [a], [b]) for a, b in zip(names, names[1:])]
    nodes.append(helper.make_node("ReduceSum", [names[-1], "axis"], ["OUTPUT"], keepdims=1))
    axis = helper.make_tensor("axis", TensorProto.INT64, [1], [1])
    save_model(helper.make_graph(nodes, "sine_sum", [inp], [out], initializer=[axis]), path)


def add_pair(path: Path, width: int = 4) -> None:
    """FP32 A, B [B, width] -> SUM = A + B (the join of a diamond-shaped ensemble)."""
    from onnx import TensorProto, helper

    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", width]) for n in ("A", "B")]
    out = helper.make_tensor_value_info("SUM", TensorProto.FLOAT, ["batch", width])
    save_model(helper.make_graph([helper.make_node("Add", ["A", "B"], ["SUM"])], "add_pair", inputs, [out]), path)


def accumulator(path: Path, width: int = 4, corrid: str = "UINT64", echo: bool = True) -> None:
    """A stateful model for sequence_batching: FP32 INPUT [B, width], controls START, END, READY [B, 1] FP32 and
    CORRID [B, 1] (`corrid`: UINT64 or STRING), implicit state STATE_IN / STATE_OUT [B, width] ->
    OUTPUT = INPUT + (1 - START) * STATE_IN (the sum over the sequence so far; also STATE_OUT) and, with `echo`,
    FLAGS = [START, END, READY] and CORRID_OUT (CORRID as given: INT64 from UINT64, or the string)."""
    from onnx import TensorProto, helper

    def info(name, kind, cols):
        return helper.make_tensor_value_info(name, kind, ["batch", cols])

    fp = TensorProto.FLOAT
    cid = TensorProto.UINT64 if corrid == "UINT64" else TensorProto.STRING
    inputs = [info("INPUT", fp, width), info("STATE_IN", fp, width), info("START", fp, 1), info("END", fp, 1),
              info("READY", fp, 1), info("CORRID", cid, 1)]
    outputs = [info("OUTPUT", fp, width), info("STATE_OUT", fp, width), info("FLAGS", fp, 3),
               info("CORRID_OUT", TensorProto.INT64 if corrid == "UINT64" else cid, 1)]
    one = helper.make_tensor("one", fp, [], [1.0])
    nodes = [helper.make_node("Sub", ["one", "START"], ["keep"]),
             helper.make_node("Mul", ["keep", "STATE_IN"], ["kept"]),
             helper.make_node("Add", ["INPUT", "kept"], ["OUTPUT"]),
             helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"]),
             helper.make_node("Concat", ["START", "END", "READY"], ["FLAGS"], axis=1),
             helper.make_node("Cast", ["CORRID"], ["CORRID_OUT"], to=TensorProto.INT64) if corrid == "UINT64"
             else helper.make_node("Identity", ["CORRID"], ["CORRID_OUT"])][:None if echo else 4]
    outputs = outputs[:None if echo else 2]
    save_model(helper.make_graph(nodes, "accumulator", inputs, outputs, initializer=[one]), path)


def growing(path: Path) -> None:
    """A sequence model whose implicit state grows: FP32 INPUT [B, 1], state STATE_IN [B, -1] -> STATE_OUT = STATE_IN
    with INPUT appended, OUTPUT [B, 1] = its sum (with config GROWING_CONFIG: the sum of the sequence's inputs)."""
    from onnx import TensorProto, helper

    fp = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("INPUT", fp, ["batch", 1]),
              helper.make_tensor_value_info("STATE_IN", fp, ["batch", "steps"])]
    outputs = [helper.make_tensor_value_info("OUTPUT", fp, ["batch", 1]),
               helper.make_tensor_value_info("STATE_OUT", fp, ["batch", "steps_out"])]
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    nodes = [helper.make_node("Concat", ["STATE_IN", "INPUT"], ["STATE_OUT"], axis=1),
             helper.make_node("ReduceSum", ["STATE_OUT", "axes"], ["OUTPUT"], keepdims=1)]
    save_model(helper.make_graph(nodes, "growing", inputs, outputs, initializer=[axes]), path)


GROWING_CONFIG = """max_batch_size: 8
sequence_batching { state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32 dims: [ -1 ] } ] }
"""


def rnn_cell(path: Path, features: int = 64, hidden: int = 256, classes: int = 32, seed: int = 0) -> None:
    """One step of a recurrent network, a stateful model of the kind streaming audio runs: FP32 INPUT [B, features]
    (a frame), START [B, 1], state STATE_IN [B, hidden] -> STATE_OUT = tanh(INPUT Wx + (1 - START) STATE_IN Wh + b),
    OUTPUT [B, classes] = STATE_OUT Wo."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    fp = TensorProto.FLOAT
    inits = [_init((rng.standard_normal((rows, cols)) / np.sqrt(rows)).astype(np.float32), name)
             for name, rows, cols in (("Wx", features, hidden), ("Wh", hidden, hidden), ("Wo", hidden, classes))]
    inits += [_init(np.zeros(hidden, dtype=np.float32), "b"), _init(np.ones(1, dtype=np.float32), "one")]
    inputs = [helper.make_tensor_value_info("INPUT", fp, ["batch", features]),
              helper.make_tensor_value_info("STATE_IN", fp, ["batch", hidden]),
              helper.make_tensor_value_info("START", fp, ["batch", 1])]
    outputs = [helper.make_tensor_value_info("OUTPUT", fp, ["batch", classes]),
               helper.make_tensor_value_info("STATE_OUT", fp, ["batch", hidden])]
    nodes = [_node("Sub", ["one", "START"], ["keep"]), _node("Mul", ["STATE_IN", "keep"], ["h0"]),
             _node("MatMul", ["INPUT", "Wx"], ["x"]), _node("MatMul", ["h0", "Wh"], ["h"]),
             _node("Add", ["x", "h"], ["xh"]), _node("Add", ["xh", "b"], ["pre"]),
             _node("Tanh", ["pre"], ["STATE_OUT"]), _node("MatMul", ["STATE_OUT", "Wo"], ["OUTPUT"])]
    save_model(helper.make_graph(nodes, "rnn_cell", inputs, outputs, initializer=inits), path)


ACCUMULATOR_CONFIG = """max_batch_size: 8
sequence_batching {
  max_sequence_idle_microseconds: %d
  oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 200 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: %s } ] }
  ]
  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
}
"""  # (idle microseconds, CORRID's TYPE_UINT64 or TYPE_STRING): the accumulator's Triton config, outputs completed


def add_one_fixed(path: Path, width: int = 4) -> None:
    """FP32 INPUT [width] (no batch dimension) -> OUTPUT = INPUT + 1."""
    from onnx import TensorProto, helper

    inp = helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, [width])
    out = helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, [width])
    k = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    node = helper.make_node("Add", ["INPUT", "one"], ["OUTPUT"])
    save_model(helper.make_graph([node], "nobatch", [inp], [out], initializer=[k]), path)


def string_identity(path: Path) -> None:
    """BYTES INPUT [B, N] -> OUTPUT identity."""
    from onnx import TensorProto, helper

    inp = helper.make_tensor_value_info("INPUT", TensorProto.STRING, ["batch", "n"])
    out = helper.make_tensor_value_info("OUTPUT", TensorProto.STRING, ["batch", "n"])
    node = helper.make_node("Identity", ["INPUT"], ["OUTPUT"])
    save_model(helper.make_graph([node], "strings", [inp], [out]), path)


def dtype_identity(path: Path) -> None:
    """Identity for several datatypes: IN_<T> [B, 3] -> OUT_<T>."""
    from onnx import TensorProto, helper

    types = {"INT64": TensorProto.INT64, "FP16": TensorProto.FLOAT16, "BOOL": TensorProto.BOOL,
             "UINT8": TensorProto.UINT8, "FP64": TensorProto.DOUBLE, "INT8": TensorProto.INT8}
    inputs, outputs, nodes = [], [], []
    for name, t in types.items():
        inputs.append(helper.make_tensor_value_info(f"IN_{name}", t, ["batch", 3]))
        outputs.append(helper.make_tensor_value_info(f"OUT_{name}", t, ["batch", 3]))
        nodes.append(helper.make_node("Identity", [f"IN_{name}"], [f"OUT_{name}"]))
    save_model(helper.make_graph(nodes, "dtypes", inputs, outputs), path)


def gather(path: Path, table: np.ndarray) -> None:
    """INT64 INDICES [B, 1] -> OUTPUT [B, 1, width] = rows of a constant `table` (Gather): an index out of range
    passes every check a server makes (datatype, shape) and fails inside onnxruntime's run."""
    from onnx import TensorProto, helper, numpy_helper

    indices = helper.make_tensor_value_info("INDICES", TensorProto.INT64, ["batch", 1])
    out = helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, ["batch", 1, table.shape[1]])
    node = helper.make_node("Gather", ["TABLE", "INDICES"], ["OUTPUT"], axis=0)
    table_init = [numpy_helper.from_array(table, "TABLE")]
    save_model(helper.make_graph([node], "gather", [indices], [out], initializer=table_init), path)


def classifier(path: Path, features: int = 8, classes: int = 5, seed: int = 0) -> np.ndarray:
    """FP32 INPUT [B, features] -> OUTPUT softmax(INPUT @ W) [B, classes]. Returns W."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(seed).standard_normal((features, classes)).astype(np.float32)
    inp = helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["batch", features])
    out = helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, ["batch", classes])
    nodes = [helper.make_node("MatMul", ["INPUT", "W"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["OUTPUT"], axis=-1)]
    graph = helper.make_graph(nodes, "classifier", [inp], [out], initializer=[numpy_helper.from_array(w, "W")])
    save_model(graph, path)
    return w


def argmax(path: Path, features: int = 10) -> None:
    """FP32 INPUT [B, features] -> INT64 CLASS [B], the index of each row's largest value: an output of the batch
    dimension alone (Triton completes it as dims [1] with an empty reshape)."""
    from onnx import TensorProto, helper

    inp = helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["batch", features])
    out = helper.make_tensor_value_info("CLASS", TensorProto.INT64, ["batch"])
    node = helper.make_node("ArgMax", ["INPUT"], ["CLASS"], axis=1, keepdims=0)
    save_model(helper.make_graph([node], "argmax", [inp], [out]), path)


def mlp(path: Path, sizes=(256, 1024, 1024, 10), seed: int = 0) -> None:
    """FP32 MLP: INPUT [B, sizes[0]] -> OUTPUT [B, sizes[-1]] with ReLU between layers."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits, nodes = [], []
    prev = "INPUT"
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        w = (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)
        bias = np.zeros(b, np.float32)
        inits += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(bias, f"B{i}")]
        out = "OUTPUT" if i == len(sizes) - 2 else f"h{i}"
        nodes.append(helper.make_node("Gemm", [prev, f"W{i}", f"B{i}"], [f"g{i}" if out != "OUTPUT" else "OUTPUT"]))
        if out != "OUTPUT":
            nodes.append(helper.make_node("Relu", [f"g{i}"], [out]))
        prev = out
    inp = helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["batch", sizes[0]])
    outp = helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, ["batch", sizes[-1]])
    save_model(helper.make_graph(nodes, "mlp", [inp], [outp], initializer=inits), path)


def image_head(path: Path, channels: int = 3, classes: int = 10, seed: int = 0) -> None:
    """FP32 INPUT [B, channels, H, W] (any H, W) -> OUTPUT [B, classes]: the mean of each channel times a matrix.
    Next to no compute: what a server costs to carry an image-sized tensor (3x224x224 = 588 KiB) in and out."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(seed).standard_normal((channels, classes)).astype(np.float32)
    nodes = [helper.make_node("ReduceMean", ["INPUT"], ["mean"], axes=[2, 3], keepdims=0),
             helper.make_node("MatMul", ["mean", "W"], ["OUTPUT"])]
    inp = helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["batch", channels, "h", "w"])
    outp = helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, ["batch", classes])
    save_model(helper.make_graph(nodes, "image_head", [inp], [outp], initializer=[numpy_helper.from_array(w, "W")]),
               path)


def _conv_stack(rng, nodes, inits, x: str, layers) -> str:
    for name, cin, cout, stride in layers:
        w = (rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(cin * 9)).astype(np.float32)
        inits.append(_init(w, f"{name}_w"))
        inits.append(_init(np.zeros(cout, np.float32), f"{name}_b"))
        nodes.append(_node("Conv", [x, f"{name}_w", f"{name}_b"], [f"{name}_c"], pads=[1, 1, 1, 1], strides=[stride, stride]))
        nodes.append(_node("Relu", [f"{name}_c"], [f"{name}_r"]))
        x = f"{name}_r"
    return x


def _init(array, name):
    from onnx import numpy_helper

    return numpy_helper.from_array(array, name)


def _node(op, inputs, outputs, **attrs):
    from onnx import helper

    return helper.make_node(op, inputs, outputs, **attrs)


def cnn(path: Path, seed: int = 0, head: str = "dense") -> None:
    """FP32 CNN of about 100 MFLOP per sample: INPUT [B, 3, 64, 64] -> OUTPUT [B, 10].

    head="dense" (default): a VGG-style classifier head (flatten -> FC 512 -> FC 10) whose 64 MB of
    weights make batch 1 memory-bound, as in most CNN classifiers; head="gap": an all-convolutional
    net with global average pooling, compute-bound at every batch size.
    """
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    inits, nodes = [], []
    if head == "dense":
        # MACs: 1.8M + 4.7M + 4.7M + 18.9M (convs) + 16.8M (FC) ~ 47M ~ 94 MFLOP
        layers = [("c1", 3, 16, 1), ("c2", 16, 32, 2), ("c3", 32, 64, 2), ("c4", 64, 128, 1)]
        x = _conv_stack(rng, nodes, inits, "INPUT", layers)
        nodes.append(_node("Flatten", [x], ["flat"], axis=1))
        dims = [(16 * 16 * 128, 512), (512, 10)]
    else:
        # MACs: 1.8M + 4.7M + 18.9M + 9.4M + 18.9M ~ 54M ~ 107 MFLOP
        layers = [("c1", 3, 16, 1), ("c2", 16, 32, 2), ("c3", 32, 64, 1), ("c4", 64, 64, 2), ("c5", 64, 128, 1)]
        x = _conv_stack(rng, nodes, inits, "INPUT", layers)
        nodes.append(_node("GlobalAveragePool", [x], ["gap"]))
        nodes.append(_node("Flatten", ["gap"], ["flat"], axis=1))
        dims = [(128, 10)]
    prev = "flat"
    for i, (a, b) in enumerate(dims):
        w = (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)
        inits += [_init(w, f"fc{i}_w"), _init(np.zeros(b, np.float32), f"fc{i}_b")]
        out = "OUTPUT" if i == len(dims) - 1 else f"fc{i}"
        nodes.append(_node("Gemm", [prev, f"fc{i}_w", f"fc{i}_b"], [out if out == "OUTPUT" else f"{out}_g"]))
        if out != "OUTPUT":
            nodes.append(_node("Relu", [f"{out}_g"], [out]))
        prev = out
    inp = helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["batch", 3, 64, 64])
    outp = helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, ["batch", 10])
    save_model(helper.make_graph(nodes, "cnn", [inp], [outp], initializer=inits), path)


SIMPLE_CONFIG = """name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
dynamic_batching { max_queue_delay_microseconds: 100 }
"""


def demo_repository(root: Path) -> Path:
    """The bundled demo: `simple` (INT32 add/sub) and `classifier` (FP32 softmax, labels)."""
    root = Path(root)
    simple_add_sub(root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(SIMPLE_CONFIG)
    classifier(root / "classifier" / "1" / "model.onnx")
    (root / "classifier" / "labels.txt").write_text("\n".join(f"class_{i}" for i in range(5)) + "\n")
    (root / "classifier" / "config.pbtxt").write_text(
        'name: "classifier"\nmax_batch_size: 32\n'
        'output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 5 ] label_filename: "labels.txt" } ]\n'
        "dynamic_batching { }\n"
    )
    return root
