from pathlib import Path

import pytest

from gt_serve.config_layers import load_config, parse_config
from gt_serve.errors import ConfigError


def test_defaults():
    cfg = parse_config({})
    assert cfg.server.http_port == 8000 and cfg.server.server_name == "gt_serve"
    assert cfg.router.policy == "balanced"
    assert cfg.server.grpc_transport == "native" and cfg.lanes.io_binding == "auto" and cfg.lanes.launch == "auto"


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
    ({"lanes": {"inline_max_us": -1}}, ["lanes.inline_max_us", "-1"]),
    ({"lanes": {"tiny_run_us": -5}}, ["lanes.tiny_run_us", "-5"]),
    ({"lanes": {"launch": "sometimes"}}, ["lanes.launch", "sometimes"]),
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


# ---- environment: GT_SECTION__KEY, GT_CONFIG, precedence ---------------------------------------------

def test_defaults_suit_kubernetes():
    cfg = parse_config({})
    assert cfg.server.strict_readiness is True and cfg.server.exit_on_error is True  # Triton's defaults
    assert cfg.server.drain_timeout_s <= 25  # inside the default 30 s terminationGracePeriodSeconds


def test_every_section_is_settable_from_the_environment():
    env = {"GT_SERVER__HTTP_PORT": "8080", "GT_SERVER__STRICT_READINESS": "false",
           "GT_SERVER__LOAD_MODELS": "[a, b]", "GT_LANES__GPUS": "0", "GT_LANES__SPIN_US": "0",
           "GT_ROUTER__SLO_MS": "{resnet: 20.5}", "GT_ROUTER__EPSILON": "0.5", "GT_TELEMETRY__ENABLED": "true",
           "GT_TELEMETRY__PERIOD_S": "2", "GT_CLUSTER__NAME": "fleet", "GT_NODE__NAME": "pod-7",
           "GT_POWER_PROFILE__PRESET": "jetson_orin"}
    cfg = load_config(environ=env)
    assert cfg.server.http_port == 8080 and cfg.server.strict_readiness is False
    assert cfg.server.load_models == ("a", "b") and cfg.lanes.gpus == (0,) and cfg.lanes.spin_us == 0
    assert cfg.router.slo_ms == {"resnet": 20.5} and cfg.router.epsilon == 0.5
    assert cfg.telemetry.enabled is True and cfg.telemetry.period_s == 2.0
    assert cfg.cluster.name == "fleet" and cfg.node_name == "pod-7"
    assert cfg.power_profile == {"preset": "jetson_orin"}


def test_string_keys_keep_the_text_as_written():
    env = {"GT_SERVER__SERVER_NAME": "yes", "GT_SERVER__AUTH_TOKEN": "0123", "GT_SERVER__HOST": "::"}
    s = load_config(environ=env).server
    assert (s.server_name, s.auth_token, s.host) == ("yes", "0123", "::")


def test_precedence_defaults_yaml_environment_command_line(tmp_path):
    path = tmp_path / "node.yaml"
    path.write_text("server: {http_port: 9000, grpc_port: 9001, server_name: from-yaml}\n")
    env = {"GT_SERVER__GRPC_PORT": "7001", "GT_SERVER__SERVER_NAME": "from-env"}
    cfg = load_config(path, {"server_name": "from-cli"}, environ=env)
    assert cfg.server.metrics_port == 8002  # default
    assert cfg.server.http_port == 9000  # YAML over the default
    assert cfg.server.grpc_port == 7001  # environment over YAML
    assert cfg.server.server_name == "from-cli"  # command line over all


