"""`decider serve`: the gRPC daemon. One model per daemon, loaded and warmed before the
health service says SERVING; health, reflection, bounded queue, deadlines, one reload
attempt after an engine failure."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from grpc_status import rpc_status

from . import __version__
from .api import Decider
from .catalog import Catalog, file_sha256
from .config import Config
from .errors import ConfigError, DeciderError, ModelNotFound
from .logs import configure
from .metrics import Metrics
from .prompts import TEMPLATE_VERSION
from .questions import Request, YesNo
from .scheduler import Outcome, Scheduler
from .systemd import Notifier
from .v1 import decider_pb2 as pb
from .v1 import decider_pb2_grpc as pb_grpc
from .wire import answer_to_proto, error_status, item_error, request_from_proto

log = structlog.get_logger("decider.server")

SERVICE = pb.DESCRIPTOR.services_by_name["Decider"].full_name
MAX_MESSAGE_BYTES = 4 * 2**20


def _is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listeners(cfg: Config) -> None:
    """Refuse plaintext TCP beyond loopback, and half a TLS setup, before loading anything."""
    tls = cfg.tls
    if bool(tls.cert) != bool(tls.key):
        raise ConfigError(f"{cfg.source}: tls.cert and tls.key go together")
    if tls.client_ca and not tls.cert:
        raise ConfigError(f"{cfg.source}: tls.client_ca needs tls.cert and tls.key")
    for addr in cfg.server.listen:
        if addr.startswith("unix:"):
            continue
        if ":" not in addr:
            raise ConfigError(f"listen address {addr!r}: expected unix:///path or host:port")
        if not tls.cert and not _is_loopback(addr) and not tls.allow_insecure_tcp:
            raise ConfigError(
                f"listen address {addr!r} is not loopback: give a TLS certificate and key "
                "(--tls-cert, --tls-key), or allow plaintext (--allow-insecure-tcp)",
                listen=addr)


class Daemon:
    def __init__(self, cfg: Config, reread: Callable[[], Config] | None = None) -> None:
        self.cfg = cfg
        self._reread = reread  # SIGHUP: the config as the file says now
        self.health = health.aio.HealthServicer()
        self.notifier = Notifier()
        self.decider: Decider | None = None
        self.sha256 = ""
        self.exit_code = 0
        self.stopped = asyncio.Event()
        self.metrics = Metrics()
        self.scheduler = Scheduler(self._decide_many, max_queue=cfg.server.max_queue,
                                   max_batch=cfg.server.max_batch,
                                   on_engine_failure=self._reload_after_failure,
                                   metrics=self.metrics)
        self.server: grpc.aio.Server | None = None
        self._tasks: list[asyncio.Task] = []

    def _decide_many(self, requests: list[Request]) -> list:
        return self.decider.decide_many(requests)

    async def _set_health(self, serving: bool) -> None:
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for name in ("", SERVICE):
            await self.health.set(name, status)

    def _load(self, cfg: Config) -> tuple[Decider, str]:
        """Load, hash and warm the model (blocking: runs in a worker thread)."""
        m, paths = cfg.model, cfg.paths
        if m.gpu:
            os.environ["CUDA_VISIBLE_DEVICES"] = m.gpu  # before any engine touches CUDA
        catalog = Catalog(user_file=Path(paths.catalog) if paths.catalog else None,
                          cache_dir=Path(paths.cache_dir) if paths.cache_dir else None)
        entry = catalog.get(m.name or catalog.default)  # locate never downloads
        options = {k: v for k, v in (("n_threads", m.threads), ("n_gpu_layers", m.gpu_layers),
                                     ("dtype", m.dtype)) if v}
        d = Decider(entry, engine=m.engine or None, n_ctx=m.n_ctx or None, catalog=catalog,
                    **options)
        try:
            sha = file_sha256(Path(d.engine.info.model_path))
            d.decide("warm-up", [YesNo("Is this a warm-up?")])
        except BaseException:
            d.close()
            raise
        return d, sha

    async def start(self) -> None:
        await self._set_health(False)
        check_listeners(self.cfg)
        self.notifier.status("loading the model")
        self.decider, self.sha256 = await asyncio.to_thread(self._load, self.cfg)
        self.server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ])
        pb_grpc.add_DeciderServicer_to_server(DeciderService(self), self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME), self.server)
        for addr in self.cfg.server.listen:
            self._bind(addr)
        await self.server.start()
        metrics_port = None
        if self.cfg.server.metrics_port is not None:
            metrics_port = self.metrics.serve(self.cfg.server.metrics_port)
        self.scheduler.start()
        await self._set_health(True)
        if self.notifier.watchdog_seconds:
            self._tasks.append(asyncio.create_task(self._watchdog()))
        info = self.decider.engine.info
        self.notifier.ready(f"serving {info.model_name} on {', '.join(self.cfg.server.listen)}")
        log.info("serving", listen=list(self.cfg.server.listen), model=info.model_name,
                 engine=self.decider.engine.name, n_ctx=info.n_ctx, sha256=self.sha256,
                 metrics_port=metrics_port, config=self.cfg.source)

    def _bind(self, addr: str) -> None:
        tls = self.cfg.tls
        if addr.startswith("unix:"):
            path = Path(addr.removeprefix("unix://").removeprefix("unix:"))
            path.unlink(missing_ok=True)  # a socket left by a previous run
            self.server.add_insecure_port(addr)
            os.chmod(path, 0o660)  # owner and group: client apps join the group
            if self.cfg.server.socket_group:
                shutil.chown(path, group=self.cfg.server.socket_group)
        elif tls.cert:
            ca = Path(tls.client_ca).read_bytes() if tls.client_ca else None
            creds = grpc.ssl_server_credentials(
                [(Path(tls.key).read_bytes(), Path(tls.cert).read_bytes())],
                root_certificates=ca, require_client_auth=ca is not None)
            self.server.add_secure_port(addr, creds)
        else:
            self.server.add_insecure_port(addr)

    async def _watchdog(self) -> None:
        """WATCHDOG=1 at half the period while idle or while the engine call in progress
        is younger than its limit: a hung engine gets the service restarted."""
        limit = self.cfg.server.engine_call_limit_seconds
        while True:
            busy = self.scheduler.busy_since
            if busy is None or time.monotonic() - busy < limit:
                self.notifier.watchdog()
            else:
                log.error("engine call past its limit; withholding the watchdog",
                          seconds=round(time.monotonic() - busy, 1), limit=limit)
            await asyncio.sleep(self.notifier.watchdog_seconds / 2)

    async def _swap(self, new: Decider, sha: str) -> None:
        """Replace the model between engine calls, then drop the old one."""
        async with self.scheduler.engine_lock:
            old, self.decider, self.sha256 = self.decider, new, sha
        old.close()

    async def reload_config(self) -> None:
        """SIGHUP: apply what changed; a changed model is loaded before the old is dropped;
        a bad config keeps the running one."""
        self.notifier.reloading()
        try:
            new = self._reread() if self._reread else self.cfg
            check_listeners(new)
            if new.model != self.cfg.model or new.paths != self.cfg.paths:
                self.notifier.status("loading the new model")
                await self._swap(*await asyncio.to_thread(self._load, new))
            if new.server.listen != self.cfg.server.listen or new.tls != self.cfg.tls:
                log.warning("listeners and TLS change only on restart", listen=new.server.listen)
            self.scheduler.max_queue = new.server.max_queue
            self.scheduler.max_batch = new.server.max_batch
            configure(level=new.server.log_level, fmt=new.server.log_format, stream=sys.stdout)
            self.cfg = new
            log.info("configuration reloaded", config=new.source)
        except Exception as e:  # keep serving with what runs now
            log.error("reload refused; the running configuration stays", error=str(e))
        self.notifier.ready(f"serving {self.decider.entry.name}")

    async def _reload_after_failure(self, error: DeciderError) -> None:
        """One reload after an engine failure; if it fails too, stop with exit code 1."""
        await self._set_health(False)
        self.scheduler.accepting = False
        log.error("reloading the model after an engine failure", reason=error.reason)
        self.notifier.status(f"reloading after {error.reason}")
        try:
            self.decider.close()
            self.decider, self.sha256 = await asyncio.to_thread(self._load, self.cfg)
        except Exception as e:
            log.critical("reload failed; exiting for the service manager to restart",
                         error=str(e))
            self.exit_code = 1
            self.stopped.set()
            return
        self.scheduler.accepting = True
        await self._set_health(True)
        self.notifier.status(f"serving {self.decider.entry.name}")
        log.info("reloaded")

    async def stop(self) -> None:
        """Drain: NOT_SERVING, new requests UNAVAILABLE, accepted ones answered."""
        self.notifier.stopping()
        await self._set_health(False)
        grace = self.cfg.server.grace_seconds
        try:
            await asyncio.wait_for(self.scheduler.drain(), grace)
        except TimeoutError:
            log.error("requests still running at the end of the grace period", grace_s=grace)
        if self.server:
            await self.server.stop(1.0)
        for task in self._tasks:
            task.cancel()
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
        extra = {"text": request.text} if self.daemon.cfg.server.log_text else {}
        self._record(rid, t0, "OK", questions=len(request.questions),
                     prompt_tokens=response.usage.prompt_tokens, **extra)
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


async def serve(cfg: Config, reread: Callable[[], Config] | None = None) -> int:
    daemon = Daemon(cfg, reread)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.stopped.set)
    loop.add_signal_handler(signal.SIGHUP, lambda: loop.create_task(daemon.reload_config()))
    try:
        await daemon.start()
        await daemon.stopped.wait()
        log.info("stopping", grace_s=cfg.server.grace_seconds)
    finally:
        await daemon.stop()
    return daemon.exit_code
