"""V2 parameter maps (map<string, InferParameter | ModelRepositoryParameter>) <-> Python values.

Foundation: both gRPC sides use it, the server's codec (protocol/grpc_codec.py) and the peer client that
forwards requests to other nodes (edge/peer_client.py), which may not import each other.
"""
from __future__ import annotations

from typing import Any

import numpy as np


def params_from_proto(params) -> dict[str, Any]:
    """map<string, InferParameter | ModelRepositoryParameter> -> {key: python value}."""
    if not params:
        return {}
    out: dict[str, Any] = {}
    for key, value in params.items():
        choice = value.WhichOneof("parameter_choice")
        out[key] = getattr(value, choice) if choice is not None else None
    return out


def fill_params(target, params: dict[str, Any]) -> None:
    """Write {key: value} into a map<string, InferParameter> field."""
    for key, value in params.items():
        slot = target[key]
        if isinstance(value, bool):
            slot.bool_param = value
        elif isinstance(value, (int, np.integer)):
            value = int(value)
            if value > 0x7FFFFFFFFFFFFFFF:
                slot.uint64_param = value
            else:
                slot.int64_param = value
        elif isinstance(value, (float, np.floating)):
            slot.double_param = float(value)
        elif isinstance(value, (bytes, bytearray)):
            slot.string_param = bytes(value).decode("utf-8", "replace")
        else:
            slot.string_param = str(value)
