"""Where the daemon listens and on what terms: unix sockets owner-and-group only, TLS (and
client certificates) before any TCP beyond loopback, message sizes bounded. Checked
before anything loads; applied when the servers bind."""

from __future__ import annotations

import ipaddress
import os
import shutil
from pathlib import Path

import grpc

from .config import Config, socket_path
from .errors import ConfigError

MAX_MESSAGE_BYTES = 4 * 2**20


def is_loopback(address: str) -> bool:
    """Whether a host:port (or unix socket) address stays on this machine."""
    if address.startswith("unix:"):
        return True
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listeners(cfg: Config) -> None:
    """Refuse plaintext TCP beyond loopback, and half a TLS setup."""
    tls = cfg.tls
    if bool(tls.cert) != bool(tls.key):
        raise ConfigError(f"{cfg.source}: tls.cert and tls.key go together")
    if tls.client_ca and not tls.cert:
        raise ConfigError(f"{cfg.source}: tls.client_ca needs tls.cert and tls.key")
    shared = [a for a in (*cfg.server.listen, cfg.http.address)
              if a.startswith("unix:")] if cfg.server.frontends > 1 else []
    if shared:
        raise ConfigError(f"{cfg.source}: server.frontends {cfg.server.frontends} needs TCP "
                          f"listeners (they share a port); {shared[0]!r} is a unix socket",
                          key="frontends")
    for addr in cfg.server.listen:
        if not tls.cert and not is_loopback(addr) and not tls.allow_insecure_tcp:
            raise ConfigError(
                f"listen address {addr!r} is not loopback: give a TLS certificate and key "
                "(--tls-cert, --tls-key), or allow plaintext (--allow-insecure-tcp)",
                listen=addr)


def grpc_server(interceptors=()) -> grpc.aio.Server:
    return grpc.aio.server(interceptors=interceptors, options=[
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.so_reuseport", 1),  # front-end processes share a TCP port
    ])


def bind(server: grpc.aio.Server, cfg: Config, addr: str) -> None:
    tls = cfg.tls
    if addr.startswith("unix:"):
        path = socket_path(addr)
        path.unlink(missing_ok=True)  # a socket left by a previous run
        server.add_insecure_port(addr)
        os.chmod(path, 0o660)  # owner and group: client apps join the group
        if cfg.server.socket_group:
            shutil.chown(path, group=cfg.server.socket_group)
    elif tls.cert:
        ca = Path(tls.client_ca).read_bytes() if tls.client_ca else None
        server.add_secure_port(addr, grpc.ssl_server_credentials(
            [(Path(tls.key).read_bytes(), Path(tls.cert).read_bytes())],
            root_certificates=ca, require_client_auth=ca is not None))
    else:
        server.add_insecure_port(addr)
