"""bench/perf_repo.py: perf_sweep over a repository of the user's own models. The configs gt-serve completes become
Triton Python-backend configs with the same tensors and batching, and raw onnxruntime is fed every input of any model
(issue #17: "with models and configs of our own")."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import perf_repo  # noqa: E402
import perf_sweep  # noqa: E402

from gt_serve.core.model_config import parse_pbtxt  # noqa: E402
from gt_serve.testing import model_builders as mb  # noqa: E402
from gt_serve.testing.feature_models import bf16_scale, move_weights_out  # noqa: E402

GATHER_CONFIG = """name: "lookup"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INDICES" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1, 3 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
dynamic_batching { max_queue_delay_microseconds: 300 }
"""


ENSEMBLE_CONFIG = """name: "lookup_ens"
platform: "ensemble"
max_batch_size: 4
input [ { name: "I" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "ROWS" data_type: TYPE_FP32 dims: [ 1, 3 ] } ]
ensemble_scheduling { step [ { model_name: "lookup" model_version: -1
  input_map { key: "INDICES" value: "I" } output_map { key: "OUTPUT" value: "ROWS" } } ] }
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("own_repo")
    mb.gather(root / "lookup" / "1" / "model.onnx", np.arange(12, dtype=np.float32).reshape(4, 3))
    (root / "lookup" / "config.pbtxt").write_text(GATHER_CONFIG)
    mb.add_pair(root / "pair" / "2" / "model.onnx", width=5)  # no config: gt-serve completes it
    mb.add_one_fixed(root / "fixed" / "1" / "model.onnx", width=3)
    (root / "lookup_ens" / "1").mkdir(parents=True)  # an ensemble: a config and an empty version folder
    (root / "lookup_ens" / "config.pbtxt").write_text(ENSEMBLE_CONFIG)
    (root / "notes").mkdir()  # not a model
    mb.scale(root / "packed" / "1" / "model.onnx" / "model.onnx")  # a directory with external data, as Triton's
    move_weights_out(root / "packed" / "1" / "model.onnx" / "model.onnx")  # onnxruntime backend takes one
    bf16_scale(root / "bf16" / "1" / "model.onnx")  # BF16 tensors: onnxruntime takes them only as OrtValues
    return root


@pytest.fixture(scope="module")
def configs(repo, tmp_path_factory) -> dict:
    return perf_repo.completed_configs(repo, perf_repo.repository_models(repo), tmp_path_factory.mktemp("run"), None)


def test_the_repositorys_models_are_the_folders_with_an_onnx_version_and_the_ensembles(repo):
    assert perf_repo.repository_models(repo) == ["bf16", "fixed", "lookup", "lookup_ens", "packed", "pair"]
    assert perf_sweep.model_file(repo, "pair") == repo / "pair" / "2" / "model.onnx"
    assert perf_sweep.model_file(repo, "packed") == repo / "packed" / "1" / "model.onnx" / "model.onnx"


def test_tritons_config_has_the_same_tensors_and_batching_on_the_python_backend(configs):
    lookup = parse_pbtxt(perf_repo.triton_pbtxt(configs["lookup"]), "lookup")
    assert (lookup.backend, lookup.platform, lookup.max_batch_size) == ("python", "", 8)
    assert [(t.name, list(t.dims)) for t in lookup.input] == [("INDICES", [1])]
    assert [(t.name, list(t.dims)) for t in lookup.output] == [("OUTPUT", [1, 3])]
    assert lookup.dynamic_batching.max_queue_delay_microseconds == 300
    assert [(g.kind, g.count) for g in lookup.instance_group] == [(lookup.instance_group[0].KIND_CPU, 2)]
    pair = parse_pbtxt(perf_repo.triton_pbtxt(configs["pair"]), "pair")  # completed from the graph
    assert [t.name for t in pair.input] == ["A", "B"] and pair.max_batch_size == configs["pair"]["max_batch_size"] > 0
    assert all(g.count >= 1 and g.kind == g.KIND_CPU for g in pair.instance_group)


def test_the_mirror_holds_each_version_with_the_generic_python_model(repo, configs, tmp_path):
    out = perf_repo.triton_mirror(repo, tmp_path / "mirror", configs)
    assert (out / "pair" / "2" / "model.onnx").resolve() == (repo / "pair" / "2" / "model.onnx").resolve()
    assert (out / "pair" / "2" / "model.py").read_text() == (BENCH / "triton_onnx_model.py").read_text()
    assert 'backend: "python"' in (out / "lookup" / "config.pbtxt").read_text()
    packed = out / "packed" / "1"  # the version's every entry, so that the external data lies beside the model
    assert sorted(e.name for e in packed.iterdir()) == ["model.onnx", "model.py"]
    assert sorted(e.name for e in (packed / "model.onnx").iterdir()) == ["model.onnx", "weights.bin"]


