"""Every shipped node config loads and validates; bad keys and values are named."""
from pathlib import Path

import pytest

from gt_serve.config import load_config
from gt_serve.errors import ConfigError

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "edge_configs").glob("*.yaml"))


def test_there_are_configs():
    names = {p.name for p in CONFIGS}
    assert {"single-node.yaml", "gpu-server.yaml", "jetson.yaml", "cluster-gpu-server.yaml",
            "cluster-jetson.yaml", "cluster-cpu.yaml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_loads(path):
    cfg = load_config(path)
    assert cfg.node_name
    assert cfg.power_profile


def test_cluster_nodes_are_distinct_and_share_a_cluster():
    cluster = [load_config(p) for p in CONFIGS if p.name.startswith("cluster-")]
    assert len({c.node_name for c in cluster}) == 3
    assert len({c.cluster.name for c in cluster}) == 1
    assert all(c.telemetry.enabled for c in cluster)


def test_bad_value_in_file_is_named(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("telemetry: {enabled: yes-please}\n")
    with pytest.raises(ConfigError, match=r"telemetry\.enabled.*yes-please"):
        load_config(bad)
