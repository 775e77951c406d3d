"""`decider serve`: the gRPC daemon. One model per daemon, loaded and warmed before the
health service says SERVING; health, reflection, bounded queue, deadlines, one reload
attempt after an engine failure."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from grpc_status import rpc_status

from . import __version__
from .api import Decider
from .catalog import Catalog, file_sha256
from .errors import ConfigError, DeciderError, ModelNotFound
from .metrics import Metrics
from .prompts import TEMPLATE_VERSION
from .questions import Request, YesNo
from .scheduler import Outcome, Scheduler
from .v1 import decider_pb2 as pb
from .v1 import decider_pb2_grpc as pb_grpc
from .wire import answer_to_proto, error_status, item_error, request_from_proto

log = structlog.get_logger("decider.server")

SERVICE = pb.DESCRIPTOR.services_by_name["Decider"].full_name
DEFAULT_LISTEN = "127.0.0.1:50051"
MAX_MESSAGE_BYTES = 4 * 2**20


@dataclass(slots=True)
class ServeConfig:
    model: str | None = None
    engine: str | None = None
    n_ctx: int | None = None
    n_threads: int | None = None
    listen: list[str] = field(default_factory=lambda: [DEFAULT_LISTEN])
    max_queue: int = 256
    max_batch: int = 16
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None  # require client certificates signed by this CA
    allow_insecure_tcp: bool = False  # plaintext on a non-loopback address
    metrics_port: int | None = None  # Prometheus text format on 127.0.0.1:PORT


def _is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listeners(cfg: ServeConfig) -> None:
    """Refuse plaintext TCP beyond loopback, and half a TLS setup, before loading anything."""
    if bool(cfg.tls_cert) != bool(cfg.tls_key):
        raise ConfigError("--tls-cert and --tls-key go together")
    if cfg.tls_client_ca and not cfg.tls_cert:
        raise ConfigError("--tls-client-ca needs --tls-cert and --tls-key")
    for addr in cfg.listen:
        if addr.startswith("unix:"):
            continue
        if ":" not in addr:
            raise ConfigError(f"listen address {addr!r}: expected unix:///path or host:port")
        if not cfg.tls_cert and not _is_loopback(addr) and not cfg.allow_insecure_tcp:
            raise ConfigError(
                f"listen address {addr!r} is not loopback: give --tls-cert and --tls-key "
                "(TLS), or --allow-insecure-tcp to serve it in plaintext", listen=addr)


class Daemon:
    def __init__(self, cfg: ServeConfig) -> None:
        self.cfg = cfg
        self.health = health.aio.HealthServicer()
        self.decider: Decider | None = None
        self.sha256 = ""
        self.exit_code = 0
        self.stopped = asyncio.Event()
        self.metrics = Metrics()
        self.scheduler = Scheduler(self._decide_many, max_queue=cfg.max_queue,
                                   max_batch=cfg.max_batch, on_engine_failure=self._reload,
                                   metrics=self.metrics)
        self.server: grpc.aio.Server | None = None

    def _decide_many(self, requests: list[Request]) -> list:
        return self.decider.decide_many(requests)

    async def _set_health(self, serving: bool) -> None:
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for name in ("", SERVICE):
            await self.health.set(name, status)

    def _load(self) -> Decider:
        """Load, hash and warm the model (blocking: runs in a worker thread)."""
        catalog = Catalog()
        entry = catalog.get(self.cfg.model or catalog.default)  # locate never downloads
        options = {"n_threads": self.cfg.n_threads} if self.cfg.n_threads else {}
        d = Decider(entry, engine=self.cfg.engine, n_ctx=self.cfg.n_ctx, catalog=catalog,
                    **options)
        self.sha256 = file_sha256(Path(d.engine.info.model_path))
        d.decide("warm-up", [YesNo("Is this a warm-up?")])
        return d

    async def start(self) -> None:
        await self._set_health(False)
        check_listeners(self.cfg)
        self.decider = await asyncio.to_thread(self._load)
        self.server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ])
        pb_grpc.add_DeciderServicer_to_server(DeciderService(self), self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME), self.server)
        for addr in self.cfg.listen:
            self._bind(addr)
        await self.server.start()
        metrics_port = None
        if self.cfg.metrics_port is not None:
            metrics_port = self.metrics.serve(self.cfg.metrics_port)
        self.scheduler.start()
        await self._set_health(True)
        info = self.decider.engine.info
        log.info("serving", listen=self.cfg.listen, model=info.model_name,
                 engine=self.decider.engine.name, n_ctx=info.n_ctx, sha256=self.sha256,
                 metrics_port=metrics_port)

    def _bind(self, addr: str) -> None:
        if addr.startswith("unix:"):
            path = Path(addr.removeprefix("unix://").removeprefix("unix:"))
            path.unlink(missing_ok=True)  # a socket left by a previous run
            self.server.add_insecure_port(addr)
            os.chmod(path, 0o660)  # owner and group: client apps join the group
        elif self.cfg.tls_cert:
            ca = Path(self.cfg.tls_client_ca).read_bytes() if self.cfg.tls_client_ca else None
            creds = grpc.ssl_server_credentials(
                [(Path(self.cfg.tls_key).read_bytes(), Path(self.cfg.tls_cert).read_bytes())],
                root_certificates=ca, require_client_auth=ca is not None)
            self.server.add_secure_port(addr, creds)
        else:
            self.server.add_insecure_port(addr)

    async def _reload(self, error: DeciderError) -> None:
        """One reload after an engine failure; if it fails too, stop with exit code 1."""
        await self._set_health(False)
        self.scheduler.accepting = False
        log.error("reloading the model after an engine failure", reason=error.reason)
        old = self.decider
        try:
            old.close()
            self.decider = await asyncio.to_thread(self._load)
        except Exception as e:
            log.critical("reload failed; exiting for the service manager to restart",
                         error=str(e))
            self.exit_code = 1
            self.stopped.set()
            return
        self.scheduler.accepting = True
        await self._set_health(True)
        log.info("reloaded")

    async def stop(self, grace: float) -> None:
        await self._set_health(False)
        await self.scheduler.drain()
        if self.server:
            await self.server.stop(grace)
        await self.scheduler.close()
        if self.decider:
            self.decider.close()


class DeciderService(pb_grpc.DeciderServicer):
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    async def _decide(self, req: pb.DecideRequest, context) -> pb.DecideResponse:
        d = self.daemon
        name = d.decider.entry.name
        if req.model and req.model != name:
            raise ModelNotFound(f"model {req.model!r} is not served here; this daemon serves "
                                f"{name!r}", model=req.model)
        request = request_from_proto(req).validate(d.decider.limits)
        remaining = context.time_remaining()
        deadline = time.monotonic() + remaining if remaining is not None else None
        outcome = await d.scheduler.submit(request, deadline)
        return self._response(outcome)

    def _response(self, o: Outcome) -> pb.DecideResponse:
        d = self.daemon
        return pb.DecideResponse(
            answers=[answer_to_proto(a) for a in o.decision.answers],
            usage=pb.Usage(prompt_tokens=o.decision.usage.prompt_tokens,
                           window_tokens=o.decision.usage.window_tokens),
            timings=pb.Timings(queue_ms=o.queue_ms, compute_ms=o.compute_ms),
            provenance=pb.Provenance(decider_version=__version__, engine=o.decision.engine,
                                     model=o.decision.model, model_sha256=d.sha256,
                                     template_version=TEMPLATE_VERSION))

    def _record(self, rid: str, t0: float, outcome: str, **fields) -> None:
        seconds = time.monotonic() - t0
        m = self.daemon.metrics
        m.requests.labels(outcome).inc()
        m.latency.observe(seconds)
        log.info("decide", request_id=rid, outcome=outcome, ms=round(1000 * seconds, 2),
                 **fields)

    async def Decide(self, request, context):
        rid, t0 = uuid.uuid4().hex[:12], time.monotonic()
        try:
            response = await self._decide(request, context)
        except DeciderError as e:
            self._record(rid, t0, e.reason)
            await context.abort_with_status(rpc_status.to_status(error_status(e)))
        except asyncio.CancelledError:
            self._record(rid, t0, "CANCELLED")
            raise
        self._record(rid, t0, "OK", questions=len(request.questions),
                     prompt_tokens=response.usage.prompt_tokens)
        self.daemon.metrics.prompt_tokens.inc(response.usage.prompt_tokens)
        return response

    async def DecideBatch(self, request, context):
        async def one(req):
            try:
                return pb.DecideBatchItem(response=await self._decide(req, context))
            except DeciderError as e:
                return pb.DecideBatchItem(error=item_error(e))

        items = await asyncio.gather(*(one(r) for r in request.requests))
        return pb.DecideBatchResponse(items=items)

    async def ListModels(self, request, context):
        d = self.daemon
        entries = dict(Catalog().entries)
        if d.decider is not None:  # a model served from a path is not in the catalog
            entries.setdefault(d.decider.entry.name, d.decider.entry)
        out = []
        for name, entry in sorted(entries.items()):
            loaded = d.decider is not None and name == d.decider.entry.name
            status = pb.ModelStatus(name=name, engine=entry.engine, loaded=loaded,
                                    is_default=loaded)
            if loaded:
                info = d.decider.engine.info
                status.MergeFrom(pb.ModelStatus(n_ctx=info.n_ctx, n_ctx_train=info.n_ctx_train,
                                                weights=info.weights, model_sha256=d.sha256))
            out.append(status)
        return pb.ListModelsResponse(models=out)


async def serve(cfg: ServeConfig, grace: float = 10.0) -> int:
    daemon = Daemon(cfg)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.stopped.set)
    try:
        await daemon.start()
        await daemon.stopped.wait()
        log.info("stopping", grace_s=grace)
    finally:
        await daemon.stop(grace)
    return daemon.exit_code
