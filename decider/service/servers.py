"""One process's servers over its Frontend: the gRPC server (Decider, health, reflection)
on the configured listeners and, with [http] address, the System One HTTP API. The daemon
process runs one; each extra front-end process (`--frontends N`) runs another on the same
TCP ports (SO_REUSEPORT: the kernel spreads the connections)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ..catalog import Catalog
from ..config import Config
from ..errors import ServerStopping
from ..v1 import decider_pb2 as pb
from ..v1 import decider_pb2_grpc as pb_grpc
from .frontend import Frontend
from .interceptor import Observer
from .listeners import bind, grpc_server
from .metrics import Metrics
from .servicer import DeciderService

log = structlog.get_logger("decider.server")

SERVICE = pb.DESCRIPTOR.services_by_name["Decider"].full_name
# a drain says NOT_SERVING at least this long before the listeners close: proxies that
# poll readiness (deploy/haproxy checks every 0.5 s) stop sending first, where a stream
# sent to a closing listener came back CANCELLED (docs/deploy.md)
ANNOUNCE_SECONDS = 1.0
SERVING, NOT_SERVING = (health_pb2.HealthCheckResponse.SERVING,
                        health_pb2.HealthCheckResponse.NOT_SERVING)


class Servers:
    def __init__(self, cfg: Config, metrics: Metrics) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.frontend = Frontend(cfg.server.max_queue, cfg.limits,
                                 cfg.server.request_timeout_seconds, cfg.http.model_aliases)
        self.health = health.aio.HealthServicer()
        self.server: grpc.aio.Server | None = None
        self.http = None  # the System One HTTP front end, when [http] address is set

    async def start(self) -> None:
        cfg = self.cfg
        self.server = grpc_server(interceptors=[observer := Observer(
            self.metrics, cfg.server.log_text)], shared=cfg.server.frontends > 1)
        catalog = Catalog(user_file=_path(cfg.paths.catalog),
                          cache_dir=_path(cfg.paths.cache_dir))
        pb_grpc.add_DeciderServicer_to_server(
            DeciderService(self.frontend, catalog, observer), self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME), self.server)
        for addr in cfg.server.listen:
            bind(self.server, cfg, addr)
        await self.server.start()
        if cfg.http.address:
            from ..http.serve import serve_http

            self.http = await serve_http(cfg, self.frontend, self.metrics)

    async def set_health(self, serving: bool) -> None:
        for name in ("", SERVICE):
            await self.health.set(name, SERVING if serving else NOT_SERVING)

    async def drain(self, grace: float) -> None:
        """NOT_SERVING, new requests UNAVAILABLE, accepted ones answered within the grace;
        what cannot finish in it is refused as the server stopping (retryable). Returns
        no sooner than ANNOUNCE_SECONDS after NOT_SERVING."""
        self.frontend.accepting = False  # before health says so: NOT_SERVING means refused
        await self.set_health(False)
        announced = asyncio.create_task(asyncio.sleep(ANNOUNCE_SECONDS))
        served = self.frontend.current
        try:
            if served is not None:
                await asyncio.wait_for(served.client.idle.wait(), grace)
        except TimeoutError:
            left = served.client.outstanding
            log.error("requests still running at the end of the grace period; refused",
                      grace_s=grace, requests=left)
            self.metrics.requests.labels(ServerStopping.reason).inc(left)
            served.client.fail_all(ServerStopping(grace))
        await announced

    async def close(self) -> None:
        if self.server:
            await self.server.stop(1.0)
        if self.http:
            await self.http.stop()


def _path(value: str) -> Path | None:
    return Path(value) if value else None
