"""Serving the System One API with uvicorn in the daemon's own event loop.

    plan = check_http(cfg)                  # before loading the model: refuse a bad setup
    handle = await serve_http(cfg, frontend, metrics)
    ...
    await handle.stop()                     # in-flight requests finish within the grace

A listener beyond loopback refuses to start without API keys, and without TLS unless
[tls] allow_insecure_tcp (a TLS proxy in front); unix sockets and loopback may go without.
A request's headers, then its body, must each arrive within [http] request_timeout_seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import shutil
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

import structlog
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ..config import Config
from ..errors import ConfigError
from ..service.frontend import Frontend
from ..service.metrics import Metrics
from .app import Settings, build_app
from .auth import Keys
from .rate_limits import RateLimits

log = structlog.get_logger("decider.http")


@dataclass(frozen=True, slots=True)
class HttpPlan:
    """A checked [http] section: where to listen, the keys, the TLS files."""

    host: str  # "" for a unix socket
    port: int
    path: str  # the unix socket's path, or ""
    keys: Keys
    cert: str
    key: str
    client_ca: str


def _is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name other than localhost may resolve anywhere
        return False


def check_http(cfg: Config) -> HttpPlan:
    """Refuse an [http] setup that cannot or must not start, naming the key and the reason."""
    h, where = cfg.http, f"{cfg.source}: http"
    if not h.address:
        raise ConfigError(f"{where}.address: give host:port or unix:///path")
    for key in ("max_body_bytes", "request_timeout_seconds", "max_connections"):
        if getattr(h, key) <= 0:
            raise ConfigError(f"{where}.{key}: must be positive, got {getattr(h, key)!r}")
    for key in ("requests_per_minute", "requests_per_day"):
        if getattr(h, key) < 0:
            raise ConfigError(f"{where}.{key}: must be 0 (no limit) or positive, got "
                              f"{getattr(h, key)!r}")
        if getattr(h, key) and cfg.server.frontends > 1:
            raise ConfigError(f"{where}.{key}: rate limits are counted in one process; with "
                              f"server.frontends = {cfg.server.frontends} set them on the "
                              "proxy in front (docs/systemone.md)")
    if any(not a.strip() for a in h.model_aliases):
        raise ConfigError(f"{where}.model_aliases: an alias must not be empty")
    cert, key = h.tls_cert or cfg.tls.cert, h.tls_key or cfg.tls.key
    client_ca = h.tls_client_ca or cfg.tls.client_ca
    if bool(cert) != bool(key):
        raise ConfigError(f"{where}: the TLS certificate and key go together")
    if client_ca and not cert:
        raise ConfigError(f"{where}: a client CA needs a TLS certificate and key")
    keys = Keys.load(h.api_keys, h.key_file, cfg.source)
    if h.address.startswith("unix:"):
        path = h.address.removeprefix("unix://").removeprefix("unix:")
        return HttpPlan("", 0, path, keys, "", "", "")
    host, sep, port = h.address.rpartition(":")
    host = host.strip("[]")
    if not (sep and host and port.isdigit() and int(port) < 65536):
        raise ConfigError(f"{where}.address {h.address!r}: expected host:port or unix:///path")
    if not _is_loopback(host):
        if not keys:
            raise ConfigError(f"{where}.address {h.address!r} is not loopback: give API keys "
                              "(http.api_keys or http.key_file)")
        if not cert and not cfg.tls.allow_insecure_tcp:
            raise ConfigError(f"{where}.address {h.address!r} is not loopback: give a TLS "
                              "certificate and key, or allow plaintext (tls.allow_insecure_tcp)")
    return HttpPlan(host, int(port), "", keys, cert, key, client_ca)


def _bind(plan: HttpPlan, socket_group: str, shared: bool) -> socket.socket:
    """shared: several front-end processes listen on this port (SO_REUSEPORT)."""
    if plan.path:
        Path(plan.path).unlink(missing_ok=True)  # a socket left by a previous run
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(plan.path)
        os.chmod(plan.path, 0o660)  # owner and group: client apps join the group
        if socket_group:
            shutil.chown(plan.path, group=socket_group)
        return sock
    # IPPROTO_TCP, not socket.create_server's 0: only then does asyncio set TCP_NODELAY
    # on the connections (without it: 40 ms a response, docs/design.md)
    family = socket.AF_INET6 if ":" in plan.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if shared:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((plan.host, plan.port))
    return sock


class _HeadersInTime(HttpToolsProtocol):
    """uvicorn waits for a request's headers without end (a slowloris holds a connection
    for ever): a connection whose headers do not arrive within the timeout is closed."""

    header_timeout = 30.0
    _timer: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        self._disarm()
        self._timer = self.loop.call_later(self.header_timeout, self.transport.close)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)


class _ToStructlog(logging.Handler):
    """uvicorn's own warnings (bad requests on the socket, shutdown timeouts) as the
    daemon's JSON log lines."""

    def emit(self, record: logging.LogRecord) -> None:
        log.log(record.levelno, record.getMessage(), logger=record.name)


