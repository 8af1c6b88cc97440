"""Models of particular config features, built with the onnx helper API for the tests: ragged batching (Triton's
example, with batch inputs and a batch output), a custom operator (onnxruntime-extensions' StringLower), bfloat16
tensors, an initializer a request may override (Triton's test model), a model's weights moved to an external
data file (as large models are saved), and graphs with inputs or outputs no V2 tensor carries (a scikit-learn
classifier's ZipMap, a sequence input, FP8 elements)."""
from __future__ import annotations

from pathlib import Path

from .model_builders import save_model


RAGGED_SUM_CONFIG = """max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
batch_input [
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "INDEX" data_type: TYPE_INT32 source_input: "INPUT" },
  { kind: BATCH_ELEMENT_COUNT target_name: "COUNT" data_type: TYPE_FP32 source_input: "INPUT" } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "MEAN" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "DOUBLED" data_type: TYPE_FP32 dims: [ -1 ] } ]
batch_output [ { target_name: "DOUBLED" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "INPUT" } ]
"""  # ragged_sum's Triton config: Triton's ragged-batching example, with two batch inputs and a batch output


def ragged_sum(path: Path) -> None:
    """Ragged batching's model (RAGGED_SUM_CONFIG): INPUT [N], every request's elements flattened and joined; INDEX
    [B] INT32, where each request's elements end (BATCH_ACCUMULATED_ELEMENT_COUNT); COUNT [B] FP32, how many it has
    (BATCH_ELEMENT_COUNT) -> SUM [B, 1] and MEAN [B, 1] of each request's elements, DOUBLED [N] = 2 * INPUT."""
    from onnx import TensorProto, helper

    f32 = TensorProto.FLOAT
    inits = [helper.make_tensor("axis0", TensorProto.INT64, [1], [0]),
             helper.make_tensor("zero_f", f32, [1], [0.0]), helper.make_tensor("zero_i", TensorProto.INT64, [1], [0]),
             helper.make_tensor("minus1", TensorProto.INT64, [1], [-1]),
             helper.make_tensor("axis1", TensorProto.INT64, [1], [1]), helper.make_tensor("two", f32, [], [2.0])]
    nodes = [helper.make_node("CumSum", ["INPUT", "axis0"], ["cs"]),
             helper.make_node("Concat", ["zero_f", "cs"], ["cs0"], axis=0),
             helper.make_node("Cast", ["INDEX"], ["ends"], to=TensorProto.INT64),
             helper.make_node("Slice", ["ends", "zero_i", "minus1", "axis0"], ["before"]),
             helper.make_node("Concat", ["zero_i", "before"], ["starts"], axis=0),
             helper.make_node("Gather", ["cs0", "ends"], ["hi"]), helper.make_node("Gather", ["cs0", "starts"], ["lo"]),
             helper.make_node("Sub", ["hi", "lo"], ["sum"]), helper.make_node("Unsqueeze", ["sum", "axis1"], ["SUM"]),
             helper.make_node("Unsqueeze", ["COUNT", "axis1"], ["count2"]),
             helper.make_node("Div", ["SUM", "count2"], ["MEAN"]),
             helper.make_node("Mul", ["INPUT", "two"], ["DOUBLED"])]
    inputs = [helper.make_tensor_value_info("INPUT", f32, ["n"]),
              helper.make_tensor_value_info("INDEX", TensorProto.INT32, ["b"]),
              helper.make_tensor_value_info("COUNT", f32, ["b"])]
    outputs = [helper.make_tensor_value_info("SUM", f32, ["b", 1]),
               helper.make_tensor_value_info("MEAN", f32, ["b", 1]),
               helper.make_tensor_value_info("DOUBLED", f32, ["n"])]
    save_model(helper.make_graph(nodes, "ragged_sum", inputs, outputs, inits), path)


def string_lower(path: Path) -> None:
    """BYTES INPUT [B, N] -> OUTPUT lower-cased by StringLower, a custom operator of onnxruntime-extensions
    (domain ai.onnx.contrib): a session needs that package's library (model_operations) to load it."""
    from onnx import TensorProto, helper

    inp = helper.make_tensor_value_info("INPUT", TensorProto.STRING, ["batch", "n"])
    out = helper.make_tensor_value_info("OUTPUT", TensorProto.STRING, ["batch", "n"])
    node = helper.make_node("StringLower", ["INPUT"], ["OUTPUT"], domain="ai.onnx.contrib")
    save_model(helper.make_graph([node], "lower", [inp], [out]), path, domains=("ai.onnx.contrib",))


