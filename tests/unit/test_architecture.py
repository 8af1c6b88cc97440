"""The architecture as a contract (DESIGN.md §2 and §8, issue #12).

- Layers and forbidden imports: `[tool.importlinter]` in pyproject.toml, checked by the real
  `lint-imports` (import-linter) in a subprocess. It replaces the ast walk of the former
  tests/unit/test_layers.py: one contract, in one place, that also sees indirect imports and cycles.
- Every top-level module of the package is placed by that contract (in a layer, the foundation or
  the tools outside the layers), so a new package cannot slip past it.
- Accelerator libraries are imported lazily: importing the server does not load them.
- Size budget: modules <= 400 lines, functions <= 40 lines, except the entries listed below with a
  reason. Every violation is reported at once; an entry that fits again must be removed.
"""
from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib  # Python 3.11+
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    tomllib = None

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "gt_serve"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 40
SUBPROCESS_TIMEOUT_S = 120

# path relative to gt_serve/ -> why it may exceed MAX_MODULE_LINES for now
MODULE_EXCEPTIONS: dict[str, str] = {  # none today: every module is within the budget
}

# "path::Qualified.name" -> why the function may exceed MAX_FUNCTION_LINES for now
FUNCTION_EXCEPTIONS: dict[str, str] = {
    "backends/onnx_runner.py::OnnxRunner.__init__": "session options, providers and warm-up in one constructor; "
                                                     "extract the provider choice",
    "core/request_checks.py::check_inputs": "hot path: every input check in one frame, on purpose "
                                            "(a call per check costs per request)",
    "datatypes.py::array_from_list": "one branch per V2 datatype family; a table would read better",
    "edge/telemetry.py::TelemetryAgent.__init__": "many typed settings; candidates for a settings dataclass",
    "testing/launcher.py::launch": "test/bench helper outside the layers: spawn, wait for the port file, report",
    "protocol/grpc_codec.py::request_from_proto": "hot path decode of a ModelInferRequest in one frame, on purpose",
    "protocol/http_infer.py::decode_request": "hot path JSON/binary request decode in one frame, on purpose",
    "protocol/http_infer.py::_decode_input": "hot path: one input's datatype/shape/binary checks in one frame",
    "protocol/http_infer.py::encode_response": "hot path: JSON and binary-extension encoding in one frame",
    "protocol/http_server.py::_Connection._run": "the connection's read/parse/dispatch loop with its timeouts, in one frame",
    "protocol/metrics.py::ServerCollector.collect": "one Prometheus family after another; split per family group",
    "tools/sim/engine.py::FleetSim.__init__": "simulator set-up outside the layers; many scenario knobs",
}

CONTRACT_PLACES = ("layers", "foundation", "tools")  # contracts whose modules, together, place every module


def lint_imports_command() -> list[str]:
    beside = Path(sys.executable).with_name("lint-imports")
    found = str(beside) if beside.exists() else shutil.which("lint-imports")
    assert found, "lint-imports not found: pip install -e '.[test]' (import-linter)"
    return [found, "--no-cache"]


def test_import_contracts_hold():
    result = subprocess.run(lint_imports_command(), cwd=ROOT, capture_output=True, text=True, check=False,
                            timeout=SUBPROCESS_TIMEOUT_S)
    report = result.stdout[result.stdout.find("Contracts"):] + result.stderr
    assert result.returncode == 0, f"lint-imports failed (pyproject.toml [tool.importlinter]):\n{report}"
    assert "0 broken" in result.stdout, report


def importlinter_config() -> dict:
    if tomllib is None:
        pytest.skip("reading pyproject.toml needs tomllib (Python 3.11+)")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def placed_modules(config: dict) -> set[str]:
    contracts = {c["id"]: c for c in config["contracts"]}
    names: set[str] = set()
    for layer in contracts["layers"]["layers"]:
        names.update(part.strip() for part in layer.replace(":", "|").split("|"))
    for contract in ("foundation", "tools"):
        names.update(contracts[contract]["source_modules"])
        names.update(contracts[contract]["forbidden_modules"])
    return names


def top_level_modules() -> set[str]:
    out = set()
    for path in PKG.iterdir():
        if path.suffix == ".py" and path.stem not in ("__init__", "__main__"):
            out.add(f"gt_serve.{path.stem}")
        elif path.is_dir() and (path / "__init__.py").is_file():
            out.add(f"gt_serve.{path.name}")
    return out


def test_every_top_level_module_is_placed_by_the_contract():
    config = importlinter_config()
    assert config["root_package"] == "gt_serve"
    unplaced = sorted(top_level_modules() - placed_modules(config))
    assert not unplaced, (f"{unplaced} are in no layer, not in the foundation and not listed as a tool: "
                          "place them in [tool.importlinter] (pyproject.toml)")


def test_importing_the_server_loads_no_accelerator_library():
    """backends import onnxruntime / cupy / pynvml lazily: the server's modules import without them."""
    modules = ["gt_serve.cli", "gt_serve.app"] + sorted(
        "gt_serve." + ".".join(p.relative_to(PKG).with_suffix("").parts)
        for layer in ("core", "execution") for p in (PKG / layer).glob("*.py") if p.stem != "__init__")
    script = ("import importlib, json, sys\n"
              f"for m in {modules!r}: importlib.import_module(m)\n"
              "print(json.dumps(sorted(m for m in ('onnxruntime', 'cupy', 'pynvml') if m in sys.modules)))")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=False,
                            timeout=SUBPROCESS_TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


# -- size budget ----------------------------------------------------------------------------------
def functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, lines) of every function, nested ones included, in source order."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}{node.name}"
            yield name, node.end_lineno - node.lineno + 1
            yield from functions(node, name + ".")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")
        else:
            yield from functions(node, prefix)


def size_violations() -> tuple[dict[str, int], dict[str, int]]:
    modules, funcs = {}, {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            modules[rel] = lines
        for name, length in functions(ast.parse(text, filename=str(path))):
            if length > MAX_FUNCTION_LINES:
                funcs[f"{rel}::{name}"] = length
    return modules, funcs


def test_modules_and_functions_fit_the_size_budget():
    modules, funcs = size_violations()
    over = [f"module   {k}: {n} lines > {MAX_MODULE_LINES}" for k, n in modules.items() if k not in MODULE_EXCEPTIONS]
    over += [f"function {k}: {n} lines > {MAX_FUNCTION_LINES}" for k, n in funcs.items() if k not in FUNCTION_EXCEPTIONS]
    assert not over, ("over the size budget (split them, or list them in tests/unit/test_architecture.py "
                      "with a reason):\n  " + "\n  ".join(over))


def test_every_size_exception_is_still_needed():
    modules, funcs = size_violations()
    stale = [k for k in MODULE_EXCEPTIONS if k not in modules] + [k for k in FUNCTION_EXCEPTIONS if k not in funcs]
    assert not stale, "within the budget again (or gone): remove from the exception lists:\n  " + "\n  ".join(stale)


def test_the_size_budget_sees_nested_functions_and_methods():
    tree = ast.parse("class A:\n    def f(self):\n        def g():\n            pass\n        return g\n"
                     "async def h():\n    pass\n")
    assert list(functions(tree)) == [("A.f", 4), ("A.f.g", 2), ("h", 2)]
