"""bench/model_analyzer_run.py's Model Analyzer profile config (the run itself needs Model Analyzer's own venv and
minutes of perf_analyzer; the README's Benchmarks section has the command and what it measured)."""
from __future__ import annotations

import importlib.util
import json
import urllib.request
from pathlib import Path

import yaml

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "model_analyzer_run.py"


def load():
    spec = importlib.util.spec_from_file_location("model_analyzer_run", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_model_is_profiled_cpu_only():
    config = yaml.safe_load(load().profile_config(["mlp", "convnet"]))
    assert config == {"profile_models": {"mlp": {"cpu_only": True}, "convnet": {"cpu_only": True}}}


def test_an_ensembles_step_models_are_its_composing_models(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "config.pbtxt").write_text('name: "plain" max_batch_size: 8')
    (tmp_path / "noconfig").mkdir()
    (tmp_path / "ens").mkdir()
    steps = "".join(f'{{ model_name: "{m}" model_version: -1 input_map {{ key: "X" value: "x" }} '
                    f'output_map {{ key: "Y" value: "y" }} }},' for m in ("pre", "net", "pre"))
    (tmp_path / "ens" / "config.pbtxt").write_text(
        f'name: "ens" platform: "ensemble" ensemble_scheduling {{ step [ {steps.rstrip(",")} ] }}')
    assert load().composing_models(tmp_path, ["plain", "noconfig", "ens"]) == ["pre", "net"]


def test_the_wrapper_runs_gt_serve_with_the_flags_model_analyzer_gives_triton(tmp_path):
    """Model Analyzer's local mode starts `tritonserver --model-repository R --model-control-mode explicit --http-port
    P --grpc-port P --metrics-port P --metrics-interval-ms 1000 --strict-model-config false` (its own ports here: free
    ones, from the launcher)."""
    from gt_serve.testing import model_builders as mb
    from gt_serve.testing.launcher import launch

    mb.scale(tmp_path / "repo" / "scaled" / "1" / "model.onnx")
    wrapper = load().server_wrapper(tmp_path)
    server = launch(["--model-repository", str(tmp_path / "repo"), "--model-control-mode", "explicit",
                     "--metrics-interval-ms", "1000", "--strict-model-config", "false"],
                    workdir=tmp_path, command=[str(wrapper)])
    try:
        with urllib.request.urlopen(f"http://{server.http_url}/v2/repository/index", data=b"{}", timeout=30) as r:
            assert [m["name"] for m in json.load(r)] == ["scaled"]  # explicit mode: on disk, not loaded
    finally:
        assert server.stop() == 0
