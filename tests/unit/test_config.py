import pytest

from gt_serve.config import load_config, parse_config
from gt_serve.errors import ConfigError


def test_defaults():
    cfg = parse_config({})
    assert cfg.server.http_port == 8000 and cfg.server.server_name == "gt_serve"
    assert cfg.router.policy == "balanced"
    assert cfg.server.grpc_transport == "native" and cfg.lanes.io_binding == "auto"


def test_grpc_transport_from_the_environment(monkeypatch):
    monkeypatch.setenv("GT_GRPC_TRANSPORT", "grpcio")
    assert load_config().server.grpc_transport == "grpcio"


@pytest.mark.parametrize("raw, words", [
    ({"server": {"http_prot": 1}}, ["server.http_prot"]),
    ({"server": {"http_port": "x"}}, ["server.http_port", "'x'"]),
    ({"server": {"http_port": 70000}}, ["server.http_port", "70000"]),
    ({"router": {"policy": "fastest"}}, ["router.policy", "fastest"]),
    ({"telemetry": {"period_s": -1}}, ["telemetry.period_s", "-1"]),
    ({"bogus": 1}, ["bogus"]),
    ({"server": {"model_control_mode": "poll2"}}, ["model_control_mode", "poll2"]),
    ({"server": {"grpc_transport": "h3"}}, ["server.grpc_transport", "h3"]),
    ({"lanes": {"io_binding": "sometimes"}}, ["lanes.io_binding", "sometimes"]),
    ({"lanes": {"gpu_memory_limit_bytes": -1}}, ["lanes.gpu_memory_limit_bytes", "-1"]),
    ({"lanes": {"spin_us": -5}}, ["lanes.spin_us", "-5"]),
])
def test_bad_values_are_named(raw, words):
    with pytest.raises(ConfigError) as err:
        parse_config(raw)
    for w in words:
        assert w in str(err.value)


def test_yaml_file_and_overrides(tmp_path):
    path = tmp_path / "n.yaml"
    path.write_text("node: {name: a, cluster: c1}\nserver: {http_port: 9000, server_name: triton}\n")
    cfg = load_config(path, {"http_port": 0})
    assert cfg.node_name == "a" and cfg.cluster.name == "c1"
    assert cfg.server.http_port == 0 and cfg.server.server_name == "triton"


def test_unreadable_and_invalid_yaml(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("server: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
