"""Issue #11 finding 14: the metrics port (/metrics, /status.json, the status page) follows the API's
auth. `server.metrics_auth`: same (default: the --auth-token), token (its own --metrics-token, e.g. a
scrape-only secret for Prometheus), none (explicit opt-out). Health on the HTTP port stays open.

Real gt-serve processes, raw HTTP over loopback.
"""
from __future__ import annotations

import base64
import http.client
import os
import subprocess
import sys

import pytest

from tests.conftest import start_server
from tests.integration.test_status_page import Tables, chromium

pytestmark = pytest.mark.security

TIMEOUT_S = 30.0
API_TOKEN = "api-s3cret"
SCRAPE_TOKEN = "scrape-only-s3cret"
METRICS_ROUTES = [("GET", "/metrics"), ("HEAD", "/metrics"), ("GET", "/status.json"), ("GET", "/"),
                  ("GET", "/status"), ("GET", "/no-such-route"), ("POST", "/metrics")]


def call(url: str, method: str, path: str, authorization: str | None = None) -> tuple[int, dict, bytes]:
    host, port = url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
    try:
        conn.request(method, path, headers={"Authorization": authorization} if authorization is not None else {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def bearer(token: str) -> str:
    return f"Bearer {token}"


def basic(token: str, user: str = "prometheus") -> str:
    return "Basic " + base64.b64encode(f"{user}:{token}".encode()).decode()


def wrong_credentials(token: str) -> list[str | None]:
    return [None, "", bearer("wrong"), bearer(token + "x"), bearer(token[:-1]), token, f"Token {token}",
            basic("wrong"), "Basic !!!not-base64!!!", "Basic " + base64.b64encode(token.encode()).decode(),
            bearer(API_TOKEN if token != API_TOKEN else SCRAPE_TOKEN)]


def assert_metrics_served(url: str, authorization: str | None) -> None:
    status, headers, body = call(url, "GET", "/metrics", authorization)
    assert status == 200 and b"nv_inference_request_success" in body
    assert headers["content-type"].startswith("text/plain")
    status, _, body = call(url, "GET", "/status.json", authorization)
    assert status == 200 and b'"lanes"' in body
    status, _, body = call(url, "GET", "/", authorization)
    assert status == 200 and b'id="lanes"' in body


def assert_metrics_refused(url: str, token: str) -> None:
    for method, path in METRICS_ROUTES:
        for authorization in wrong_credentials(token):
            status, headers, body = call(url, method, path, authorization)
            assert status == 401, (method, path, authorization, status)
            assert b"nv_inference" not in body and b"lanes" not in body
            scheme = "Basic" if path in ("/", "/status") else "Bearer"
            assert headers["www-authenticate"].startswith(scheme), headers


def assert_api_guarded_by(http_url: str, token: str) -> None:
    assert call(http_url, "GET", "/v2/health/live")[0] == 200
    assert call(http_url, "GET", "/v2/health/ready")[0] == 200
    assert call(http_url, "GET", "/v2/models/simple")[0] == 401
    assert call(http_url, "GET", "/v2/models/simple", bearer(token))[0] == 200


@pytest.fixture(scope="module")
def same_server(model_repo, tmp_path_factory):
    srv = start_server(model_repo, tmp_path_factory.mktemp("metrics_same"), "--auth-token", API_TOKEN)
    yield srv
    srv.stop()


def test_default_protects_the_metrics_port_with_the_api_token(same_server):
    url = same_server.metrics_url
    assert_metrics_refused(url, API_TOKEN)
    assert_metrics_served(url, bearer(API_TOKEN))
    assert_metrics_served(url, basic(API_TOKEN))  # a browser on the status page: any user, token as password
    assert_metrics_served(url, basic(API_TOKEN, user=""))
    status, headers, body = call(url, "HEAD", "/metrics", bearer(API_TOKEN))
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0
    assert call(url, "POST", "/metrics", bearer(API_TOKEN))[0] == 405  # routing only after auth
    assert call(url, "GET", "/no-such-route", bearer(API_TOKEN))[0] == 404
    assert_api_guarded_by(same_server.http_url, API_TOKEN)


def test_status_page_opens_in_a_browser_with_basic_credentials(same_server, tmp_path):
    """Chromium on http://user:TOKEN@host/: the page's HTML challenges with Basic, and its polls of
    /status.json carry the same credentials; without them the browser gets no data."""
    metrics_url = same_server.metrics_url
    done = chromium(tmp_path, "--virtual-time-budget=3000", "--dump-dom", f"http://viewer:{API_TOKEN}@{metrics_url}/")
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    page = Tables()
    page.feed(done.stdout.decode())
    assert page.body_attrs.get("data-ready") == "1", done.stdout.decode()[-3000:]
    assert "simple" in {row[0] for row in page.tables["models"]}
    done = chromium(tmp_path, "--virtual-time-budget=3000", "--dump-dom", f"http://{metrics_url}/")
    assert done.returncode == 0
    assert b'data-ready="1"' not in done.stdout and b'id="lanes"' not in done.stdout


@pytest.fixture(scope="module")
def scrape_token_server(model_repo, tmp_path_factory):
    srv = start_server(model_repo, tmp_path_factory.mktemp("metrics_token"), "--auth-token", API_TOKEN,
                       "--metrics-auth", "token", env={"GT_METRICS_TOKEN": SCRAPE_TOKEN})
    yield srv
    srv.stop()


def test_a_separate_scrape_token_guards_metrics_and_opens_nothing_else(scrape_token_server):
    url = scrape_token_server.metrics_url
    assert_metrics_refused(url, SCRAPE_TOKEN)  # includes the API token: not valid on the metrics port
    assert_metrics_served(url, bearer(SCRAPE_TOKEN))
    http_url = scrape_token_server.http_url
    assert call(http_url, "GET", "/v2/models/simple", bearer(SCRAPE_TOKEN))[0] == 401  # scrape-only
    assert_api_guarded_by(http_url, API_TOKEN)


def test_metrics_auth_none_is_an_explicit_opt_out(model_repo, tmp_path):
    with start_server(model_repo, tmp_path, "--auth-token", API_TOKEN, "--metrics-auth", "none") as srv:
        assert_metrics_served(srv.metrics_url, None)
        assert_api_guarded_by(srv.http_url, API_TOKEN)
        assert "metrics port is open" in srv.log()


@pytest.mark.parametrize("argv, words", [
    (["--metrics-auth", "token"], ["server.metrics_auth", "metrics_token"]),
    (["--metrics-token", SCRAPE_TOKEN], ["server.metrics_token", "--metrics-auth token"]),
    (["--metrics-auth", "none", "--metrics-token", SCRAPE_TOKEN], ["server.metrics_token", "'none'"]),
])
def test_inconsistent_metrics_auth_settings_refuse_to_start(argv, words, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "GT_METRICS_TOKEN"}
    done = subprocess.run([sys.executable, "-m", "gt_serve", "--host", "127.0.0.1", "--http-port", "0",
                           "--grpc-port", "0", "--metrics-port", "0", *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)  # a server that starts is killed
    assert done.returncode == 2, done.stderr
    for word in words:
        assert word in done.stderr
