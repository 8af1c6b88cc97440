"""core/model_dir.py: Triton's checksum repository agent (MD5 of the model's files, checked before the load, with
Triton's messages), other agents refused, each version's model file (a file, or a directory holding model.onnx)
and the version policy's choice."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from gt_serve.core.model_config import parse_pbtxt
from gt_serve.core.model_dir import (model_files, model_footprint_bytes, run_repository_agents, version_model_files,
                                     versions_to_load)
from gt_serve.testing.feature_models import move_weights_out
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


def test_each_versions_model_file_is_a_file_or_a_directory_holding_model_onnx(model_dir):
    """Triton's onnxruntime backend: where VERSION/FILENAME is a directory, the model is FILENAME/model.onnx in it
    (beside its external data files). A version directory without a model file, or a name that is not a number,
    is no version."""
    mb.scale(model_dir / "2" / "model.onnx" / "model.onnx")
    (model_dir / "3" / "model.onnx").mkdir(parents=True)  # a directory without model.onnx
    (model_dir / "4").mkdir()
    mb.scale(model_dir / "v5" / "model.onnx")
    mb.scale(model_dir / "6" / "net.onnx")
    assert version_model_files(model_dir, "model.onnx") == {1: "1/model.onnx", 2: "2/model.onnx/model.onnx"}
    assert version_model_files(model_dir, "net.onnx") == {6: "6/net.onnx"}
    mb.scale(model_dir / "7" / "bundle" / "model.onnx")
    assert version_model_files(model_dir, "bundle") == {7: "7/bundle/model.onnx"}


def test_a_models_files_are_its_model_file_and_the_external_data_its_graph_names(tmp_path):
    """What a copy of a model needs (the placement loop sends them to a peer), and what it weighs."""
    plain, packed = tmp_path / "plain" / "model.onnx", tmp_path / "packed" / "model.onnx"
    mb.scale(plain)
    mb.scale(packed)
    move_weights_out(packed, "data/weights.bin")
    (packed.parent / "unrelated.txt").write_text("not the model's")
    assert model_files(plain, "m") == {"model.onnx": plain}
    assert model_files(packed, "m") == {"model.onnx": packed,
                                        "data/weights.bin": packed.parent / "data" / "weights.bin"}
    assert model_footprint_bytes(packed, "m") == packed.stat().st_size + 4  # one float of weights
    assert model_footprint_bytes(plain, "m") == plain.stat().st_size


def test_a_model_in_onnxruntimes_own_format_is_its_one_file(tmp_path):
    """An ORT-format file (onnxruntime saves one for edge devices) is no ONNX protobuf; it holds its weights."""
    import onnxruntime as ort

    source, saved = tmp_path / "model.onnx", tmp_path / "m" / "model.ort"
    mb.scale(source)
    saved.parent.mkdir()
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(saved)
    options.add_session_config_entry("session.save_model_format", "ORT")
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    assert model_files(saved, "m") == {"model.ort": saved}
    assert model_footprint_bytes(saved, "m") == saved.stat().st_size


def test_external_data_outside_the_models_directory_is_refused(tmp_path):
    import onnx

    path = tmp_path / "m" / "model.onnx"
    mb.scale(path)
    move_weights_out(path)
    model = onnx.load(str(path), load_external_data=False)
    (entry,) = [e for e in model.graph.initializer[0].external_data if e.key == "location"]
    entry.value = "../../elsewhere.bin"
    onnx.save(model, str(path))
    with pytest.raises(PathNotAllowed, match="external data file"):
        model_files(path, "m")
