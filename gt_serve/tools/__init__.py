"""Offline tools over core, outside the server's layers (`python -m gt_serve.tools.<name>`):

  sim     discrete-event fleet simulator: routing policies compared on one scenario (gt-serve-sim)
  shard   split an ONNX model into pipeline stages at intermediate tensors (gt-serve-shard)

The server never imports them (import-linter contract "tools" in pyproject.toml).
"""
