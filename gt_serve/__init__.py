"""gt_serve: an embedded KServe V2 / Triton-compatible inference server for ONNX models."""

__version__ = "0.1.0"
