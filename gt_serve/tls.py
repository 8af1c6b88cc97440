"""TLS settings for the serving ports and the fleet's links: one place that reads certificate files,
builds `ssl.SSLContext`s and turns every file problem into a ConfigError naming the file (exit 2).

Foundation module (stdlib `ssl` only): protocol (HTTP, native gRPC, grpcio) and edge (peer client) use it.
"""
from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError


@dataclass(frozen=True)
class TlsFiles:
    """A listener's or a client's certificate files (PEM). `root_file`: the CA that peer certificates must
    chain to (server: client certificates when `mutual`; client: the server's certificate)."""

    cert_file: str | None = None
    key_file: str | None = None
    root_file: str | None = None
    mutual: bool = False
    what: str = "TLS"  # names the setting in errors: "HTTP TLS", "gRPC TLS", "cluster TLS"


def read_pem(path: str | None, what: str, role: str) -> bytes | None:
    """The bytes of a PEM file (None for no path); ConfigError naming the file when it cannot be read."""
    if not path:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read the {role} file '{path}': {exc.strerror}") from None
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{what}: the {role} file '{path}' is not PEM (no '-----BEGIN' line)")
    return data


def _load_chain(ctx: ssl.SSLContext, files: TlsFiles) -> None:
    read_pem(files.cert_file, files.what, "certificate")
    read_pem(files.key_file, files.what, "private key")
    try:
        ctx.load_cert_chain(files.cert_file, files.key_file)
    except ssl.SSLError as exc:
        raise ConfigError(f"{files.what}: certificate '{files.cert_file}' and private key '{files.key_file}' "
                          f"do not load as a pair: {exc.reason or exc}") from None


def _load_root(ctx: ssl.SSLContext, files: TlsFiles) -> None:
    read_pem(files.root_file, files.what, "root certificate")
    try:
        ctx.load_verify_locations(cafile=files.root_file)
    except ssl.SSLError as exc:
        raise ConfigError(f"{files.what}: root certificate '{files.root_file}' does not load: "
                          f"{exc.reason or exc}") from None


def server_context(files: TlsFiles, alpn: tuple[str, ...]) -> ssl.SSLContext:
    """A server context (TLS 1.2+) offering `alpn`; with `mutual`, client certificates chaining to
    `root_file` are required."""
    if not files.cert_file or not files.key_file:
        raise ConfigError(f"{files.what} is on but the server certificate and key are not both set")
    if files.mutual and not files.root_file:
        raise ConfigError(f"{files.what}: mutual TLS needs the root certificate (the CA of the client certificates)")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(ctx, files)
    if files.root_file:
        _load_root(ctx, files)
    ctx.verify_mode = ssl.CERT_REQUIRED if files.mutual else ssl.CERT_NONE
    ctx.set_alpn_protocols(list(alpn))
    return ctx


def client_context(files: TlsFiles, alpn: tuple[str, ...] = ()) -> ssl.SSLContext:
    """A client context that verifies the server against `root_file` (the system CAs without one) and
    presents `cert_file`/`key_file` when set."""
    if files.root_file:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the certificate and the host name
        _load_root(ctx, files)
    else:
        ctx = ssl.create_default_context()
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if files.cert_file or files.key_file:
        _load_chain(ctx, files)
    if alpn:
        ctx.set_alpn_protocols(list(alpn))
    return ctx


def validate_server_tls(s) -> None:
    """The TLS keys of a config.ServerConfig hang together (files are read at start-up)."""
    for port in ("http", "grpc"):
        if getattr(s, f"{port}_use_ssl") or getattr(s, f"{port}_use_ssl_mutual"):
            if not (getattr(s, f"{port}_server_cert") and getattr(s, f"{port}_server_key")):
                raise ConfigError(f"config key 'server.{port}_use_ssl' needs 'server.{port}_server_cert' and "
                                  f"'server.{port}_server_key' (--{port}-server-cert, --{port}-server-key)")
        if getattr(s, f"{port}_use_ssl_mutual") and not getattr(s, f"{port}_root_cert"):
            raise ConfigError(f"config key 'server.{port}_use_ssl_mutual' needs 'server.{port}_root_cert' "
                              "(the CA of the client certificates)")
    if s.metrics_use_ssl and not (s.http_server_cert and s.http_server_key):
        raise ConfigError("config key 'server.metrics_use_ssl' uses the HTTP certificate: set "
                          "'server.http_server_cert' and 'server.http_server_key'")


@dataclass(frozen=True)
class PemSet:
    """The PEM bytes grpcio takes (`grpc.ssl_server_credentials`, `ssl_channel_credentials`)."""

    cert: bytes | None
    key: bytes | None
    root: bytes | None


def pem_set(files: TlsFiles, *, server: bool) -> PemSet:
    """Checks the files as `server_context`/`client_context` do (clear errors before grpcio sees them),
    then returns their bytes."""
    if server:
        server_context(files, ("h2",))
    else:
        client_context(files)
    return PemSet(read_pem(files.cert_file, files.what, "certificate"),
                  read_pem(files.key_file, files.what, "private key"),
                  read_pem(files.root_file, files.what, "root certificate"))


def listener_files(s, port: str) -> TlsFiles | None:
    """The TLS files of a config.ServerConfig's `port` ("http" or "grpc"); None when TLS is off there."""
    mutual = bool(getattr(s, f"{port}_use_ssl_mutual"))
    if not (getattr(s, f"{port}_use_ssl") or mutual):
        return None
    return TlsFiles(getattr(s, f"{port}_server_cert"), getattr(s, f"{port}_server_key"),
                    getattr(s, f"{port}_root_cert"), mutual, what=f"{'HTTP' if port == 'http' else 'gRPC'} TLS")


def metrics_files(s) -> TlsFiles | None:
    """The metrics port serves the HTTP certificate when `metrics_use_ssl` (never asks for client certificates:
    Prometheus scrapes with a CA, rarely with a client certificate)."""
    if not s.metrics_use_ssl:
        return None
    return TlsFiles(s.http_server_cert, s.http_server_key, None, False, what="metrics TLS")


def cluster_files(c) -> TlsFiles | None:
    """A config.ClusterConfig's peer TLS: verify peers against the cluster CA, present this node's certificate."""
    if not c.tls_ca_file:
        return None
    return TlsFiles(c.tls_cert_file, c.tls_key_file, c.tls_ca_file, bool(c.tls_cert_file), what="cluster TLS")
