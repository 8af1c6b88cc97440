"""Dependency direction (DESIGN.md §2): cli -> app -> {protocol, edge} -> core -> execution -> backends.

Every layer may use the foundation (config, errors, types, datatypes). Checked on the source with ast.
"""
import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "gt_serve"

LAYERS = ["cli", "app", "protocol", "edge", "core", "execution", "backends"]
RANK = {"cli": 0, "app": 1, "protocol": 2, "edge": 2, "sim": 2, "core": 3, "execution": 4, "backends": 5}
# third-party packages that only some layers may import
HEAVY = {"onnxruntime": {"backends"}, "cupy": {"backends", "app", "execution"}, "pynvml": {"backends"},
         "aiomqtt": {"edge"}, "httptools": {"protocol"}, "grpc": {"protocol", "edge"}}


def layer_of(path: Path) -> str | None:
    rel = path.relative_to(PKG)
    top = rel.parts[0].removesuffix(".py")
    return top if top in RANK else None


def imports(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(path.relative_to(PKG).parts[:-1])
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                mod = ".".join(["gt_serve", *base, *(node.module.split(".") if node.module else [])])
                yield mod
                if not node.module:
                    for alias in node.names:
                        yield f"{mod}.{alias.name}"
            elif node.module:
                yield node.module


SOURCES = [p for p in PKG.rglob("*.py") if layer_of(p)]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PKG)))
def test_imports_point_down(path):
    me = layer_of(path)
    for mod in imports(path):
        parts = mod.split(".")
        if parts[0] == "gt_serve" and len(parts) > 1:
            target = parts[1]
            if target in RANK and target != me:
                assert RANK[target] > RANK[me] or (me == "app" and target != "cli"), \
                    f"{path.relative_to(PKG)} ({me}) imports {mod} ({target}): arrows point down only"
                assert {me, target} != {"protocol", "edge"}, f"{path.relative_to(PKG)}: protocol and edge never import each other"
        allowed = HEAVY.get(parts[0])
        if allowed is not None:
            assert me in allowed, f"{path.relative_to(PKG)} ({me}) imports {parts[0]}; only {sorted(allowed)} may"
