"""Start `gt-serve` as a child process on free ports and wait until it is ready.

Used by the tests, the benchmarks, the soak run and anyone embedding a server in a script:
    with launch(["--model-repository", "models"]) as srv: print(srv.http_url)
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ..tls import TlsFiles, client_context


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    ports: dict
    log_path: Path
    args: list = field(default_factory=list)
    repo: Path | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.ports['http']}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports['grpc']}"

    @property
    def metrics_url(self) -> str:
        return f"127.0.0.1:{self.ports['metrics']}"

    def log(self) -> str:
        try:
            return self.log_path.read_text()
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def launch(args: list[str], *, workdir: Path | None = None, env: dict | None = None, timeout_s: float = 90.0,
           repo: Path | None = None, poll_s: float = 0.05, command: list[str] | None = None,
           wait_ready: bool = True, tls_ca: str | Path | None = None,
           tls_client: tuple[str | Path, str | Path] | None = None) -> ServerProcess:
    """Run `python -m gt_serve ARGS` (or `command ARGS`, any server taking gt-serve's flags) bound to
    127.0.0.1 on free ports; return once /v2/health/ready is 200 (wait_ready=False: once the listeners are
    open and the ports known, models possibly still loading). With `tls_ca` the readiness probe speaks HTTPS
    trusting that CA, presenting `tls_client` (certificate, key) when given (--http-use-ssl-mutual)."""
    workdir = Path(workdir or tempfile.mkdtemp(prefix="gt_serve_run_"))
    stamp = time.monotonic_ns()
    port_file = workdir / f"ports-{stamp}.json"
    log_path = workdir / f"server-{stamp}.log"
    defaults = {"--http-port": "0", "--grpc-port": "0", "--metrics-port": "0", "--host": "127.0.0.1"}
    full = list(command) if command else [sys.executable, "-m", "gt_serve"]
    for flag, value in defaults.items():
        if flag not in args:
            full += [flag, value]
    full += ["--port-file", str(port_file), *args]
    child_env = dict(os.environ)
    src_root = str(Path(__file__).resolve().parents[2])  # the directory holding the gt_serve package
    child_env["PYTHONPATH"] = src_root + os.pathsep + child_env.get("PYTHONPATH", "")
    if env:
        child_env.update(env)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(full, stdout=log, stderr=subprocess.STDOUT, env=child_env, cwd=str(workdir))
    deadline = time.monotonic() + timeout_s
    server = None
    while time.monotonic() < deadline and server is None:
        if proc.poll() is not None:
            raise RuntimeError(f"gt-serve exited with {proc.returncode}:\n{log_path.read_text()}")
        ports = _read_ports(port_file)
        if ports:
            server = ServerProcess(proc, ports, log_path, full, repo)
        else:
            time.sleep(poll_s)  # polling a child process's progress, re-checked each turn
    if server is None:
        proc.kill()
        raise RuntimeError(f"gt-serve wrote no port file within {timeout_s}s:\n{log_path.read_text()}")
    if not wait_ready:
        return server
    opener, scheme = _opener(tls_ca, tls_client)
    while time.monotonic() < deadline:
        try:
            with opener.open(f"{scheme}://{server.http_url}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return server
        except OSError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(poll_s)
    server.stop(signal.SIGKILL)
    raise RuntimeError(f"gt-serve never became ready:\n{server.log()}")


def _opener(tls_ca, tls_client) -> tuple[urllib.request.OpenerDirector, str]:
    handlers: list = [urllib.request.ProxyHandler({})]  # loopback: never via a proxy
    if tls_ca is None:
        return urllib.request.build_opener(*handlers), "http"
    cert, key = (str(tls_client[0]), str(tls_client[1])) if tls_client is not None else (None, None)
    ctx = client_context(TlsFiles(cert_file=cert, key_file=key, root_file=str(tls_ca), what="launcher TLS"))
    return urllib.request.build_opener(*handlers, urllib.request.HTTPSHandler(context=ctx)), "https"


def _read_ports(port_file: Path) -> dict | None:
    try:
        return json.loads(port_file.read_text())
    except (FileNotFoundError, ValueError):  # not there yet, or not completely written
        return None
