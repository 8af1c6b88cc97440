"""server.workers > 1: one server made of several gt-serve processes, each with its own event loop, GIL, lanes and
copy of the models, serving the same HTTP and gRPC ports.

The supervisor holds the ports (bound, not listening: port 0 becomes one port for all), starts the workers with the
same arguments and those ports, and each worker listens on them with SO_REUSEPORT, so the kernel spreads the
connections over the workers. The workers keep each other in step over protocol/worker_link.py: model control
and shared memory reach all of them, statistics and metrics show all of them, and none reports ready before all
are. Worker 0 alone serves the metrics port.

The supervisor writes the port file once every worker listens, passes SIGTERM and SIGINT on, and exits with the
first failing worker's status. A worker that exits while the others serve stops the whole server, so that what
runs it (systemd, Kubernetes, Docker) restarts it whole: a server with a missing worker would keep its share of
the connections unanswered.
"""
from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .config import Config, write_port_file
from .protocol.worker_link import WorkerSpec

log = logging.getLogger("gt_serve.supervisor")


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to host:port with SO_REUSEPORT, not listening: the workers bind beside it. A port that a
    server already listens on is refused (EADDRINUSE) as it would be without workers: SO_REUSEPORT alone would
    let this server share it with another of the same user."""
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if port:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def _die_with_parent() -> None:
    """In the worker before it runs (Linux): SIGTERM when the supervisor dies, however it dies (SIGKILL
    too), so that no worker keeps serving a share of the ports for a server that is gone."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: a supervisor killed outright leaves its workers
        return
    if os.getppid() == 1:  # the supervisor died before the prctl: nobody would signal this worker
        os._exit(1)


_PR_SET_PDEATHSIG = 1


class Supervisor:
    def __init__(self, cfg: Config, argv: list[str]) -> None:
        self.cfg = cfg
        self.argv = list(argv)
        self.directory = Path(tempfile.mkdtemp(prefix="gt_serve_workers_"))  # mode 0700: the link's sockets
        self.sockets: dict[str, socket.socket] = {}
        self.children: list[subprocess.Popen] = []
        self.stopping = False
        self.status = 0  # the first failing worker's exit status

    def _worker_command(self, index: int) -> list[str]:
        s = self.cfg.server
        args = [sys.executable, "-m", "gt_serve", *self.argv,
                "--port-file", str(self.directory / f"ports-{index}.json")]
        for name in ("http", "grpc"):
            if name in self.sockets:
                args += [f"--{name}-port", str(self.sockets[name].getsockname()[1])]
        if index > 0 and s.allow_metrics:
            args += ["--allow-metrics", "false"]
        return args

    def start(self) -> None:
        s = self.cfg.server
        for name, allowed, port in (("http", s.allow_http, s.http_port), ("grpc", s.allow_grpc, s.grpc_port)):
            if allowed:
                self.sockets[name] = reserve_port(s.host, port)
        for index in range(s.workers):
            env = {**os.environ, **WorkerSpec(self.directory, index, s.workers).environ()}
            self.children.append(subprocess.Popen(self._worker_command(index), env=env, preexec_fn=_die_with_parent))
        log.info("gt-serve: %d workers (pids %s) on HTTP %s, gRPC %s", s.workers,
                 ", ".join(str(c.pid) for c in self.children), self._port("http"), self._port("grpc"))

    def _port(self, name: str) -> int | None:
        return self.sockets[name].getsockname()[1] if name in self.sockets else None

    def stop(self, *_: object) -> None:
        """SIGTERM to every worker still running: each drains its own requests (server.drain_timeout_s)."""
        self.stopping = True
        for child in self.children:
            if child.returncode is None:
                child.send_signal(signal.SIGTERM)

    def reap(self, block: bool) -> None:
        """The exits of workers that have ended (os.waitpid: every exit is seen here, once); one that ends while
        the server runs stops the others."""
        flags = 0 if block else os.WNOHANG
        while True:
            try:
                pid, raw = os.waitpid(-1, flags)
            except ChildProcessError:  # no worker left
                return
            if pid == 0:
                return
            code = os.waitstatus_to_exitcode(raw)
            for child in self.children:
                if child.pid == pid:
                    child.returncode = code
            if code != 0 and self.status == 0:
                self.status = code if code > 0 else 1
            if not self.stopping:
                log.error("gt-serve: worker pid %d exited (status %d): stopping the other workers", pid, code)
                self.stop()
            flags = os.WNOHANG  # after one exit, collect the others that have ended without waiting

    def _write_port_file(self) -> bool:
        """Once every worker has written its ports: the server's ports (worker 0's metrics port). False: a worker
        exited first."""
        files = [self.directory / f"ports-{i}.json" for i in range(len(self.children))]
        while not all(f.exists() for f in files):
            self.reap(block=False)
            if self.stopping:
                return False
            time.sleep(0.02)  # a process's start-up, seen from outside: no event to wait on
        write_port_file(self.cfg.server.port_file, json.loads(files[0].read_text()))
        return True

    def wait(self) -> int:
        """Until every worker has exited; the first non-zero status (a worker's failure stops the others)."""
        self._write_port_file()
        while any(c.returncode is None for c in self.children):
            self.reap(block=True)
        return self.status

    def close(self) -> None:
        for sock in self.sockets.values():
            sock.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def supervise(cfg: Config, argv: list[str]) -> int:
    """Run the server as cfg.server.workers processes until SIGTERM / SIGINT; the exit status."""
    supervisor = Supervisor(cfg, argv)
    signal.signal(signal.SIGTERM, supervisor.stop)
    signal.signal(signal.SIGINT, supervisor.stop)
    try:
        supervisor.start()
        return supervisor.wait()
    finally:
        supervisor.stop()
        while any(c.returncode is None for c in supervisor.children):
            supervisor.reap(block=True)
        supervisor.close()
