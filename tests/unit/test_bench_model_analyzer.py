"""bench/model_analyzer_run.py's Model Analyzer profile config (the run itself needs Model Analyzer's own venv and
minutes of perf_analyzer; the README's Benchmarks section has the command and what it measured)."""
from __future__ import annotations

import importlib.util
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
