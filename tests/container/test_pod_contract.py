"""The ClusterServingRuntime's pod, run the way the kubelet would run it: the real image with the manifest's
args and env, its user, a read-only root with tmpfs for the emptyDirs, --cpus = the CPU limit, the model
repository mounted read-only at /mnt/models (KServe's storage mount); its probes driven as Kubernetes would:
live early, ready only after the models load, not ready while a model fails under strict readiness, a load
error that exits the container, and the SIGTERM drain inside the grace period."""
from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.container.conftest import run_container, wait_until
from tests.integration.test_k8s_runtime import broken_model, simple_model, slow_model

pytestmark = pytest.mark.container

RUNTIME = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "cluster-serving-runtime.yaml"
MODELS_MOUNT = "/mnt/models"
GRACE_S = 30  # terminationGracePeriodSeconds: KServe does not set it, Kubernetes' default applies
START_S = 120.0
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def runtime_container() -> tuple[dict, dict]:
    doc = yaml.safe_load(RUNTIME.read_text())
    (container,) = doc["spec"]["containers"]
    return container, {v["name"]: v for v in doc["spec"]["volumes"]}


def quantity_bytes(text: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(float(text[:-len(suffix)]) * factor)
    return int(text)


def docker_run_options(container: dict, volumes: dict, repo: Path) -> dict:
    """docker's equivalents of the pod spec: user, read-only root, dropped capabilities, no privilege
    escalation, emptyDirs as tmpfs (the memory-backed one at /dev/shm as the shm size), CPU and memory limits."""
    sc = container["securityContext"]
    tmpfs, shm_bytes = {}, None
    for mount in container["volumeMounts"]:
        empty_dir = volumes[mount["name"]]["emptyDir"]
        size = quantity_bytes(empty_dir.get("sizeLimit", "64Mi"))
        if mount["mountPath"] == "/dev/shm":
            assert empty_dir.get("medium") == "Memory"
            shm_bytes = size
        else:
            tmpfs[mount["mountPath"]] = f"size={size},mode=1777"
    limits = container["resources"]["limits"]
    return {
        "user": f"{sc['runAsUser']}:{sc['runAsGroup']}",
        "read_only": sc["readOnlyRootFilesystem"],
        "cap_drop": sc["capabilities"]["drop"],
        "security_opt": ["no-new-privileges"] if sc["allowPrivilegeEscalation"] is False else [],
        "tmpfs": tmpfs,
        "shm_size": shm_bytes,
        "nano_cpus": int(float(limits["cpu"]) * 1e9),
        "mem_limit": quantity_bytes(limits["memory"]),
        "environment": {e["name"]: e["value"] for e in container.get("env", [])},
        "volumes": {str(repo): {"bind": MODELS_MOUNT, "mode": "ro"}},
    }


def readable_by_anyone(repo: Path) -> Path:
    """The storage initializer leaves world-readable files; pytest's tmp dirs are private to root."""
    for path in [repo, *repo.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return repo


def probe_status(address: str, probe: dict) -> int:
    url = f"http://{address}{probe['httpGet']['path']}"
    try:
        with _OPENER.open(url, timeout=probe.get("timeoutSeconds", 1)) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0  # not listening yet: the kubelet counts a failure


def start_pod(client, image: str, repo: Path, extra_args: tuple[str, ...] = ()):
    container, volumes = runtime_container()
    options = docker_run_options(container, volumes, readable_by_anyone(repo))
    return run_container(client, image, [*container["args"], *extra_args], ports=(8080, 9000, 8002),
                         wait_ready=False, timeout_s=START_S, **options)


def test_probes_live_early_ready_after_load_and_drain_in_the_grace_period(docker_available, gt_image, tmp_path):
    container, _ = runtime_container()
    port = container["ports"][0]["containerPort"]
    startup, readiness = container["startupProbe"], container["readinessProbe"]
    repo = tmp_path / "repo"
    simple_model(repo)
    slow_model(repo)  # ~2 s of warmup before it is READY
    with start_pod(docker_available, gt_image, repo) as pod:
        address = pod.address(port)
        # the startup probe passes while the models still load: the listeners open first
        budget_s = startup["periodSeconds"] * startup["failureThreshold"]
        wait_until(lambda: probe_status(address, startup) == 200, budget_s, "the startup probe")
        assert probe_status(address, readiness) == 400, pod.logs()[-2000:]
        wait_until(lambda: probe_status(address, readiness) == 200, START_S, "the readiness probe")
        assert "CPU quota: 2 cores" in pod.logs()  # --cpus = the limit, read back from the cgroup
        started_s = time.monotonic()
        pod.container.kill(signal="SIGTERM")
        result = pod.container.wait(timeout=GRACE_S)
        assert result["StatusCode"] == 0, pod.logs()[-3000:]
        assert time.monotonic() - started_s < GRACE_S
        assert "shutting down: draining in-flight requests" in pod.logs()


def test_strict_readiness_keeps_a_failed_model_out_of_service(docker_available, gt_image, tmp_path):
    container, _ = runtime_container()
    port, readiness = container["ports"][0]["containerPort"], container["readinessProbe"]
    repo = tmp_path / "repo"
    simple_model(repo)
    broken_model(repo)
    with start_pod(docker_available, gt_image, repo, ("--exit-on-error=false",)) as pod:
        wait_until(lambda: "stays NOT READY" in pod.logs(), START_S, "the start-up to give up on 'broken'")
        address = pod.address(port)
        assert probe_status(address, container["livenessProbe"]) == 200  # not restarted ...
        assert probe_status(address, readiness) == 400  # ... but kept out of the Service's endpoints
        assert pod.running()


def test_a_model_that_fails_to_load_exits_the_container(docker_available, gt_image, tmp_path):
    repo = tmp_path / "repo"
    simple_model(repo)
    broken_model(repo)
    with start_pod(docker_available, gt_image, repo) as pod:
        result = pod.container.wait(timeout=START_S)
        assert result["StatusCode"] == 1
        assert "broken" in pod.logs() and "failed to load at start-up" in pod.logs()

