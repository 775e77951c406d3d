"""Where the daemon listens and on what terms: unix sockets owner-and-group only, TLS (and
client certificates) before any TCP beyond loopback, message sizes bounded, one daemon per
address. Checked before anything loads; applied when the servers bind.

One owner per address: before loading anything the daemon claims each of its addresses
by binding an abstract unix socket named after it (the kernel frees it when the process
ends, however it ends), so a second decider daemon is refused at once, naming the
first's pid. A unix socket path that still answers a connection is never unlinked, and a
TCP port that another program holds is refused then too, not after the model loads.
SO_REUSEPORT, which lets processes of one user share a port, is set only where this
daemon's own front-end processes share it (--frontends N)."""

from __future__ import annotations

import errno
import hashlib
import ipaddress
import os
import shutil
import socket
import stat
import struct
from pathlib import Path

import grpc

from ..config import Config, socket_path
from ..errors import ConfigError

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


def grpc_server(interceptors=(), shared: bool = False) -> grpc.aio.Server:
    """shared: this daemon's front-end processes share its TCP ports (gRPC's default
    is SO_REUSEPORT on, which would let any process of the same user share them)."""
    return grpc.aio.server(interceptors=interceptors, options=[
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.so_reuseport", int(shared)),
    ])


def claim_addresses(cfg: Config) -> list[socket.socket]:
    """Claim every address the daemon will listen on (gRPC and HTTP) for this process;
    ConfigError for one that another decider daemon or another program holds. The
    claims last as long as the returned sockets stay open."""
    addresses = [*cfg.server.listen, *([cfg.http.address] if cfg.http.address else [])]
    claims = []
    try:
        for address in addresses:
            if not address.endswith(":0"):  # any free port: the kernel picks one
                claims.append(_claim(address))
    except BaseException:
        for claim in claims:
            claim.close()
        raise
    return claims


def _claim(address: str) -> socket.socket:
    unix = address.startswith("unix:")
    if unix:
        key = f"unix:{socket_path(address).resolve()}"
    else:
        port = int(address.rsplit(":", 1)[1])
        key = f"tcp:{port}"  # one daemon per port: the kernel's own rules are per port
    lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = b"\0decider-address-" + hashlib.sha256(key.encode()).hexdigest()[:40].encode()
    try:
        lock.bind(name)
    except OSError as e:
        lock.close()
        if e.errno != errno.EADDRINUSE:
            raise
        raise ConfigError(f"listen address {address!r} is in use by another decider daemon"
                          f"{_holder(name)}; stop it or give this one another address",
                          listen=address) from None
    lock.listen(1)  # so that the next daemon can ask whose it is
    try:
        _refuse_live_socket(address) if unix else _refuse_taken_port(address)
    except BaseException:
        lock.close()
        raise
    return lock


def _holder(name: bytes) -> str:
    """' (pid N)': the process holding a claim."""
    pid = peer_pid(name)
    return f" (pid {pid})" if pid else ""


def peer_pid(name: bytes | str) -> int | None:
    """The pid of the process listening on a unix socket, from the kernel's peer
    credentials; None if none answers."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(name)
            creds = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                     struct.calcsize("3i"))
        except OSError:
            return None
    return struct.unpack("3i", creds)[0]


def _refuse_live_socket(address: str) -> None:
    """A socket file left by a previous run answers no connection; a live one does."""
    path = socket_path(address)
    if not path.exists():
        return
    if not stat.S_ISSOCK(path.lstat().st_mode):
        raise ConfigError(f"listen address {address!r}: {path} exists and is not a socket",
                          listen=address)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return  # stale: bind() replaces it
        except OSError:
            pass  # not a socket, or no access: someone else's path either way
    raise ConfigError(f"listen address {address!r}: {path} belongs to a running server (it "
                      "accepts connections); stop it or give this daemon another path",
                      listen=address)


def _refuse_taken_port(address: str) -> None:
    """Bind the port as plain sockets do (SO_REUSEADDR, no SO_REUSEPORT): refused while
    anyone listens on it."""
    host, port = address.rsplit(":", 1)
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, int(port)))
        except OSError as e:
            raise ConfigError(f"listen address {address!r}: cannot bind it ({e.strerror}); "
                              "another program holds the port", listen=address) from None


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
