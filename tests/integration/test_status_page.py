"""The live status page rendered by a real headless Chromium against a real gt-serve process.

The page fetches /status.json and fills its tables, then sets document.body.dataset.ready = "1";
`--dump-dom` with a virtual-time budget prints the DOM once the page's JS has run.
Needs a Chromium binary (Debian: `apt-get install chromium`); skipped with a clear message otherwise.
"""
from __future__ import annotations

import html.parser
import json
import re
import shutil
import subprocess
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
CHROMIUM_TIMEOUT_S = 90.0


def chromium_binary() -> str | None:
    for name in CHROMIUM_CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    binary = chromium_binary()
    if binary is None:
        pytest.skip("no chromium binary found: install it (Debian: apt-get install -y chromium; "
                    "add 'chromium' to the apt-get line in .ci/run)")
    cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
           f"--user-data-dir={tmp_path / 'chromium-profile'}", *args]
    return subprocess.run(cmd, capture_output=True, timeout=CHROMIUM_TIMEOUT_S, cwd=tmp_path)


class Tables(html.parser.HTMLParser):
    """Collects the text of every <td> row, per table id, and the <body> attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.body_attrs: dict[str, str] = {}
        self._table: str | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "body":
            self.body_attrs = {k: v or "" for k, v in attrs.items()}
        elif tag == "table":
            self._table = attrs.get("id")
            self.tables.setdefault(self._table, [])
        elif tag == "tr" and self._table is not None:
            self._row = []
        elif tag == "td" and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            if self._row:
                self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


@pytest.fixture(scope="module")
def served(server):
    """Three successful infers on `simple` so its row shows counts."""
    with httpclient.InferenceServerClient(server.http_url) as client:
        for _ in range(3):
            inputs = []
            for name in ("INPUT0", "INPUT1"):
                i = httpclient.InferInput(name, [1, 16], "INT32")
                i.set_data_from_numpy(np.ones((1, 16), np.int32))
                inputs.append(i)
            client.infer("simple", inputs)
    return server


def test_status_page_renders_lanes_and_models(served, tmp_path):
    url = f"http://{served.metrics_url}/"
    with urllib.request.urlopen(url + "status.json", timeout=30) as r:
        assert r.status == 200  # the page's data source answers before the browser looks
        status = json.loads(r.read())
    done = chromium(tmp_path, "--virtual-time-budget=3000", "--run-all-compositor-stages-before-draw",
                    "--dump-dom", url)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    dom = done.stdout.decode()
    page = Tables()
    page.feed(dom)
    assert page.body_attrs.get("data-ready") == "1", f"the page never loaded /status.json:\n{dom[-3000:]}"
    lanes = {row[0]: row for row in page.tables["lanes"]}
    assert "cpu.0" in lanes, page.tables
    assert lanes["cpu.0"][1] == "cpu" and lanes["cpu.0"][2] in ("idle", "busy")
    # batches, launched: what /status.json says (a request of `simple`, which does not batch, may be launched into
    # onnxruntime's pool when it went through the queue: lanes.launch)
    (books,) = [lane for lane in status["lanes"] if lane["id"] == "cpu.0"]
    assert int(lanes["cpu.0"][3]) >= 3 and lanes["cpu.0"][4] == str(books["launched"])
    models = {(row[0], row[1]): row for row in page.tables["models"]}
    assert ("simple", "1") in models, page.tables
    simple = models[("simple", "1")]
    # model, version, state, queue, requests ok, failed, inferences, executions, provider
    assert simple[2] == "READY"
    assert int(simple[4]) == 3 and int(simple[5]) == 0 and int(simple[6]) == 3
    assert simple[8] in ("CPUExecutionProvider", "CUDAExecutionProvider")
    assert ("classifier", "1") in models
    err = re.search(r'<span id="err">(.*?)</span>', dom)
    assert err is not None and err.group(1) == "", err and err.group(1)
    assert re.search(r'<small id="updated">updated ', dom)


def test_status_page_screenshot(served, tmp_path):
    shot = tmp_path / "status.png"
    done = chromium(tmp_path, "--virtual-time-budget=3000", "--window-size=1200,900",
                    f"--screenshot={shot}", f"http://{served.metrics_url}/")
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000  # a rendered page with tables, not a blank canvas