def test_gt_config_names_the_yaml_file_unless_a_path_is_given(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("node: {name: a}\n")
    b.write_text("node: {name: b}\n")
    assert load_config(environ={"GT_CONFIG": str(a)}).node_name == "a"
    assert load_config(b, environ={"GT_CONFIG": str(a)}).node_name == "b"
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(environ={"GT_CONFIG": str(tmp_path / "missing.yaml")})


def test_short_legacy_names_still_work_below_the_file():
    env = {"GT_GRPC_TRANSPORT": "grpcio", "GT_AUTH_TOKEN": "t", "GT_EVENT_LOOP": "asyncio"}
    s = load_config(environ=env).server
    assert (s.grpc_transport, s.auth_token, s.event_loop) == ("grpcio", "t", "asyncio")
    # the long form wins over the short one
    assert load_config(environ={**env, "GT_SERVER__AUTH_TOKEN": "long"}).server.auth_token == "long"


def test_unrelated_variables_are_ignored():
    env = {"GT_LOAD_SERVER_CMD": "x", "GT_MODEL": "y", "HOME": "/root", "GT_SERVE_SERVICE_PORT": "8080"}
    assert load_config(environ=env) == load_config(environ={})


@pytest.mark.parametrize("env, words", [
    ({"GT_SERVER__HTTP_PROT": "1"}, ["GT_SERVER__HTTP_PROT", "server.http_prot", "http_port"]),
    ({"GT_BATCHING__MAX_QUEUE_DELAY_US": "5"}, ["GT_BATCHING__MAX_QUEUE_DELAY_US", "section 'batching'", "SERVER"]),
    ({"GT_SERVER__HTTP_PORT": "eighty"}, ["GT_SERVER__HTTP_PORT", "integer", "'eighty'"]),
    ({"GT_SERVER__HTTP_PORT": "70000"}, ["server.http_port", "70000"]),
    ({"GT_SERVER__ALLOW_HTTP": "perhaps"}, ["GT_SERVER__ALLOW_HTTP", "true/false"]),
    ({"GT_SERVER__HTTP_PORT": ""}, ["GT_SERVER__HTTP_PORT", "empty"]),
    ({"GT_ROUTER__SLO_MS": "{a: [1"}, ["GT_ROUTER__SLO_MS", "YAML"]),
    ({"GT_MODELS__RESNET": "{}"}, ["GT_MODELS__RESNET", "YAML file"]),
    ({"GT_NODE__ZONE": "a"}, ["GT_NODE__ZONE", "node.zone"]),
])
def test_bad_environment_variables_are_named(env, words):
    with pytest.raises(ConfigError) as err:
        load_config(environ=env)
    for w in words:
        assert w in str(err.value)


# ---- the command line over the configuration (Triton's flags included) ----------------------------------

def test_triton_flags_map_onto_config_keys():
    from gt_serve.cli import _triton_log_level, build_parser

    args = build_parser().parse_args(["--model-store=/mnt/models", "--strict-readiness=false", "--exit-on-error",
                                      "false", "--exit-timeout-secs=12", "--id", "triton", "--log-verbose=1",
                                      "--model-control-mode=poll"])
    assert args.model_repository == ["/mnt/models"] and args.strict_readiness is False
    assert args.exit_on_error is False and args.drain_timeout_s == 12.0 and args.server_name == "triton"
    assert _triton_log_level(args) == "DEBUG" and args.model_control_mode == "poll"
    quiet = build_parser().parse_args(["--log-info=false", "--log-warning=false"])
    assert _triton_log_level(quiet) == "ERROR"
    assert _triton_log_level(build_parser().parse_args([])) is None


def test_triton_flags_without_meaning_are_noted_not_fatal():
    from gt_serve.cli import _ignored_notes, build_parser

    args = build_parser().parse_args(["--http-thread-count", "8", "--grpc-keepalive-time=7", "--allow-sagemaker=false",
                                      "--strict-model-config=false", "--disable-auto-complete-config",
                                      "--backend-config=onnxruntime,x=1", "--metrics-address", "0.0.0.0"])
    notes = "\n".join(_ignored_notes(args))
    for flag in ("--http-thread-count=8", "--grpc-keepalive-time=7", "--disable-auto-complete-config",
                 "--backend-config=onnxruntime,x=1", "--metrics-address=0.0.0.0"):
        assert f"ignoring Triton flag {flag}" in notes
    assert "sagemaker" not in notes and "strict-model-config" not in notes  # values that change nothing


def test_every_flag_of_triton_2_51_is_taken():
    """A Triton command line starts gt-serve: each of Triton 2.51's flags (its `--help`, tests/data) is a flag here,
    or one taken and noted as without meaning (--model-config-name and --enable-peer-access were refused)."""
    from gt_serve.cli import _TRITON_IGNORED, build_parser

    listed = Path(__file__).resolve().parents[1] / "data" / "triton_2_51_flags.txt"
    flags = [line.strip() for line in listed.read_text().splitlines() if line.startswith("--")]
    assert len(flags) > 80
    ours = {option for action in build_parser()._actions for option in action.option_strings}
    assert [f for f in flags if f not in ours and f[2:] not in _TRITON_IGNORED] == []


def test_unknown_flags_still_fail():
    from gt_serve.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["--htpp-port", "1"])
