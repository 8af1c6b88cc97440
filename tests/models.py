"""The test model repository, generated with the onnx helper API (gt_serve.testing.model_builders)."""
from __future__ import annotations

from pathlib import Path

from gt_serve.testing import model_builders as mb


def build_repository(root: Path) -> Path:
    root = Path(root)
    mb.simple_add_sub(root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(mb.SIMPLE_CONFIG)
    # no config.pbtxt: completed from the ONNX graph
    mb.scale(root / "identity_fp32" / "1" / "model.onnx", factor=2.0, width=4)
    mb.string_identity(root / "strings" / "1" / "model.onnx")
    mb.add_one_fixed(root / "nobatch" / "1" / "model.onnx", width=4)
    mb.classifier(root / "classifier" / "1" / "model.onnx", features=8, classes=5, seed=0)
    (root / "classifier" / "labels.txt").write_text("\n".join(f"class_{i}" for i in range(5)) + "\n")
    (root / "classifier" / "config.pbtxt").write_text(
        'name: "classifier"\nmax_batch_size: 16\n'
        'output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 5 ] label_filename: "labels.txt" } ]\n'
    )
    mb.dtype_identity(root / "dtypes" / "1" / "model.onnx")
    (root / "dtypes" / "config.pbtxt").write_text('name: "dtypes"\nmax_batch_size: 8\n')
    # two versions: 1 scales by 2 (identity_fp32 copy), 2 scales by 3
    mb.scale(root / "versioned" / "1" / "model.onnx", factor=2.0, width=4)
    mb.scale(root / "versioned" / "3" / "model.onnx", factor=3.0, width=4)
    return root


GATHER_TABLE = [[4 * r + c for c in range(4)] for r in range(10)]  # the rows `gather` models index (FP32 10 x 4)


def gather_repository(root: Path) -> Path:
    """`build_repository`'s models and two whose onnxruntime run fails on an index out of range (CPU lanes: the CPU
    Gather checks its indices): `gather`, and `gather_pair`, which runs two requests together and keeps a lone one
    waiting (up to 10 s) for its partner."""
    import numpy as np

    root = build_repository(root)
    table = np.array(GATHER_TABLE, dtype=np.float32)
    cpu = 'instance_group [ { kind: KIND_CPU } ]\n'
    mb.gather(root / "gather" / "1" / "model.onnx", table)
    (root / "gather" / "config.pbtxt").write_text('name: "gather"\nmax_batch_size: 8\n' + cpu)
    mb.gather(root / "gather_pair" / "1" / "model.onnx", table)
    (root / "gather_pair" / "config.pbtxt").write_text(
        'name: "gather_pair"\nmax_batch_size: 8\n'
        'dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 10000000 }\n' + cpu)
    return root


def cnn_repository(root: Path, max_batch_size: int = 64, queue_size: int = 0) -> Path:
    """`cnn` (batched, no queue delay, optional `max_queue_size`) and `simple`: a model slow enough
    to keep requests queued or in flight, beside a fast one."""
    root = Path(root)
    mb.cnn(root / "cnn" / "1" / "model.onnx")
    policy = f" default_queue_policy {{ max_queue_size: {queue_size} }}" if queue_size else ""
    (root / "cnn" / "config.pbtxt").write_text(
        f'name: "cnn"\nmax_batch_size: {max_batch_size}\n'
        f'dynamic_batching {{ max_queue_delay_microseconds: 0{policy} }}\n'
        # CPU lanes even where a GPU is present: the compute time is what keeps requests waiting
        'instance_group [ { kind: KIND_CPU } ]\n')
    mb.simple_add_sub(root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(mb.SIMPLE_CONFIG)
    return root


def read_until_closed(sock) -> bytes:
    """Everything a socket receives until the peer closes it (a reset counts as closed)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def classifier_weights():
    import numpy as np

    return np.random.default_rng(0).standard_normal((8, 5)).astype(np.float32)
