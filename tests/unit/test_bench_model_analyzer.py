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
