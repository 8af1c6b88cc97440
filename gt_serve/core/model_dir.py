"""What a model directory says before anything of it loads: its config (or a load request's override), each
version's model file, the versions its version policy picks, and the checks of its repository agents.

A version's model file is `VERSION/FILENAME` (`default_model_filename`, `model.onnx` by default), or, where that is
a directory, `VERSION/FILENAME/model.onnx`: as Triton's onnxruntime backend, for a model kept in a directory of its
own beside its external data files. `model_files` names the files a session of it reads (the model file and the
external data files its graph names), for a copy of the model sent to a peer.

The one agent is Triton's checksum agent (triton-inference-server/checksum_repository_agent), in its terms:
`model_repository_agents { agents [ { name: "checksum" parameters { key: "MD5:relative/path" value: "hex" } } ] }`;
each named file (confined to the model directory, as every file a config names) must have that digest, or the
load fails with Triton's message. Any other agent fails the load naming it.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from ..errors import ConfigError, InvalidArgument, Unsupported
from .model_config import config_mentions_batching, parse_json_override, parse_pbtxt
from .repository_paths import confine, open_model_file, shown

CHECKSUM_AGENT = "checksum"
MODEL_FILE_IN_DIRECTORY = "model.onnx"
_CHUNK = 1 << 20
_PARSED_AT_MOST = 64 << 20  # model_footprint_bytes: a larger model file holds its weights (its size is the estimate)


def read_config(name: str, model_dir: Path, config_json: str | None,
                config_name: str = "") -> tuple[mc.ModelConfig, bool]:
    """(the config as written or overridden, whether it states max_batch_size). `config_name`: Triton's
    --model-config-name: the model's `configs/NAME.pbtxt` where it has one, else its config.pbtxt."""
    if config_json is not None:
        return parse_json_override(config_json, name), "max_batch_size" in config_json
    custom = model_dir / "configs" / f"{config_name}.pbtxt"
    pbtxt = custom if config_name and custom.is_file() else model_dir / "config.pbtxt"
    if pbtxt.is_file():
        text = pbtxt.read_text()
        label = pbtxt.relative_to(model_dir).as_posix()
        return parse_pbtxt(text, f"model '{name}' {label}"), config_mentions_batching(text)
    return mc.ModelConfig(), False


def version_dirs(model_dir: Path) -> list[Path]:
    """The model directory's version directories (named by a number), in no order."""
    return [p for p in model_dir.iterdir() if p.is_dir() and p.name.isascii() and p.name.isdigit()]


def version_model_files(model_dir: Path, filename: str) -> dict[int, str]:
    """Each version directory's model file, relative to the model directory (not confined yet: `confine` those
    loaded); a version directory without one is no version."""
    found: dict[int, str] = {}
    for version_dir in version_dirs(model_dir):
        path = version_dir / filename
        if path.is_file():
            found[int(version_dir.name)] = f"{version_dir.name}/{filename}"
        elif path.is_dir() and (path / MODEL_FILE_IN_DIRECTORY).is_file():
            found[int(version_dir.name)] = f"{version_dir.name}/{filename}/{MODEL_FILE_IN_DIRECTORY}"
    return found


def versions_to_load(cfg: mc.ModelConfig, available: list[int]) -> list[int]:
    """The versions (newest first) the config's version policy picks of those on disk."""
    policy = cfg.version_policy
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        return available
    if which == "specific":
        wanted = [int(v) for v in policy.specific.versions]
        missing = [v for v in wanted if v not in available]
        if missing:
            raise InvalidArgument(f"versions {missing} named by the version policy are missing")
        return sorted(wanted, reverse=True)
    num = policy.latest.num_versions if which == "latest" and policy.latest.num_versions > 0 else 1
    return available[:num]


def run_repository_agents(cfg: mc.ModelConfig, model_dir: Path, name: str) -> None:
    """The config's repository agents, before any session is built."""
    for agent in cfg.model_repository_agents.agents:
        if agent.name != CHECKSUM_AGENT:
            raise ConfigError(f"model '{name}': repository agent '{shown(agent.name)}' is not supported (gt_serve "
                              f"has Triton's '{CHECKSUM_AGENT}' agent)")
        for key, expected in sorted(agent.parameters.items()):
            _check_sum(model_dir, name, key, expected)


def _check_sum(model_dir: Path, name: str, key: str, expected: str) -> None:
    algorithm, colon, relative = key.partition(":")
    if not colon:
        raise InvalidArgument(f"failed to parse key: {shown(key)}")
    if algorithm.lower() != "md5":
        raise Unsupported(f"Unsupported checksum algorithm: {shown(algorithm)}")
    digest = hashlib.md5(usedforsecurity=False)
    try:
        with open_model_file(model_dir, relative, model=name, what="checksum agent file") as fh:
            while chunk := fh.read(_CHUNK):
                digest.update(chunk)
    except OSError:
        raise InvalidArgument(f"failed to open file for read {shown(relative)}") from None
    if digest.hexdigest() != expected:
        raise InvalidArgument(f"Mismatched MD5 hash for file {shown(relative)}, expect: {shown(expected)}, got: "
                              f"{digest.hexdigest()}")


def model_files(model_file: Path, name: str) -> dict[str, Path]:
    """The files a session of `model_file` reads, by their paths relative to its directory: the model file and the
    external data files its graph names (onnx's `location`, relative to the model file's directory, as onnxruntime
    reads them; confined to that directory). Reads the whole model file: call it off the event loop."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    files = {model_file.name: model_file}
    if _ort_format(model_file):  # onnxruntime's own format holds its weights
        return files
    graph = onnx.load(str(model_file), load_external_data=False).graph
    base = os.path.realpath(model_file.parent)
    for tensor in _tensors(graph):
        if uses_external_data(tensor):
            path = confine(model_file.parent, ExternalDataInfo(tensor).location, model=name, what="external data file")
            files.setdefault(os.path.relpath(path, base), path)
    return files


def model_footprint_bytes(model_file: Path, name: str) -> int:
    """The bytes of a model's files, as an estimate of what a copy of it takes; a model file of more than 64 MiB is
    taken to hold its weights (it is not parsed for external data)."""
    size = model_file.stat().st_size
    if size > _PARSED_AT_MOST:
        return size
    return sum(path.stat().st_size for path in model_files(model_file, name).values())


def _ort_format(model_file: Path) -> bool:
    """Whether a model file is in onnxruntime's ORT format (a flatbuffer whose identifier, bytes 4-8, is ORTM), as
    onnxruntime saves an optimized model for edge devices; onnxruntime loads it as any model file."""
    with open(model_file, "rb") as f:
        return f.read(8)[4:] == b"ORTM"


def _tensors(graph):
    """Every tensor a graph holds: initializers, and constants of its nodes and subgraphs."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                yield from _tensors(sub)