def move_weights_out(path: Path, location: str = "weights.bin") -> None:
    """Rewrite the model at `path` with every initializer in the external data file `location` beside it (onnx's
    save_as_external_data, as models over protobuf's 2 GB limit are saved): a session reads both files."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    for tensor in model.graph.initializer:  # onnx moves only tensors held as raw bytes
        tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor), tensor.name))
    (path.parent / location).parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=location,
                    size_threshold=0)


def bf16_scale(path: Path, width: int = 4) -> None:
    """BF16 INPUT and FP32 OFFSET [B, width] -> OUTPUT (BF16) and WIDE (FP32), both 2 * INPUT + OFFSET (computed
    in FP32; OUTPUT rounded to bfloat16): a model of bfloat16 tensors beside FP32 ones."""
    from onnx import TensorProto, helper

    bf16, f32 = TensorProto.BFLOAT16, TensorProto.FLOAT
    nodes = [helper.make_node("Cast", ["INPUT"], ["wide_in"], to=f32),
             helper.make_node("Mul", ["wide_in", "two"], ["doubled"]),
             helper.make_node("Add", ["doubled", "OFFSET"], ["WIDE"]),
             helper.make_node("Cast", ["WIDE"], ["OUTPUT"], to=bf16)]
    inputs = [helper.make_tensor_value_info("INPUT", bf16, ["batch", width]),
              helper.make_tensor_value_info("OFFSET", f32, ["batch", width])]
    outputs = [helper.make_tensor_value_info("OUTPUT", bf16, ["batch", width]),
               helper.make_tensor_value_info("WIDE", f32, ["batch", width])]
    two = helper.make_tensor("two", f32, [], [2.0])
    save_model(helper.make_graph(nodes, "bf16_scale", inputs, outputs, [two]), path)


def add_with_initializer(path: Path) -> None:
    """Triton's onnxruntime backend test model (test/initializer_as_input): FP32 INPUT [5, 5] + INITIALIZER -> OUTPUT,
    INITIALIZER an initializer of ones that the graph also lists as an input (onnxruntime: an overridable
    initializer; a request may feed it)."""
    from onnx import TensorProto, helper

    f32 = TensorProto.FLOAT
    ones = helper.make_tensor("INITIALIZER", f32, [5, 5], [1.0] * 25)
    io = [helper.make_tensor_value_info(n, f32, [5, 5]) for n in ("INPUT", "INITIALIZER", "OUTPUT")]
    node = helper.make_node("Add", ["INPUT", "INITIALIZER"], ["OUTPUT"])
    save_model(helper.make_graph([node], "init_input", io[:2], io[2:], [ones]), path)


def zipmap_classifier(path: Path, features: int = 4, classes: int = 3, probabilities: bool = True) -> None:
    """A scikit-learn classifier as skl2onnx exports it by default: FP32 X [B, features] -> `label` (INT64 [B], the
    argmax of X's first `classes` columns) and `output_probability`, a ZipMap's sequence of maps (class -> softmax
    probability), which no V2 tensor carries. `probabilities` False: `output_probability` is the only output."""
    from onnx import TensorProto, helper

    weights = [1.0 if f == c else 0.0 for c in range(classes) for f in range(features)]
    ml = "ai.onnx.ml"
    nodes = [helper.make_node("LinearClassifier", ["X"], ["label", "probabilities"], domain=ml,
                              coefficients=weights, intercepts=[0.0] * classes,
                              classlabels_ints=list(range(classes)), post_transform="SOFTMAX"),
             helper.make_node("ZipMap", ["probabilities"], ["output_probability"], domain=ml,
                              classlabels_int64s=list(range(classes)))]
    maps = helper.make_sequence_type_proto(helper.make_map_type_proto(
        TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, [])))
    outputs = [helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"])] if probabilities else []
    outputs.append(helper.make_value_info("output_probability", maps))
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", features])]
    if not probabilities:
        nodes[0].output[0] = "unused_label"
    save_model(helper.make_graph(nodes, "zipmap_classifier", inputs, outputs), path, domains=(ml,))


def sequence_input(path: Path) -> None:
    """S, an ONNX sequence of FP32 [N, 3] tensors -> Y, its first tensor: an input no V2 request can feed."""
    from onnx import TensorProto, helper

    seq = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, ["n", 3]))
    zero = helper.make_tensor("zero", TensorProto.INT64, [], [0])
    node = helper.make_node("SequenceAt", ["S", "zero"], ["Y"])
    save_model(helper.make_graph([node], "sequence_input", [helper.make_value_info("S", seq)],
                                 [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n", 3])], [zero]), path)


def fp8_input(path: Path) -> None:
    """X (FLOAT8E4M3FN [B, 4]) -> Y, X cast to FP32 (opset 19): a tensor of an element type with no V2 datatype."""
    from onnx import TensorProto, helper

    node = helper.make_node("Cast", ["X"], ["Y"], to=TensorProto.FLOAT)
    save_model(helper.make_graph([node], "fp8_input",
                                 [helper.make_tensor_value_info("X", TensorProto.FLOAT8E4M3FN, ["batch", 4])],
                                 [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 4])]),
               path, opset=19)
