"""A real mosquitto broker for tests and benchmarks, on a free 127.0.0.1 port (moved from tests/integration/
so that bench/ never imports tests/).

Readiness is detected by connecting (short, growing pauses that end early if the process
exits), never by a fixed sleep. ``restart()`` brings it back on the same port; ``pause()`` / ``resume()`` freeze
and thaw it (SIGSTOP / SIGCONT).
"""
from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


def mosquitto_binary() -> str | None:
    return shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if os.access(p, os.X_OK)),
        None)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class TestPki:
    """A throw-away CA with a server certificate for 127.0.0.1 and one client certificate."""

    ca_file: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_test_pki(workdir: Path) -> TestPki:
    """The PKI made by gt_serve.testing.tls_certs (EC P-256): a server certificate for 127.0.0.1 and a
    client certificate, signed by one throw-away CA."""
    from .tls_certs import TestCA  # cryptography: a test dependency, needed only for a TLS broker

    ca = TestCA(Path(workdir), name="gt-serve-test-ca")
    server = ca.leaf("server", hosts=("127.0.0.1",))
    client = ca.leaf("client")
    return TestPki(ca.cert, server.cert, server.key, client.cert, client.key)


class Mosquitto:
    host = "127.0.0.1"

    def __init__(self, workdir: Path, *, port: int | None = None,
                 users: dict[str, str] | None = None, binary: str | None = None,
                 tls: TestPki | None = None, require_client_cert: bool = False) -> None:
        self.binary = binary or mosquitto_binary()
        if self.binary is None:
            raise FileNotFoundError("mosquitto binary not found")
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.users = dict(users or {})
        self.tls = tls
        self.require_client_cert = require_client_cert
        self.conf_path = self.workdir / "mosquitto.conf"
        self.log_path = self.workdir / "mosquitto.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._write_conf()

    def _write_conf(self) -> None:
        lines = [f"listener {self.port} {self.host}", "persistence false",
                 f"log_dest file {self.log_path}",
                 "log_type error", "log_type warning", "log_type notice",
                 "max_keepalive 65535"]
        if self.tls is not None:
            lines += [f"cafile {self.tls.ca_file}", f"certfile {self.tls.server_cert}",
                      f"keyfile {self.tls.server_key}",
                      f"require_certificate {str(self.require_client_cert).lower()}"]
        if os.geteuid() == 0:
            lines.append(f"user {getpass.getuser()}")  # do not drop to 'mosquitto'
        if self.users:
            passwd = self.workdir / "passwd"
            passwd.write_text("")
            tool = shutil.which("mosquitto_passwd")
            if tool is None:
                raise FileNotFoundError("mosquitto_passwd not found")
            for user, password in self.users.items():
                subprocess.run([tool, "-b", str(passwd), user, password], check=True,
                               capture_output=True, timeout=10)
            lines += ["allow_anonymous false", f"password_file {passwd}"]
        else:
            lines.append("allow_anonymous true")
        self.conf_path.write_text("\n".join(lines) + "\n")

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout_s: float = 10.0) -> "Mosquitto":
        if self.running:
            return self
        self._proc = subprocess.Popen([self.binary, "-c", str(self.conf_path)],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        assert self._proc is not None
        deadline_s = time.monotonic() + timeout_s
        pause_s = 0.005
        while True:
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return
            except OSError:
                pass
            if time.monotonic() >= deadline_s:
                self.stop()
                raise TimeoutError(f"mosquitto not accepting on {self.port}: {self.log_tail()}")
            try:  # pause, but wake at once if the broker exited
                code = self._proc.wait(timeout=pause_s)
            except subprocess.TimeoutExpired:
                pause_s = min(pause_s * 2, 0.1)
                continue
            raise RuntimeError(f"mosquitto exited with {code}: {self.log_tail()}")

    def pause(self) -> None:
        """Freeze the broker (SIGSTOP): its sockets stay open but nothing is read or delivered, as when
        a broker's container goes away without closing them; clients notice only by their keepalive."""
        assert self._proc is not None and self.running
        self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.running:
            self._proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]

    def stop(self, timeout_s: float = 5.0) -> None:
        self.resume()  # a paused broker would not act on SIGTERM
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout_s)

    def restart(self, timeout_s: float = 10.0) -> "Mosquitto":
        self.stop()
        return self.start(timeout_s)

    def log_tail(self, max_chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-max_chars:]
        except OSError:
            return "(no log)"

    def __enter__(self) -> "Mosquitto":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
