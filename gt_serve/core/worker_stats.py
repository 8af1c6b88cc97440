"""Statistics of the worker processes of one server (server.workers > 1) made into the one answer a client
expects: each model version's counts and durations added up over the workers, as if one process had served
every request.

Triton's fields add: counts, nanoseconds, per-batch-size stats (matched by batch size), memory usage entries
(matched by type and id). `last_inference` is the latest of the workers'. A per-inference figure is worked out
again from the sums. gt-serve's node-wide extensions (energy, memory budget) are not added: each worker books
the node's power and memory as its own, so they are listed per worker under "workers".
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_NODE_WIDE = ("energy", "memory_budget")
_NOT_ADDED = frozenset({"name", "version", "last_inference", "batch_stats", "memory_usage"})  # merged by their rules


def _add(a: Any, b: Any) -> Any:
    """a + b over nested dicts of numbers (a key missing from one side counts as absent, not zero)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = dict(a)
        for key, value in b.items():
            out[key] = _add(out[key], value) if key in out else value
        return out
    if isinstance(a, bool) or isinstance(b, bool):
        return a or b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a + b
    return a


def _merge_keyed(a: list[dict], b: list[dict], key: tuple[str, ...]) -> list[dict]:
    rows = {tuple(r.get(k) for k in key): dict(r) for r in a}
    for row in b:
        k = tuple(row.get(f) for f in key)
        if k in rows:
            merged = _add({f: v for f, v in rows[k].items() if f not in key},
                          {f: v for f, v in row.items() if f not in key})
            rows[k] = {**{f: row.get(f) for f in key}, **merged}
        else:
            rows[k] = dict(row)
    return [rows[k] for k in sorted(rows, key=lambda k: tuple(str(x) for x in k))]


def merge_model_stats(a: dict, b: dict) -> dict:
    """One model version's statistics from two workers, added."""
    out = _add({k: v for k, v in a.items() if k not in _NOT_ADDED}, {k: v for k, v in b.items() if k not in _NOT_ADDED})
    out["name"], out["version"] = a.get("name"), a.get("version")
    out["last_inference"] = max(a.get("last_inference", 0), b.get("last_inference", 0))
    out["batch_stats"] = sorted(_merge_keyed(a.get("batch_stats", []), b.get("batch_stats", []), ("batch_size",)),
                                key=lambda r: r["batch_size"])
    out["memory_usage"] = _merge_keyed(a.get("memory_usage", []), b.get("memory_usage", []), ("type", "id"))
    energy = out.get("energy")
    if isinstance(energy, dict) and "dynamic_j" in energy:
        count = out.get("inference_count", 0)
        energy["dynamic_j_per_inference"] = round(energy["dynamic_j"] / count, 9) if count else 0.0
    return {k: out[k] for k in (*a.keys(), *(k for k in out if k not in a))}


def merge_statistics(answers: Sequence[dict]) -> dict:
    """The statistics answers of every worker (this one first), as one answer: model versions in the order of
    name and version, each added up; the node-wide extensions per worker under "workers"."""
    models: dict[tuple[str, str], dict] = {}
    for answer in answers:
        for row in answer.get("model_stats", []):
            key = (row.get("name"), row.get("version"))
            models[key] = merge_model_stats(models[key], row) if key in models else dict(row)
    # ordered as ModelControl.statistics orders one worker's: by name, then version number
    out: dict = {"model_stats": [models[k] for k in sorted(models, key=lambda k: (k[0], int(k[1])))]}
    workers = [{"worker": i, **{k: a[k] for k in _NODE_WIDE if k in a}} for i, a in enumerate(answers)]
    if any(len(w) > 1 for w in workers):
        out["workers"] = workers
    return out