def test_an_ensemble_stays_an_ensemble_for_triton_with_its_steps_beside_it(repo, configs, tmp_path):
    assert perf_repo.with_steps(repo, ["lookup_ens", "pair"]) == ["lookup_ens", "pair", "lookup"]
    steps_too = perf_repo.completed_configs(repo, ["lookup_ens"], tmp_path, None)
    assert sorted(steps_too) == ["lookup", "lookup_ens"]  # gt-serve loads the step with it; Triton needs it too
    ens = parse_pbtxt(perf_repo.triton_pbtxt(configs["lookup_ens"]), "lookup_ens")
    assert (ens.platform, ens.backend, ens.max_batch_size) == ("ensemble", "", 4)
    assert [s.model_name for s in ens.ensemble_scheduling.step] == ["lookup"]
    out = perf_repo.triton_mirror(repo, tmp_path / "mirror", steps_too)
    assert list((out / "lookup_ens" / "1").iterdir()) == [] and (out / "lookup" / "1" / "model.py").is_file()
    assert perf_repo.raw_inputs(configs["lookup_ens"], {}) is None  # no one ONNX file for raw onnxruntime


def test_raw_onnxruntime_is_fed_every_input_at_each_batch(repo, configs):
    for name, batch in (("lookup", 8), ("pair", 3), ("fixed", 1), ("packed", 2), ("bf16", 2)):
        feed, batches = perf_repo.raw_inputs(configs[name], {})
        point = perf_sweep.raw_point(perf_sweep.model_file(repo, name), feed, batch, 1, 0.05)
        assert point["runs"] > 0 and point["batch"] == batch
    lookup_feed, lookup_batches = perf_repo.raw_inputs(configs["lookup"], {})
    assert lookup_batches == (8,)  # batch 8 and max_batch_size 8
    assert lookup_feed(8)["INDICES"].shape == (8, 1) and not lookup_feed(8)["INDICES"].any()  # zeros: in range
    assert perf_repo.raw_inputs(configs["fixed"], {})[1] == (1,)  # a model that does not batch
    assert perf_repo.raw_inputs(configs["fixed"], {})[0](1)["INPUT"].shape == (3,)
    assert perf_repo.raw_inputs(configs["bf16"], {})[0](2)["INPUT"].any()  # noise, not zeros, for a BF16 input


def test_variable_dimensions_take_perf_analyzers_shape_arguments():
    config = {"max_batch_size": 4, "input": [{"name": "TOKENS", "data_type": "TYPE_INT32", "dims": ["-1"]},
                                             {"name": "TEXT", "data_type": "TYPE_FP16", "dims": [2, -1]}]}
    shapes = perf_repo.shapes_given(["--input-data", "zero", "--shape", "TOKENS:128", "--shape=TEXT:2,7"])
    assert shapes == {"TOKENS": [128], "TEXT": [2, 7]}
    feed = perf_repo.raw_inputs(config, shapes)[0](4)
    assert (feed["TOKENS"].shape, feed["TOKENS"].dtype) == ((4, 128), np.int32)
    assert (feed["TEXT"].shape, feed["TEXT"].dtype) == ((4, 2, 7), np.float16)
    assert perf_repo.raw_inputs(config, {})[0](1)["TOKENS"].shape == (1, 1)  # not given: 1
    strings = {"max_batch_size": 0, "input": [{"name": "S", "data_type": "TYPE_STRING", "dims": [1]}]}
    assert perf_repo.raw_inputs(strings, {}) is None


def test_a_models_own_perf_analyzer_arguments_are_its_alone():
    errors = []
    given = ["enc=--shape TOKENS:128 --input-data zero", "enc=--shape=TEXT:2,7", "img=-b 2"]
    per_model = perf_repo.model_pa_args(given, ["enc", "img", "mlp"], errors.append)
    assert per_model == {"enc": ["--shape", "TOKENS:128", "--input-data", "zero", "--shape=TEXT:2,7"],
                         "img": ["-b", "2"]} and not errors
    assert perf_repo.shapes_given(per_model["enc"]) == {"TOKENS": [128], "TEXT": [2, 7]}
    perf_repo.model_pa_args(["nope=-b 2", "enc"], ["enc"], errors.append)
    assert len(errors) == 2 and all("MODEL=ARGS" in e for e in errors)