def _route_uvicorn_logs() -> None:
    for name in ("uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.WARNING)
        logger.propagate = False
        if not any(isinstance(h, _ToStructlog) for h in logger.handlers):
            logger.addHandler(_ToStructlog())


class _Uvicorn(uvicorn.Server):
    def capture_signals(self):  # the daemon owns SIGTERM, SIGINT and SIGHUP
        return contextlib.nullcontext()


@dataclass
class HttpServer:
    """A running HTTP front end; `url` is where it listens (with the port it bound)."""

    url: str
    server: uvicorn.Server
    task: asyncio.Task

    async def stop(self) -> None:
        """Stop accepting; answer what is in flight (up to the daemon's grace), then close."""
        self.server.should_exit = True
        await self.task


async def serve_http(cfg: Config, frontend: Frontend, metrics: Metrics | None = None
                     ) -> HttpServer:
    plan = check_http(cfg)
    h = cfg.http
    app = build_app(frontend, Settings(plan.keys, h.max_body_bytes, h.request_timeout_seconds,
                                       cfg.server.log_text, h.vendor_names, h.legacy_names,
                                       RateLimits(h.requests_per_minute, h.requests_per_day)),
                    metrics)
    protocol = type("HeadersInTime", (_HeadersInTime,),
                    {"header_timeout": h.request_timeout_seconds})
    config = uvicorn.Config(
        app, http=protocol, lifespan="off", log_config=None, access_log=False,
        proxy_headers=False, server_header=False, limit_concurrency=h.max_connections,
        timeout_graceful_shutdown=max(1, int(cfg.server.grace_seconds)),
        ssl_certfile=plan.cert or None, ssl_keyfile=plan.key or None,
        ssl_ca_certs=plan.client_ca or None,
        ssl_cert_reqs=ssl.CERT_REQUIRED if plan.client_ca else ssl.CERT_NONE)
    try:
        config.load()  # reads the TLS files
        sock = _bind(plan, cfg.server.socket_group, cfg.server.frontends > 1)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"{cfg.source}: http: cannot serve {h.address}: {e}") from e
    _route_uvicorn_logs()
    server = _Uvicorn(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="http")
    while not server.started:
        if task.done():
            task.result()  # raises what stopped it
            raise ConfigError(f"{cfg.source}: http: the server on {h.address} did not start")
        await asyncio.sleep(0.005)
    scheme = "https" if plan.cert else "http"
    if plan.path:
        url = f"unix://{plan.path}"
    else:
        host, port = sock.getsockname()[:2]
        url = f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"
    log.info("serving HTTP", url=url, keys=len(plan.keys.digests), tls=bool(plan.cert),
             client_certificates=bool(plan.client_ca))
    return HttpServer(url, server, task)
