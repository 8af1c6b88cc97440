"""Two network namespaces joined by a veth pair, made (and removed) by a test: a private /30 that exists
only inside them, `tc netem` delay/loss on the link (where the kernel has sch_netem; else a cut link is
an iptables DROP of everything arriving on it, both ends, and delay is not applied: ``net.netem`` says
which), and a worker thread per namespace (setns) whose sockets and child processes live in that
namespace.

    with NetnsPair("gtp") as net:
        net.a.run(fn, ...)      # fn runs on a thread inside namespace a (children it spawns too)
        net.impair(loss_pct=100)  # partition;  net.impair(delay_ms=20) ;  net.impair() heals
"""
from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

CLONE_NEWNET = 0x40000000


def netns_unavailable() -> str | None:
    """Why namespaces cannot be made here (None when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"'{tool}' not installed (apt-get install iproute2)"
    probe = f"gtprobe{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=10)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()[:200]}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=10)
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


class Namespace:
    def __init__(self, name: str, address: str, dev: str) -> None:
        self.name = name
        self.address = address
        self.dev = dev
        self._pool: ThreadPoolExecutor | None = None

    def _enter(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/var/run/netns/{self.name}", os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {self.name} failed")
        finally:
            os.close(fd)

    def start(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix=f"netns-{self.name}",
                                        initializer=self._enter)

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float = 120.0, **kwargs: Any) -> Any:
        """fn(*args, **kwargs) on a thread inside this namespace; its result."""
        assert self._pool is not None
        return self._pool.submit(fn, *args, **kwargs).result(timeout=timeout_s)

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any):
        assert self._pool is not None
        return self._pool.submit(fn, *args, **kwargs)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


class NetnsPair:
    """Namespaces PREFIX-a (10.213.7.1/30) and PREFIX-b (10.213.7.2/30), a veth between them."""

    def __init__(self, prefix: str) -> None:
        tag = secrets.token_hex(2)
        self.a = Namespace(f"{prefix}{tag}a", "10.213.7.1", f"v{tag}a")
        self.b = Namespace(f"{prefix}{tag}b", "10.213.7.2", f"v{tag}b")
        self.netem: bool | None = None  # known after the first impair()
        self._dropping = False

    def __enter__(self) -> "NetnsPair":
        try:
            for ns in (self.a, self.b):
                _ip("netns", "add", ns.name)
            _ip("link", "add", self.a.dev, "netns", self.a.name, "type", "veth", "peer", "name", self.b.dev,
                "netns", self.b.name)
            for ns in (self.a, self.b):
                _ip("-n", ns.name, "addr", "add", f"{ns.address}/30", "dev", ns.dev)
                _ip("-n", ns.name, "link", "set", ns.dev, "up")
                _ip("-n", ns.name, "link", "set", "lo", "up")
                ns.start()
        except Exception:
            self.close()
            raise
        return self

    def impair(self, *, delay_ms: float = 0.0, loss_pct: float = 0.0) -> None:
        """netem on both ends of the link (no arguments: a clean link)."""
        if self.netem is None:
            self.netem = self._try_netem()
        if not self.netem:
            self._drop(loss_pct >= 100)
            return
        for ns in (self.a, self.b):
            subprocess.run(["ip", "netns", "exec", ns.name, "tc", "qdisc", "del", "dev", ns.dev, "root"],
                           capture_output=True, timeout=10)
            if delay_ms or loss_pct:
                cmd = ["ip", "netns", "exec", ns.name, "tc", "qdisc", "add", "dev", ns.dev, "root", "netem"]
                if delay_ms:
                    cmd += ["delay", f"{delay_ms}ms"]
                if loss_pct:
                    cmd += ["loss", f"{loss_pct}%"]
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
                if done.returncode != 0:
                    raise RuntimeError(f"tc netem: {done.stderr.strip()}")

    def _try_netem(self) -> bool:
        cmd = ["ip", "netns", "exec", self.a.name, "tc", "qdisc", "add", "dev", self.a.dev, "root", "netem",
               "delay", "1ms"]
        ok = subprocess.run(cmd, capture_output=True, timeout=10).returncode == 0
        subprocess.run(["ip", "netns", "exec", self.a.name, "tc", "qdisc", "del", "dev", self.a.dev, "root"],
                       capture_output=True, timeout=10)
        return ok

    def _drop(self, on: bool) -> None:
        if on == self._dropping or shutil.which("iptables") is None:
            if shutil.which("iptables") is None:
                raise RuntimeError("neither tc netem nor iptables can cut the link here")
            return
        for ns in (self.a, self.b):
            done = subprocess.run(["ip", "netns", "exec", ns.name, "iptables", "-A" if on else "-D", "INPUT",
                                   "-i", ns.dev, "-j", "DROP"], capture_output=True, text=True, timeout=10)
            if done.returncode != 0:
                raise RuntimeError(f"iptables: {done.stderr.strip()}")
        self._dropping = on

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for ns in (self.a, self.b):
            ns.close()
            subprocess.run(["ip", "netns", "del", ns.name], capture_output=True, timeout=10)
