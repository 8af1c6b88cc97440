"""Issue #15: the fleet's links over TLS. Peers forward to each other over mutual TLS (cluster.tls_*: the
cluster CA, the node's certificate), their gRPC ports require client certificates from that CA, and the
telemetry goes to a real mosquitto over TLS with client certificates (telemetry.tls_*).

A peer whose gRPC certificate comes from another CA (an insider with the cluster key but no cluster
certificate, or an impostor on a stolen address) never receives a request: the handshake fails on the
forwarding side before anything is sent, and the request is served by another peer.
Certificates are made at test time (gt_serve/testing/tls_certs.py); everything runs on loopback.
"""
from __future__ import annotations

import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.cluster_nodes import EdgeCluster, simple_inputs, status
from gt_serve.testing.mosquitto import Mosquitto, mosquitto_binary
from gt_serve.testing.mosquitto import TestPki as BrokerPki
from gt_serve.testing.tls_certs import TestCA

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(mosquitto_binary() is None,
                       reason="mosquitto binary not installed (apt-get install mosquitto): cluster tests need a real broker"),
]

WAIT_S = 15.0
REQUESTS = 40


def grpc_tls_yaml(cert, key, root=None) -> str:
    """The node YAML's server section: gRPC over TLS, client certificates from `root` required when given."""
    keys = [("grpc_use_ssl", "true"), ("grpc_server_cert", f"'{cert}'"), ("grpc_server_key", f"'{key}'")]
    if root is not None:
        keys += [("grpc_use_ssl_mutual", "true"), ("grpc_root_cert", f"'{root}'")]
    return "server: {" + ", ".join(f"{k}: {v}" for k, v in keys) + "}\n"


def success_count(node, model: str) -> float:
    with urllib.request.urlopen(f"http://{node.metrics_url}/metrics", timeout=5) as r:
        for family in text_string_to_metric_families(r.read().decode()):
            for sample in family.samples:
                if sample.name.removesuffix("_total") == "nv_inference_request_success" \
                        and sample.labels.get("model") == model:
                    return sample.value
    return 0.0


def infer_simple(node, count: int) -> dict[str, int]:
    client = httpclient.InferenceServerClient(node.http_url, network_timeout=WAIT_S)
    served: dict[str, int] = {}
    try:
        for value in range(count):
            result = client.infer("simple", simple_inputs(httpclient, value))
            assert int(result.as_numpy("OUTPUT0")[0, 0]) == value + 1
            by = result.get_response()["parameters"]["gt_served_by"]
            served[by] = served.get(by, 0) + 1
    finally:
        client.close()
    return served


@pytest.fixture
def pki(tmp_path):
    cluster, other = TestCA(tmp_path / "ca", "cluster-ca"), TestCA(tmp_path / "other", "other-ca")
    leaves = {name: cluster.leaf(name) for name in ("broker", "mqtt-client", "entry", "good")}
    return {"ca": cluster.cert, "other_ca": other.cert, "rogue": other.leaf("rogue"), **leaves}


def tls_cluster(tmp_path, pki) -> EdgeCluster:
    broker_pki = BrokerPki(pki["ca"], pki["broker"].cert, pki["broker"].key, pki["mqtt-client"].cert,
                         pki["mqtt-client"].key)
    broker = Mosquitto(tmp_path / "broker", tls=broker_pki, require_client_cert=True)
    telemetry = {"tls_ca_file": str(pki["ca"]), "tls_cert_file": str(pki["mqtt-client"].cert),
                 "tls_key_file": str(pki["mqtt-client"].key)}
    per_node = {name: {"tls_cert_file": str(pki[name].cert), "tls_key_file": str(pki[name].key)}
                for name in ("entry", "good", "rogue")}
    per_node["rogue"]["tls_ca_file"] = str(pki["other_ca"])
    return EdgeCluster(tmp_path, "tls", telemetry=telemetry, broker=broker, per_node=per_node,
                       cluster_opts={"tls_ca_file": str(pki["ca"])})


def test_forwarding_over_mutual_tls_never_reaches_a_peer_of_another_ca(tmp_path, pki):
    with tls_cluster(tmp_path, pki) as cluster:
        extra = {name: grpc_tls_yaml(pki[name].cert, pki[name].key, pki["ca"]) for name in ("entry", "good")}
        extra["rogue"] = grpc_tls_yaml(pki["rogue"].cert, pki["rogue"].key)  # serves TLS, with the wrong CA
        entry, good, rogue = cluster.start({"entry": ["classifier"], "good": ["simple"], "rogue": ["simple"]},
                                           extra=extra)
        # telemetry over TLS (client certificates) works: every node sees the others, and sees they speak TLS
        cluster.wait_mesh(timeout_s=WAIT_S)
        served = infer_simple(entry, REQUESTS)
        assert served == {"good": REQUESTS}, served
        assert success_count(rogue, "simple") == 0, "a peer with another CA's certificate was sent requests"
        assert success_count(good, "simple") == REQUESTS
        routes = status(entry)
        print(f"\nfleet TLS: served {served}; entry routes {routes.get('routes')}, rerouted {routes.get('rerouted')}")


def test_peer_with_foreign_certificate_alone_gets_nothing(tmp_path, pki):
    """With only the foreign-CA peer serving the model, requests fail cleanly rather than go to it."""
    with tls_cluster(tmp_path, pki) as cluster:
        extra = {"entry": grpc_tls_yaml(pki["entry"].cert, pki["entry"].key, pki["ca"]),
                 "rogue": grpc_tls_yaml(pki["rogue"].cert, pki["rogue"].key)}
        entry, rogue = cluster.start({"entry": ["classifier"], "rogue": ["simple"]}, extra=extra)
        cluster.wait_peers(entry, live={"rogue"}, timeout_s=WAIT_S)
        client = httpclient.InferenceServerClient(entry.http_url, network_timeout=WAIT_S)
        try:
            for _ in range(5):
                inputs = []
                for name in ("INPUT0", "INPUT1"):
                    inp = httpclient.InferInput(name, [1, 16], "INT32")
                    inp.set_data_from_numpy(np.ones((1, 16), np.int32))
                    inputs.append(inp)
                with pytest.raises(Exception) as failed:
                    client.infer("simple", inputs)
                assert "rogue" in str(failed.value) or "unavailable" in str(failed.value).lower(), failed.value
        finally:
            client.close()
        assert success_count(rogue, "simple") == 0
        assert entry.proc.poll() is None and rogue.proc.poll() is None

