"""Path confinement for the model repository: plain names, relative paths, symlinks, the upload area."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from gt_serve.testing import model_builders as mb
from gt_serve.backends.onnx_runner import describe_model
from gt_serve.core.model_config import MAX_LABEL_FILE_BYTES, read_labels
from gt_serve.core.registry import ModelRegistry
from gt_serve.core.repository_paths import (UPLOAD_PREFIX, UploadArea, check_config_paths, confine, is_plain_name,
                                            relative_parts)
from gt_serve.errors import Code, ConfigError, InvalidArgument, InvalidModelFile, PathNotAllowed

OUTSIDE_MSG = "must be a relative path inside the model directory"


@pytest.mark.parametrize("name", ["simple", "model-1.v2", "a b", "ÜNICODE", "x" * 255])
def test_plain_names(name):
    assert is_plain_name(name)


@pytest.mark.parametrize("name", ["", ".", "..", ".hidden", "../x", "a/b", "/tmp", "a\\b", "a\x00b", "a\nb",
                                  "x" * 256, "é" * 128])
def test_names_that_are_not_plain(name):
    assert not is_plain_name(name)


@pytest.mark.parametrize("value, parts", [("labels.txt", ("labels.txt",)), ("1/model.onnx", ("1", "model.onnx")),
                                          ("./a//b", ("a", "b"))])
def test_relative_parts(value, parts):
    assert relative_parts(value) == parts


@pytest.mark.parametrize("value", ["", ".", "/etc/passwd", "../x", "a/../../x", "a/..", "..\\x", "a\x00", "//x"])
def test_relative_parts_refused(value):
    assert relative_parts(value) is None


def test_confine_follows_symlinks_and_answers_alike(tmp_path):
    model_dir, outside = tmp_path / "repo" / "m", tmp_path / "outside"
    (model_dir / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret").write_text("s")
    (model_dir / "labels.txt").write_text("a\n")
    (model_dir / "inside_link").symlink_to(model_dir / "labels.txt")
    (model_dir / "out_link").symlink_to(outside / "secret")
    (model_dir / "out_dir").symlink_to(outside)
    (model_dir / "dangling_out").symlink_to(outside / "missing")
    assert confine(model_dir, "labels.txt", model="m", what="label_filename") == (model_dir / "labels.txt").resolve()
    assert confine(model_dir, "inside_link", model="m", what="label_filename") == (model_dir / "labels.txt").resolve()
    assert confine(model_dir, "sub/not_yet", model="m", what="x") == (model_dir / "sub" / "not_yet").resolve()
    messages = set()
    for value in ("out_link", "out_dir/secret", "out_dir/missing", "dangling_out", str(outside / "secret"),
                  str(outside / "missing"), "../../outside/secret", "../../outside/missing"):
        with pytest.raises(PathNotAllowed) as info:
            confine(model_dir, value, model="m", what="label_filename")
        assert info.value.code is Code.INVALID_ARGUMENT and isinstance(info.value, InvalidArgument)
        messages.add(str(info.value).replace(value, "<v>"))
    assert messages == {f"model 'm': label_filename '<v>' {OUTSIDE_MSG}"}


def test_confine_in_a_symlinked_model_directory(tmp_path):
    real = tmp_path / "store" / "m"
    real.mkdir(parents=True)
    (real / "labels.txt").write_text("a\n")
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "m").symlink_to(real)  # the operator's link: its target is the model directory
    assert confine(tmp_path / "repo" / "m", "labels.txt", model="m", what="l") == (real / "labels.txt").resolve()


def test_read_labels(tmp_path):
    (tmp_path / "labels.txt").write_text("a\nb\n")
    assert read_labels(tmp_path, "labels.txt", "m") == ["a", "b"]
    os.mkfifo(tmp_path / "fifo")  # refused at once, not waited on
    with pytest.raises(ConfigError, match="cannot be read"):
        read_labels(tmp_path, "fifo", "m")
    with pytest.raises(PathNotAllowed, match=OUTSIDE_MSG):
        read_labels(tmp_path, "/etc/passwd", "m")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="label file 'latin1.txt' is not UTF-8 text"):
        read_labels(tmp_path, "latin1.txt", "m")
    with open(tmp_path / "huge.txt", "wb") as fh:  # sparse: one byte over the bound
        fh.truncate(MAX_LABEL_FILE_BYTES + 1)
    with pytest.raises(ConfigError, match=f"label_filename is larger than {MAX_LABEL_FILE_BYTES} bytes"):
        read_labels(tmp_path, "huge.txt", "m")


def test_check_config_paths_covers_every_file_field():
    fields = {
        "default_model_filename": lambda c, v: setattr(c, "default_model_filename", v),
        "label_filename": lambda c, v: setattr(c.output.add(name="o"), "label_filename", v),
        "cc_model_filenames": lambda c, v: c.cc_model_filenames.__setitem__("8.0", v),
        "input_data_file": lambda c, v: setattr(c.model_warmup.add(name="w").inputs["x"], "input_data_file", v),
    }
    for what, put in fields.items():
        good = mc.ModelConfig()
        put(good, "ok/file.bin")
        check_config_paths(good, "m")
        for bad in ("/etc/passwd", "../x"):
            cfg = mc.ModelConfig()
            put(cfg, bad)
            with pytest.raises(PathNotAllowed, match=OUTSIDE_MSG):
                check_config_paths(cfg, "m")


def test_upload_area_writes_refuses_and_cleans(tmp_path):
    area = UploadArea(tmp_path)
    d = area.write("m", {"file:1/model.onnx": b"x", "file:labels.txt": b"a"})
    assert (d / "1" / "model.onnx").read_bytes() == b"x" and d.parent == area.root
    assert oct(area.root.stat().st_mode & 0o777) == "0o700"
    area.remove(d)
    assert not d.exists()
    for files in ({"file:../x": b"x"}, {"file:/tmp/x": b"x"}, {"file:": b"x"},
                  {"file:a": b"x", "file:a/b": b"y"},  # a file where a directory must go: refused, cleaned
                  {"file:a": b"x", "file:./a": b"y"}):
        with pytest.raises(PathNotAllowed):
            area.write("m", files)
        assert list(area.root.iterdir()) == []
    assert not (tmp_path / "x").exists()
    area.remove(tmp_path)  # outside the area: left alone
    assert tmp_path.is_dir()
    area.close()
    assert area.root is None and list(tmp_path.iterdir()) == []


def test_sweep_removes_only_dead_processes_areas(tmp_path):
    pid = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                             text=True, timeout=30, check=True).stdout)
    dead = tmp_path / f"{UPLOAD_PREFIX}{pid}_123_abc"
    (dead / "load_1").mkdir(parents=True)
    reused = tmp_path / f"{UPLOAD_PREFIX}{os.getpid()}_1_abc"  # this pid, another start time: a previous life
    reused.mkdir()
    live = UploadArea(tmp_path)
    live.write("m", {"file:a": b"x"})
    other = tmp_path / f"{UPLOAD_PREFIX}x_y"
    other.mkdir()
    link = tmp_path / f"{UPLOAD_PREFIX}{pid}_9_link"
    link.symlink_to(other)
    removed = UploadArea(tmp_path).sweep_stale()
    assert sorted(removed) == sorted([dead, reused])
    assert live.root.is_dir() and other.is_dir() and link.is_symlink()
    live.close()


def test_registry_garbage_onnx_and_names(tmp_path):
    class NoHost:
        def open(self, model):
            raise AssertionError("never reached")

        async def close(self, model, drain_timeout_s):
            pass

    (tmp_path / "repo" / "bad" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "bad" / "1" / "model.onnx").write_bytes(b"not onnx")
    mb.scale(tmp_path / "outside" / "1" / "model.onnx")

    async def main():
        reg = ModelRegistry(tmp_path / "repo", describe_model, NoHost(), uploads=UploadArea(tmp_path / "up"))
        with pytest.raises(InvalidModelFile, match="failed to load 'bad': model 'bad': '1/model.onnx' is not a valid"):
            await reg.load("bad")
        row = {r["name"]: r for r in reg.index()}["bad"]
        assert row["state"] == "UNAVAILABLE" and "not a valid ONNX model" in row["reason"]
        assert str(tmp_path) not in row["reason"]
        with pytest.raises(InvalidModelFile):
            await reg.load("up", "{}", {"file:1/model.onnx": b"junk"})
        assert list((tmp_path / "up").rglob("model.onnx")) == []
        answers = set()
        for name in ("nope", "../outside", "..", str(tmp_path / "outside")):
            for verb in (reg.load, reg.unload):
                with pytest.raises(InvalidArgument) as info:
                    await verb(name)
                answers.add(str(info.value).replace(f"'{name}'", "'<n>'"))
        assert answers == {"failed to load '<n>': no model directory '<n>' in the repository",
                           "failed to unload '<n>': unknown model"}
        assert "../outside" not in reg.names()
        await reg.close_all()
        assert list((tmp_path / "up").iterdir()) == []
    asyncio.run(main())


def test_split_refuses_label_files_outside(tmp_path):
    from gt_serve.tools.shard import ShardError, split_model

    model_dir = tmp_path / "src" / "mlp"
    mb.mlp(model_dir / "1" / "model.onnx", sizes=(16, 32, 4))
    (tmp_path / "secret.txt").write_text("secret\n")
    for label in ("../../secret.txt", str(tmp_path / "secret.txt")):
        (model_dir / "config.pbtxt").write_text(
            'name: "mlp"\nmax_batch_size: 16\n'
            f'output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "{label}" }} ]\n')
        with pytest.raises(ShardError, match=OUTSIDE_MSG):
            split_model(model_dir / "1" / "model.onnx", [("h0",)], "m", tmp_path / "repo")
        assert not (tmp_path / "repo").exists()  # refused before anything was written
