"""Every shipped node config loads and validates; bad keys and values are named."""
from pathlib import Path

import pytest
import yaml

from gt_serve.config_layers import load_config
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


# ---------------------------------------------------------------- the compose cluster is secure by default

CLUSTER_CONFIGS = [p for p in CONFIGS if p.name.startswith("cluster-")]
COMPOSE_FILE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def _compose_service(config: Path) -> tuple[dict, dict]:
    """The docker-compose.yml service started with `config`, and the file's top-level secrets."""
    compose = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    service = next(s for s in compose["services"].values() if f"/config/{config.name}" in (s.get("command") or []))
    return service, compose.get("secrets", {})


@pytest.mark.parametrize("path", CLUSTER_CONFIGS, ids=lambda p: p.name)
def test_cluster_config_is_tls_and_signed(path):
    cfg = load_config(path)
    t, s, c = cfg.telemetry, cfg.server, cfg.cluster
    assert t.broker_port == 8883 and not t.tls_insecure
    assert t.tls_ca_file and t.tls_cert_file and t.tls_key_file, "telemetry to the broker over TLS with a client cert"
    assert t.username is None and t.password is None, "credentials come from the node's .env, never the YAML"
    assert s.grpc_use_ssl_mutual and s.grpc_root_cert, "gRPC (the forwarding path) takes mutual TLS only"
    assert c.require_key and c.tls_ca_file and c.tls_cert_file and c.tls_key_file, "forwards over mutual TLS"


@pytest.mark.parametrize("path", CLUSTER_CONFIGS, ids=lambda p: p.name)
def test_cluster_config_files_are_the_nodes_own_compose_secrets(path):
    """Every certificate path in the config is a compose secret of that node's service, the CA, its own
    certificate and key; its env_files are its own .env (MQTT user = node name, the ACL's %u) and cluster.env."""
    cfg = load_config(path)
    service, secrets = _compose_service(path)
    mounted = {f"/run/secrets/{name}": secrets[name]["file"].rsplit("/", 1)[-1] for name in service["secrets"]}
    node = cfg.node_name
    expected = {cfg.telemetry.tls_ca_file: "ca.pem", cfg.cluster.tls_ca_file: "ca.pem",
                cfg.server.grpc_root_cert: "ca.pem",
                cfg.telemetry.tls_cert_file: f"{node}.pem", cfg.cluster.tls_cert_file: f"{node}.pem",
                cfg.server.grpc_server_cert: f"{node}.pem",
                cfg.telemetry.tls_key_file: f"{node}-key.pem", cfg.cluster.tls_key_file: f"{node}-key.pem",
                cfg.server.grpc_server_key: f"{node}-key.pem"}
    for container_path, host_file in expected.items():
        assert mounted.get(container_path) == host_file, (container_path, mounted)
    assert sorted(f.rsplit("/", 1)[-1] for f in service["env_file"]) == sorted(["cluster.env", f"{node}.env"])
    assert service.get("hostname") == cfg.cluster.advertise_host == node, "the certificate names the node"


def test_single_node_spells_out_the_defaults():
    """single-node.yaml says it is the defaults spelled out: every section value it sets is the default (it once set
    drain_timeout_s 30 where the default is 20)."""
    path = next(p for p in CONFIGS if p.name == "single-node.yaml")
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    loaded, default = load_config(path, environ={}), load_config(None, environ={})
    checked = 0
    for section in ("server", "lanes", "router", "telemetry"):
        for key in raw.get(section, {}):
            assert getattr(getattr(loaded, section), key) == getattr(getattr(default, section), key), \
                f"single-node.yaml sets {section}.{key} to other than its default"
            checked += 1
    assert checked >= 20
