"""verify_checksums: the `gt_file_sha256` load parameter (core/model_control.py)."""
from __future__ import annotations

import hashlib
import json

import pytest

from gt_serve.core.model_control import verify_checksums
from gt_serve.errors import InvalidArgument

FILES = {"file:1/model.onnx": b"onnx bytes", "file:1/extra.bin": b"weights"}
GOOD = {key: hashlib.sha256(data).hexdigest() for key, data in FILES.items()}


def test_matching_files_pass_in_either_form() -> None:
    verify_checksums("m", json.dumps(GOOD), FILES)
    verify_checksums("m", GOOD, FILES)
    verify_checksums("m", json.dumps(GOOD).encode(), FILES)
    verify_checksums("m", None, FILES)  # no checksums asked for: as before


@pytest.mark.parametrize("checksums, files, words", [
    ({**GOOD, "file:1/model.onnx": "0" * 64}, FILES, "'file:1/model.onnx' does not match its checksum"),
    ({"file:1/model.onnx": GOOD["file:1/model.onnx"]}, FILES, "'file:1/extra.bin' has no checksum"),
    ({**GOOD, "file:1/gone.bin": "ab"}, FILES, "names 'file:1/gone.bin', which was not sent"),
    ("not json", FILES, "must be a JSON object"),
    ([1, 2], FILES, "must be a JSON object"),
    ({"file:1/model.onnx": 5}, FILES, "must be a JSON object"),
])
def test_a_mismatch_is_refused_naming_the_file(checksums, files, words) -> None:
    with pytest.raises(InvalidArgument, match="failed to load 'm'") as info:
        verify_checksums("m", json.dumps(checksums) if isinstance(checksums, (dict, list)) else checksums, files)
    assert words in info.value.message
