"""bench/user_models.py: the users' kinds of models that bench/perf_repo.py measures (a BERT-sized text encoder with
and without config.pbtxt, a MobileNet-like classifier, a random forest, an ensemble of three steps) build, run in
onnxruntime, and load in gt-serve as Triton would complete them (issue #17: "with models and configs of our own")."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import perf_repo  # noqa: E402
import user_models  # noqa: E402

from gt_serve.backends.onnx_runner import OnnxRunner  # noqa: E402
from gt_serve.core.model_config import complete_config, parse_pbtxt  # noqa: E402


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    return user_models.build(tmp_path_factory.mktemp("users"))


def _session(repo: Path, model: str):
    import onnxruntime as ort

    return ort.InferenceSession(str(repo / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])


def _completed(repo: Path, model: str):
    runner = OnnxRunner(str(repo / model / "1" / "model.onnx"), intra_op_threads=1)
    path = repo / model / "config.pbtxt"
    text = path.read_text() if path.exists() else ""
    cfg = complete_config(parse_pbtxt(text, model), model, runner.inputs, runner.outputs, "max_batch_size" in text)
    runner.close()
    return cfg


def test_the_repository_holds_the_models_and_the_pipeline_with_its_steps(repo):
    assert perf_repo.repository_models(repo) == ["classifier", "encoder_db", "encoder_nocfg", "forest", "mlp_bf16",
                                                 "mlp_packed", "mobilenet", "normalise", "pipeline", "softmax"]
    assert perf_repo.with_steps(repo, ["pipeline"]) == ["pipeline", "normalise", "classifier", "softmax"]


def test_the_pipelines_steps_normalise_classify_and_give_probabilities(repo):
    x = np.random.default_rng(0).standard_normal((3, 256)).astype(np.float32)
    (scaled,) = _session(repo, "normalise").run(None, {"X": x})
    (logits,) = _session(repo, "classifier").run(None, {"INPUT": scaled})
    (p,) = _session(repo, "softmax").run(None, {"L": logits})
    assert scaled.shape == (3, 256) and not np.allclose(scaled, x) and p.shape == (3, 10)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-5)
    for name in ("normalise", "classifier", "softmax"):
        cfg = _completed(repo, name)
        assert cfg.max_batch_size == 32 and cfg.HasField("dynamic_batching"), name


def test_the_encoder_runs_any_sequence_length_and_reads_its_mask(repo):
    sess = _session(repo, "encoder_nocfg")
    ids = np.arange(2 * 16, dtype=np.int64).reshape(2, 16) % user_models.VOCAB
    full = np.ones((2, 16), np.int64)
    logits, pooled = sess.run(None, {"input_ids": ids, "attention_mask": full})
    assert logits.shape == (2, 2) and pooled.shape == (2, user_models.HIDDEN)
    half = full.copy()
    half[:, 8:] = 0  # the last 8 tokens masked out: a different answer
    assert not np.allclose(sess.run(None, {"input_ids": ids, "attention_mask": half})[0], logits)
    long_ids = np.zeros((1, 128), np.int64)
    assert sess.run(None, {"input_ids": long_ids, "attention_mask": np.ones_like(long_ids)})[0].shape == (1, 2)


def test_the_mobilenet_classifies_a_batch_of_images(repo):
    (logits,) = _session(repo, "mobilenet").run(None, {"input": np.zeros((2, 3, 224, 224), np.float32)})
    assert logits.shape == (2, 1000)


def test_the_forest_votes_for_a_class_per_row(repo):
    x = np.random.default_rng(1).standard_normal((64, user_models.FOREST_FEATURES)).astype(np.float32)
    label, probabilities = _session(repo, "forest").run(None, {"X": x})
    assert label.shape == (64,) and probabilities.shape == (64, user_models.FOREST_CLASSES)
    assert np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-5) and np.all(label == probabilities.argmax(axis=1))
    assert len(set(label.tolist())) > 1  # the splits send rows different ways


def test_gt_serve_completes_their_configs_as_triton_would(repo):
    nocfg = _completed(repo, "encoder_nocfg")
    assert nocfg.max_batch_size == 4  # Triton's default for a model without config.pbtxt
    assert [(t.name, list(t.dims)) for t in nocfg.input] == [("input_ids", [-1]), ("attention_mask", [-1])]
    db = _completed(repo, "encoder_db")
    assert (db.max_batch_size, db.dynamic_batching.max_queue_delay_microseconds) == (16, 2000)
    mobilenet = _completed(repo, "mobilenet")
    assert mobilenet.max_batch_size == 8 and [list(t.dims) for t in mobilenet.output] == [[1000]]
    forest = _completed(repo, "forest")
    assert forest.max_batch_size == 4 and [list(t.dims) for t in forest.output] == [[1], [3]]
    assert forest.output[0].HasField("reshape") and not forest.output[1].HasField("reshape")


def test_the_classifiers_bf16_and_packed_twins_compute_what_it_computes(repo):
    """mlp_bf16 (BF16 in and out, through onnxruntime's OrtValues as gt-serve runs it) and mlp_packed (a directory
    with external data) are `classifier`; each loads in gt-serve with classifier's batching."""
    import ml_dtypes
    import onnxruntime as ort

    from tritonclient.grpc import model_config_pb2 as mc

    from gt_serve.backends.ort_tensors import bfloat16_run

    x = np.random.default_rng(1).standard_normal((4, 256)).astype(np.float32)
    (want,) = _session(repo, "classifier").run(None, {"INPUT": x})
    packed = ort.InferenceSession(str(repo / "mlp_packed" / "1" / "model.onnx" / "model.onnx"),
                                  providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(packed.run(None, {"INPUT": x})[0], want, rtol=1e-5, atol=1e-5)
    x16 = x.astype(ml_dtypes.bfloat16)
    (got,) = bfloat16_run(ort, _session(repo, "mlp_bf16"))(None, {"INPUT": x16})
    (want16,) = _session(repo, "classifier").run(None, {"INPUT": x16.astype(np.float32)})
    assert got.dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_allclose(got.astype(np.float32), want16, rtol=1e-2, atol=1e-2)  # bfloat16's 8 bits
    cfg = _completed(repo, "mlp_bf16")
    assert cfg.input[0].data_type == mc.TYPE_BF16 and cfg.max_batch_size == 32
