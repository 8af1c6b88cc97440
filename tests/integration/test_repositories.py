"""Several model repositories, as Triton's repeated --model-repository: models of each load and serve, the index
lists them all, and a name in two repositories is no model (Triton's "not unique across all model repositories"):
its load fails with a 400 naming why, without the paths, and the rest serve on. In poll mode, taking away the second
copy makes the model load."""
from __future__ import annotations

import os

import pytest

from tests.conftest import start_server
from tests.integration.test_poll_mode import ROW, Client, _write_model, wait_until

POLL_S = 0.2


@pytest.fixture(scope="module")
def repositories(tmp_path_factory):
    first, second = tmp_path_factory.mktemp("repo_a"), tmp_path_factory.mktemp("repo_b")
    _write_model(first, "alpha", factor=2.0)
    _write_model(second, "beta", factor=3.0)
    _write_model(first, "twice", factor=4.0)
    _write_model(second, "twice", factor=5.0)
    return first, second


@pytest.fixture(scope="module")
def server(repositories, tmp_path_factory):
    first, second = repositories
    srv = start_server(first, tmp_path_factory.mktemp("srv_repos"), "--model-repository", str(second),
                       "--model-control-mode", "explicit", "--load-model", "alpha", "--load-model", "beta")
    client = Client(srv)
    yield srv, client
    client.close()
    srv.stop()


def test_models_of_each_repository_serve(server):
    _, client = server
    for name, factor in (("alpha", 2), ("beta", 3)):
        status, body = client.infer(name)
        assert status == 200 and body["outputs"][0]["data"] == [factor * x for x in ROW], body
    status, rows = client.call("POST", "/v2/repository/index", {})
    assert status == 200 and {r["name"] for r in rows} == {"alpha", "beta", "twice"}


def test_a_name_in_two_repositories_fails_its_load_and_the_rest_serve_on(server, repositories):
    srv, client = server
    status, body = client.call("POST", "/v2/repository/models/twice/load", {})
    assert status == 400 and body["error"] == ("failed to load 'twice': not unique across all model repositories "
                                               "(in 2 of them)"), body
    assert str(repositories[0]) not in body["error"]  # the paths are for the server's log
    assert all(str(r / "twice") in srv.log() for r in repositories)
    assert client.state("twice") == "UNAVAILABLE"
    assert client.infer("alpha")[0] == 200 and client.infer("beta")[0] == 200


def test_poll_mode_loads_the_name_once_one_copy_is_left(repositories, tmp_path_factory):
    first, second = repositories
    srv = start_server(first, tmp_path_factory.mktemp("srv_repos_poll"), "--model-repository", str(second),
                       "--model-control-mode", "poll", "--repository-poll-secs", str(POLL_S),
                       "--exit-on-error", "false", "--strict-readiness", "false")
    client = Client(srv)
    try:
        assert client.state("alpha") == "READY" and client.state("beta") == "READY"
        assert client.state("twice") == "UNAVAILABLE"
        os.rename(second / "twice", second / ".twice")  # a hidden name is no model directory
        wait_until("'twice' READY", lambda: client.state("twice") == "READY")
        status, body = client.infer("twice")
        assert status == 200 and body["outputs"][0]["data"] == [4 * x for x in ROW], body
        os.rename(second / ".twice", second / "twice")  # a second copy appears: Triton unloads the one serving
        wait_until("'twice' UNAVAILABLE", lambda: client.state("twice") == "UNAVAILABLE")
        status, body = client.infer("twice")
        assert status == 503 and "not unique across all model repositories" in body["error"], body
        rows = [r for r in client.call("POST", "/v2/repository/index", {})[1] if r["name"] == "twice"]
        assert "not unique" in rows[0]["reason"], rows  # the index says why too
        assert client.state("alpha") == "READY"  # the others serve on
    finally:
        if (second / ".twice").exists():
            os.rename(second / ".twice", second / "twice")
        client.close()
        srv.stop()
