"""What a model directory says before anything of it loads: its config (or a load request's override), the
versions its version policy picks, and the checks of its repository agents.

The one agent is Triton's checksum agent (triton-inference-server/checksum_repository_agent), in its terms:
`model_repository_agents { agents [ { name: "checksum" parameters { key: "MD5:relative/path" value: "hex" } } ] }`;
each named file (confined to the model directory, as every file a config names) must have that digest, or the
load fails with Triton's message. Any other agent fails the load naming it.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from ..errors import ConfigError, InvalidArgument, Unsupported
from .model_config import config_mentions_batching, parse_json_override, parse_pbtxt
from .repository_paths import open_model_file, shown

CHECKSUM_AGENT = "checksum"
_CHUNK = 1 << 20


def read_config(name: str, model_dir: Path, config_json: str | None) -> tuple[mc.ModelConfig, bool]:
    """(the config as written or overridden, whether it states max_batch_size)."""
    pbtxt = model_dir / "config.pbtxt"
    if config_json is not None:
        return parse_json_override(config_json, name), '"max_batch_size"' in config_json or "max_batch_size" in config_json
    if pbtxt.is_file():
        text = pbtxt.read_text()
        return parse_pbtxt(text, f"model '{name}' config.pbtxt"), config_mentions_batching(text)
    return mc.ModelConfig(), False


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
