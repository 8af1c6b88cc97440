"""deploy/kubernetes/ checked without a cluster: every manifest parses; core resources validate against the
Kubernetes schemas (kubernetes-validate); custom resources (KServe, KEDA, Prometheus operator) carry only
fields their CRDs define (tests/data/k8s_crd_fields.yaml) and their pod parts validate as Kubernetes types;
the runtime's arguments and environment are ones gt-serve accepts; checkov finds nothing unjustified."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gt_serve.cli import build_parser
from gt_serve.config import ServerConfig
from gt_serve.config_layers import load_config

kubernetes_validate = pytest.importorskip("kubernetes_validate")

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
CRD_FIELDS = yaml.safe_load((ROOT / "tests" / "data" / "k8s_crd_fields.yaml").read_text())
K8S_VERSIONS = ("1.28", kubernetes_validate.utils.latest_version())  # oldest we document, newest bundled
CHECKOV_VENV = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gt_serve" / "checkov-venv"
CHECKOV_TIMEOUT_S = 300


def documents() -> list[tuple[str, dict]]:
    out = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        out += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return out


def of_kind(kind: str) -> list[dict]:
    return [doc for _, doc in documents() if doc["kind"] == kind]


def one(kind: str, name: str) -> dict:
    found = [doc for doc in of_kind(kind) if doc["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


# ---- a small structural checker over the CRD allow-list -----------------------------------------------

class Delegated:
    """Fields the allow-list hands to a Kubernetes core type, collected for kubernetes-validate."""

    def __init__(self) -> None:
        self.pod_spec: dict[str, Any] = {}
        self.containers: list[dict] = []


def check_fields(node: Any, value: Any, path: str, delegated: Delegated) -> Iterator[str]:
    """Yield one message per field or value the allow-list `node` does not admit."""
    if node == "any":
        return
    if isinstance(node, list):
        if value not in node:
            yield f"{path}: {value!r} is not one of {node}"
        return
    if isinstance(node, str):
        yield from _check_leaf(node, value, path)
        return
    if "[]" in node:
        if not isinstance(value, list):
            yield f"{path}: expected a list"
            return
        for i, item in enumerate(value):
            yield from check_fields(node["[]"], item, f"{path}[{i}]", delegated)
        return
    if not isinstance(value, dict):
        yield f"{path}: expected an object"
        return
    container: dict[str, Any] = {}
    for key, item in value.items():
        sub = node.get(key, node.get("*"))
        if sub is None:
            yield f"{path}.{key}: not a field of the CRD"
        elif sub == "$PodSpec":
            delegated.pod_spec[key] = item
        elif sub == "$Container":
            container[key] = item
        else:
            yield from check_fields(sub, item, f"{path}.{key}", delegated)
    if node.get("*") == "$Container":
        delegated.containers.append({"name": "kserve-container", **container})


def _check_leaf(kind: str, value: Any, path: str) -> Iterator[str]:
    ok = {"string": lambda v: isinstance(v, str),
          "boolean": lambda v: isinstance(v, bool),
          "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
          "map": lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values())}[kind]
    if not ok(value):
        yield f"{path}: {value!r} is not a {kind}"


def custom_resource_problems(doc: dict) -> list[str]:
    schema = CRD_FIELDS[doc["kind"]]
    problems = [] if doc["apiVersion"] == schema["apiVersion"] else [f"apiVersion {doc['apiVersion']}"]
    problems += [f"top-level field {key}" for key in doc if key not in ("apiVersion", "kind", "metadata", "spec")]
    delegated = Delegated()
    problems += list(check_fields(schema["spec"], doc.get("spec", {}), "spec", delegated))
    pod_spec = dict(delegated.pod_spec)
    pod_spec["containers"] = pod_spec.get("containers", []) + delegated.containers
    if not pod_spec["containers"]:
        pod_spec["containers"] = [{"name": "placeholder", "image": "placeholder"}]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": doc["metadata"], "spec": pod_spec}
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(pod, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"pod parts against Kubernetes {version}: {exc.message}")
    return problems


CUSTOM_KINDS = tuple(k for k in CRD_FIELDS if k not in ("source",))


# ---- parsing and schemas ------------------------------------------------------------------------------

def test_every_manifest_parses_and_is_named():
    docs = documents()
    assert {name for name, _ in docs} >= {"cluster-serving-runtime.yaml", "deployment.yaml",
                                         "inferenceservice-cpu.yaml", "inferenceservice-gpu.yaml",
                                         "inferenceservice-jetson.yaml", "inferenceservice-raw-keda.yaml"}
    for name, doc in docs:
        assert doc.get("apiVersion") and doc.get("kind") and doc.get("metadata", {}).get("name"), name
    json.loads((DEPLOY / "grafana-dashboard.json").read_text())


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_core_resources_validate_against_the_kubernetes_schemas(version):
    core = [(name, doc) for name, doc in documents() if doc["kind"] not in CUSTOM_KINDS]
    assert {doc["kind"] for _, doc in core} == {"Deployment", "Service", "NetworkPolicy"}
    for name, doc in core:
        kubernetes_validate.validate(doc, version, strict=True)  # raises, naming the field


def test_custom_resources_carry_only_fields_their_crds_define():
    custom = [(name, doc) for name, doc in documents() if doc["kind"] in CUSTOM_KINDS]
    assert {doc["kind"] for _, doc in custom} == set(CUSTOM_KINDS)
    for name, doc in custom:
        assert custom_resource_problems(doc) == [], name
    assert not [doc for _, doc in documents() if doc["kind"] not in CUSTOM_KINDS
                and doc["apiVersion"].split("/")[0] not in ("v1", "apps", "networking.k8s.io")]


@pytest.mark.parametrize("mutate, words", [
    (lambda d: d["spec"]["predictor"]["model"].update(bogus=1), "'bogus' was unexpected"),
    (lambda d: d["spec"]["predictor"].update(minReplica=1), "'minReplica' was unexpected"),
    (lambda d: d["spec"].update(predictorr={}), "spec.predictorr: not a field"),
    (lambda d: d["spec"]["predictor"]["model"].update(protocolVersion="v3"), "'v3'"),
    (lambda d: d["spec"]["predictor"]["model"]["resources"].update(limitz={}), "limitz"),
    (lambda d: d["spec"]["predictor"].update(runtimeClassName=5), "pod parts"),
])
def test_the_structural_check_catches_what_a_crd_rejects(mutate, words):
    doc = json.loads(json.dumps(one("InferenceService", "gt-serve-cpu")))
    mutate(doc)
    assert any(words in p for p in custom_resource_problems(doc)), custom_resource_problems(doc)


# ---- the serving runtime ------------------------------------------------------------------------------

def runtime() -> dict:
    return one("ClusterServingRuntime", "gt-serve")


def runtime_container() -> dict:
    (container,) = runtime()["spec"]["containers"]
    assert container["name"] == "kserve-container"
    return container


def test_runtime_formats_protocols_and_metrics_annotations():
    spec = runtime()["spec"]
    assert spec["supportedModelFormats"] == [{"name": "onnx", "version": "1", "autoSelect": False},
                                             {"name": "triton", "version": "2", "autoSelect": False}]
    assert spec["protocolVersions"] == ["v2", "grpc-v2"]
    assert spec["annotations"] == {"prometheus.kserve.io/port": "8002", "prometheus.kserve.io/path": "/metrics"}


def test_runtime_arguments_and_environment_are_ones_gt_serve_accepts():
    container = runtime_container()
    args = build_parser().parse_args(container["args"])
    assert (args.model_repository, args.http_port, args.grpc_port, args.metrics_port) == (["/mnt/models"], 8080,
                                                                                          9000, 8002)
    assert args.strict_readiness is True
    env = {e["name"]: e["value"] for e in container["env"]}
    cfg = load_config(environ=env)
    assert cfg.server.drain_timeout_s <= 25  # leaves the 30 s grace period room to exit


def test_runtime_probes_security_and_volumes():
    container = runtime_container()
    assert container["ports"] == [{"name": "http1", "containerPort": 8080, "protocol": "TCP"}]
    probes = {kind: container[kind] for kind in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert {kind: p["httpGet"]["path"] for kind, p in probes.items()} == {
        "startupProbe": "/v2/health/live", "livenessProbe": "/v2/health/live", "readinessProbe": "/v2/health/ready"}
    assert all(p["httpGet"]["port"] == 8080 and "exec" not in p for p in probes.values())  # no curl in the image
    sc = container["securityContext"]
    assert (sc["runAsNonRoot"], sc["runAsUser"], sc["readOnlyRootFilesystem"]) == (True, 10001, True)
    assert sc["capabilities"]["drop"] == ["ALL"] and sc["allowPrivilegeEscalation"] is False
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v["emptyDir"] for v in runtime()["spec"]["volumes"]}
    assert set(mounts) == {"/tmp", "/dev/shm"}
    assert volumes[mounts["/dev/shm"]]["medium"] == "Memory" and "medium" not in volumes[mounts["/tmp"]]
    limits = container["resources"]["limits"]
    assert {"cpu", "memory"} <= set(limits)


def test_the_image_runs_as_the_runtimes_user():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "USER 10001:10001" in dockerfile and "--uid 10001" in dockerfile


# ---- the InferenceService examples and the plain Deployment -------------------------------------------

def test_inference_services_name_the_runtime_and_their_hardware():
    isvcs = {doc["metadata"]["name"]: doc["spec"]["predictor"] for doc in of_kind("InferenceService")}
    assert set(isvcs) == {"gt-serve-cpu", "gt-serve-gpu", "gt-serve-jetson", "gt-serve-raw"}
    for name, predictor in isvcs.items():
        assert predictor["model"]["runtime"] == "gt-serve" and predictor["model"]["modelFormat"]["name"] == "onnx"
        assert predictor["model"]["storageUri"], name
    gpu = isvcs["gt-serve-gpu"]["model"]
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert gpu["protocolVersion"] == "grpc-v2" and gpu["ports"][0]["name"] == "h2c"
    assert gpu["ports"][0]["containerPort"] == 9000
    jetson = isvcs["gt-serve-jetson"]
    assert jetson["nodeSelector"] == {"kubernetes.io/arch": "arm64"} and jetson["runtimeClassName"] == "nvidia"
    for predictor in isvcs.values():  # every example's environment is valid gt-serve configuration
        load_config(environ={e["name"]: e["value"] for e in predictor["model"].get("env", [])})


def test_raw_deployment_scales_on_queue_depth_with_keda():
    isvc = one("InferenceService", "gt-serve-raw")
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"
    assert isvc["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "external"
    (scaled,) = of_kind("ScaledObject")
    assert scaled["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                                "name": "gt-serve-raw-predictor"}
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and "gt_queue_depth" in trigger["metadata"]["query"]
    assert scaled["spec"]["maxReplicaCount"] == isvc["spec"]["predictor"]["maxReplicas"]


def test_plain_deployment_drains_inside_its_grace_period():
    pod = one("Deployment", "gt-serve")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    drain_s = load_config(environ=env).server.drain_timeout_s
    assert drain_s + 5 <= pod["terminationGracePeriodSeconds"]
    assert ServerConfig().drain_timeout_s + 5 <= 30  # the default fits Kubernetes' default grace period too
    build_parser().parse_args(container["args"])
    service_ports = {p["name"]: p["port"] for p in one("Service", "gt-serve")["spec"]["ports"]}
    assert service_ports == {"http": 8080, "grpc": 9000, "metrics": 8002}
    (endpoint,) = one("PodMonitor", "gt-serve")["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")


def test_dashboard_panels_query_prometheus():
    dash = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    titles = [p["title"] for p in dash["panels"]]
    for topic in ("Throughput", "Latency", "Queue depth", "Batch size", "Lane", "Energy per inference", "Peers"):
        assert any(topic.lower() in t.lower() for t in titles), topic
    assert all(p["targets"] and all(t["expr"] for t in p["targets"]) for p in dash["panels"])
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


# ---- security scan ------------------------------------------------------------------------------------

def checkov_binary() -> str | None:
    for candidate in (os.environ.get("GT_CHECKOV"), str(CHECKOV_VENV / "bin" / "checkov"), shutil.which("checkov")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def runtime_pod(tmp: Path) -> Path:
    """The pod KServe builds from the runtime (its containers and volumes), with the runtime's checkov
    skips, so the scan covers the ServingRuntime too (checkov does not know KServe's kinds)."""
    meta = runtime()["metadata"]
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "gt-serve-runtime", "namespace": "models", "annotations": meta["annotations"]},
           "spec": {"containers": runtime()["spec"]["containers"], "volumes": runtime()["spec"]["volumes"]}}
    path = tmp / "runtime-pod.yaml"
    path.write_text(yaml.safe_dump(pod))
    return path


