"""gt_serve/testing/model_builders: what bench/perf_sweep's `image` and `tiny` models compute."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

from gt_serve.testing import model_builders as mb

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import perf_sweep  # noqa: E402


def test_image_head_is_each_channels_mean_times_its_matrix(tmp_path):
    path = tmp_path / "image.onnx"
    mb.image_head(path, channels=3, classes=10, seed=1)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    w = np.random.default_rng(1).standard_normal((3, 10)).astype(np.float32)
    for shape in ((2, 3, 224, 224), (1, 3, 8, 5)):  # any image size
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        (out,) = session.run(None, {"INPUT": x})
        assert out.shape == (shape[0], 10)
        np.testing.assert_allclose(out, x.mean(axis=(2, 3)) @ w, rtol=1e-4, atol=1e-5)


def test_perf_sweeps_tiny_model_is_mlps_input_and_output_with_one_layer(tmp_path):
    sessions = {}
    for name in ("tiny", "mlp"):
        _, build = perf_sweep.MODELS[name]
        build(tmp_path / f"{name}.onnx")
        sessions[name] = ort.InferenceSession(str(tmp_path / f"{name}.onnx"), providers=["CPUExecutionProvider"])
    assert perf_sweep.MODELS["tiny"][0] == perf_sweep.MODELS["mlp"][0]
    for side in ("get_inputs", "get_outputs"):
        tiny, mlp = (getattr(sessions[n], side)() for n in ("tiny", "mlp"))
        assert [(a.name, a.shape[1:], a.type) for a in tiny] == [(a.name, a.shape[1:], a.type) for a in mlp]
    x = np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32)
    (out,) = sessions["tiny"].run(None, {"INPUT": x})
    rng = np.random.default_rng(0)  # model_builders.mlp's first layer: its weights, zero bias, no ReLU after it
    w = (rng.standard_normal((256, 10)) / np.sqrt(256)).astype(np.float32)
    np.testing.assert_allclose(out, x @ w, rtol=1e-4, atol=1e-5)
