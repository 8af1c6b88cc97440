"""core/model_config.shown_config: a model's config as Triton's normalization shows it (named instance groups of a
resolved kind), while the config kept for the host and for peers keeps KIND_AUTO."""
from __future__ import annotations

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from gt_serve.core.model_config import shown_config

AUTO, CPU, GPU = mc.ModelInstanceGroup.KIND_AUTO, mc.ModelInstanceGroup.KIND_CPU, mc.ModelInstanceGroup.KIND_GPU


def _config() -> mc.ModelConfig:
    cfg = mc.ModelConfig(name="m")
    cfg.instance_group.add(kind=AUTO, count=2)
    cfg.instance_group.add(name="pinned", kind=CPU, count=1)
    return cfg


def test_auto_groups_shown_with_the_kind_the_sessions_got_and_named_as_triton_names_them():
    cfg = _config()
    on_cpu = shown_config(cfg, ["CPUExecutionProvider"])
    assert [(g.name, g.kind, g.count) for g in on_cpu.instance_group] == [("m_0", CPU, 2), ("pinned", CPU, 1)]
    on_gpu = shown_config(cfg, ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert [g.kind for g in on_gpu.instance_group] == [GPU, CPU]
    assert shown_config(cfg, ["TensorrtExecutionProvider"]).instance_group[0].kind == GPU
    assert shown_config(cfg, ["OpenVINOExecutionProvider"]).instance_group[0].kind == CPU
    assert cfg.instance_group[0].kind == AUTO and cfg.instance_group[0].name == ""  # what is kept is unchanged


def test_every_group_has_a_kind_in_the_json_grpc_clients_read():
    """MessageToDict without default values (PyTriton's form of a gRPC config) leaves KIND_AUTO (0) out."""
    raw = json_format.MessageToDict(_config(), preserving_proto_field_name=True)
    assert "kind" not in raw["instance_group"][0]  # the failure PyTriton's client hit
    shown = json_format.MessageToDict(shown_config(_config(), ["CPUExecutionProvider"]),
                                      preserving_proto_field_name=True)
    assert [g["kind"] for g in shown["instance_group"]] == ["KIND_CPU", "KIND_CPU"]


def test_a_resolved_config_is_returned_as_it_is():
    cfg = mc.ModelConfig(name="m")
    cfg.instance_group.add(name="g", kind=GPU, count=1)
    assert shown_config(cfg, ["CUDAExecutionProvider"]) is cfg
    ensemble = mc.ModelConfig(name="e", platform="ensemble")  # no instance groups, as in Triton
    assert shown_config(ensemble, []) is ensemble
