"""core/model_dir.py: Triton's checksum repository agent (MD5 of the model's files, checked before the load, with
Triton's messages), other agents refused, and the version policy's choice."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from gt_serve.core.model_config import parse_pbtxt
from gt_serve.core.model_dir import run_repository_agents, versions_to_load
from gt_serve.errors import ConfigError, InvalidArgument, PathNotAllowed, Unsupported
from gt_serve.testing import model_builders as mb


@pytest.fixture
def model_dir(tmp_path) -> Path:
    mb.scale(tmp_path / "m" / "1" / "model.onnx")
    (tmp_path / "m" / "vocab.txt").write_text("a\nb\n")
    return tmp_path / "m"


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _agents(*pairs: tuple[str, str], name: str = "checksum") -> mc.ModelConfig:
    params = "".join(f' parameters {{ key: "{k}" value: "{v}" }}' for k, v in pairs)
    return parse_pbtxt(f'name: "m"\nmodel_repository_agents {{ agents [ {{ name: "{name}"{params} }} ] }}\n', "test")


def test_matching_digests_pass(model_dir):
    run_repository_agents(_agents(("MD5:1/model.onnx", _md5(model_dir / "1" / "model.onnx")),
                                  ("md5:vocab.txt", _md5(model_dir / "vocab.txt"))), model_dir, "m")
    run_repository_agents(parse_pbtxt('name: "m"\n', "test"), model_dir, "m")  # no agent: nothing to check


def test_a_changed_file_fails_with_tritons_message(model_dir):
    good = _md5(model_dir / "vocab.txt")
    (model_dir / "vocab.txt").write_text("a\nb\nc\n")
    with pytest.raises(InvalidArgument, match=f"Mismatched MD5 hash for file vocab.txt, expect: {good}, got: "
                                              f"{_md5(model_dir / 'vocab.txt')}"):
        run_repository_agents(_agents(("MD5:vocab.txt", good)), model_dir, "m")


@pytest.mark.parametrize("key, error, message", [
    ("vocab.txt", InvalidArgument, "failed to parse key: vocab.txt"),
    ("SHA256:vocab.txt", Unsupported, "Unsupported checksum algorithm: SHA256"),
    ("MD5:missing.txt", InvalidArgument, "failed to open file for read missing.txt"),
    ("MD5:1", InvalidArgument, "failed to open file for read 1"),  # a directory
    ("MD5:../outside.txt", PathNotAllowed, "must be a relative path inside the model directory"),
    ("MD5:/etc/hostname", PathNotAllowed, "must be a relative path inside the model directory"),
])
def test_bad_keys_and_files_are_named(model_dir, key, error, message):
    (model_dir.parent / "outside.txt").write_text("x")
    with pytest.raises(error, match=message.replace(".", r"\.")):
        run_repository_agents(_agents((key, "0" * 32)), model_dir, "m")


def test_a_fifo_is_refused_without_waiting(model_dir):
    os.mkfifo(model_dir / "pipe")
    with pytest.raises(InvalidArgument, match="failed to open file for read pipe"):
        run_repository_agents(_agents(("MD5:pipe", "0" * 32)), model_dir, "m")


def test_another_agent_is_refused_naming_it(model_dir):
    with pytest.raises(ConfigError, match="repository agent 'relocation' is not supported"):
        run_repository_agents(_agents(name="relocation"), model_dir, "m")


def test_the_version_policy_picks_the_versions():
    available = [3, 2, 1]
    assert versions_to_load(mc.ModelConfig(), available) == [3]
    assert versions_to_load(parse_pbtxt("version_policy { all { } }", "t"), available) == [3, 2, 1]
    assert versions_to_load(parse_pbtxt("version_policy { latest { num_versions: 2 } }", "t"), available) == [3, 2]
    assert versions_to_load(parse_pbtxt("version_policy { specific { versions: [1, 3] } }", "t"), available) == [3, 1]
    with pytest.raises(InvalidArgument, match=r"versions \[4\] named by the version policy are missing"):
        versions_to_load(parse_pbtxt("version_policy { specific { versions: [4] } }", "t"), available)
