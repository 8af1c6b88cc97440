"""gt_serve/testing/model_builders.image_head: what bench/perf_sweep's `image` model computes."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort

from gt_serve.testing import model_builders as mb


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