def test_checkov_finds_nothing_unjustified(tmp_path):
    checkov = checkov_binary()
    if checkov is None:
        if os.environ.get("CI"):
            pytest.fail("checkov not installed: .ci/run installs it in its own venv")
        pytest.skip("checkov not installed (bash .ci/run installs it in ~/.cache/gt_serve/checkov-venv)")
    scan = tmp_path / "scan"
    shutil.copytree(DEPLOY, scan, ignore=shutil.ignore_patterns("*.json"))
    runtime_pod(scan)
    done = subprocess.run([checkov, "-d", str(scan), "--framework", "kubernetes", "--output", "json",
                           "--skip-download"], check=False, capture_output=True, text=True, timeout=CHECKOV_TIMEOUT_S,
                          env={**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": "false"})
    report = json.loads(done.stdout)
    report = report[0] if isinstance(report, list) else report
    results = report.get("results", {})
    failed = [f"{c['check_id']} {c['resource']}" for c in results.get("failed_checks", [])]
    assert failed == [], failed
    assert report["summary"]["passed"] > 50 and report["summary"]["resource_count"] >= 5
    reasons = skip_reasons()
    for check in results.get("skipped_checks", []):
        assert len(reasons.get(check["check_id"], "")) > 20, f"{check['check_id']}: skipped without a reason"


def skip_reasons() -> dict[str, str]:
    """checkov.io/skipN annotations ("CHECK_ID=reason") of every manifest."""
    out = {}
    for _, doc in documents():
        for key, value in (doc["metadata"].get("annotations") or {}).items():
            if key.startswith("checkov.io/skip"):
                check, _, reason = value.partition("=")
                out[check] = reason.strip()
    return out
