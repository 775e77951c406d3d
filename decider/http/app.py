"""The FastAPI application: the System One routes (systemone.py), OpenAI's Decisions route
(decisions.py), health, metrics, the OpenAPI document, and one mapping of every refusal
to a status and body (errors.py: TypeSafe's shape, OpenAI's under /v1/decisions), the
framework's own 404 and 405 included."""

from __future__ import annotations

from dataclasses import dataclass, field

import structlog
from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException
from starlette.responses import Response

from .. import __version__
from ..errors import DeciderError
from ..service.frontend import Frontend
from ..service.metrics import Metrics
from ..systemone.decisions_schema import DecisionRequest
from ..systemone.mapping import BadBody
from ..systemone.schema import SystemOneRequest
from . import openapi
from .auth import Keys
from .calls import authorize
from .decisions import PATH as DECISIONS
from .decisions import add_decisions
from .errors import (
    Refused,
    error_response,
    field_errors_response,
    json_response,
    openai_error_response,
    openai_refusal,
    refusal,
)
from .observer import HttpObserver
from .openapi import SECURED, WHY, refusals
from .rate_limits import RateLimits
from .systemone import add_systemone

log = structlog.get_logger("decider.http")


@dataclass(frozen=True, slots=True)
class Settings:
    keys: Keys
    max_body_bytes: int = 16 * 2**20
    request_timeout_seconds: float = 30.0
    log_text: bool = False
    vendor_names: bool = True  # the served model answers to jev-*, gpt-6-luna too
    legacy_names: bool = False  # deprecated: label_mass and decider beside the x_ names
    rate_limits: RateLimits = field(default_factory=RateLimits)  # none unless given


def _openai(request: Request) -> bool:
    """Under the Decisions API, refusals take OpenAI's envelope."""
    return request.url.path.startswith(DECISIONS)


def _respond(request: Request, status: int, reason: str, message: str,
             headers: dict | None = None, **metadata) -> Response:
    request.state.outcome = reason
    if _openai(request):
        return openai_refusal(status, reason, message, headers)
    return refusal(status, reason, message, headers, **metadata)


def _unexpected(request: Request, exc: Exception) -> Response:
    """A bug, not a refusal: logged with its traceback, answered 500 without it."""
    log.error("unexpected error", path=request.url.path, exc_info=exc)
    return _respond(request, 500, "INTERNAL", "an unexpected error; the server's log has it")


def _framework(request: Request, exc: HTTPException) -> Response:
    """No such route (404) or another method (405), in the shape of every refusal."""
    reason = {404: "NO_SUCH_ROUTE", 405: "METHOD_NOT_ALLOWED"}.get(exc.status_code, "HTTP")
    return _respond(request, exc.status_code, reason, f"{request.method} "
                    f"{request.url.path}: {exc.detail}", dict(exc.headers or {}))


def _refused(request: Request, exc: Refused) -> Response:
    return _respond(request, exc.status, exc.reason, exc.message, exc.headers, **exc.metadata)


def _decider_error(request: Request, exc: DeciderError) -> Response:
    request.state.outcome = exc.reason
    return openai_error_response(exc) if _openai(request) else error_response(exc)


def _bad_body(request: Request, exc: BadBody) -> Response:
    request.state.outcome = exc.reason
    return field_errors_response(exc.errors)


class _Direct(APIRoute):
    """Endpoints take the Request and return a Response, without FastAPI's dependency
    injection (it cost more than the rest of a decision's HTTP work, docs/experiments.md);
    the route still describes itself in the OpenAPI document."""

    def get_route_handler(self):
        return self.endpoint


def build_app(frontend: Frontend, settings: Settings, metrics: Metrics | None = None
              ) -> HttpObserver:
    """The ASGI application: FastAPI's, inside HttpObserver (which sees every response,
    FastAPI's own 500 included, to give it a request id, a log line and its metrics)."""
    app = FastAPI(title="decider: the System One and Decisions APIs", version=__version__,
                  docs_url=None, license_info={"name": "Apache-2.0",
                                               "identifier": "Apache-2.0"},
                  redoc_url=None, openapi_url="/openapi.json", redirect_slashes=False)
    app.router.route_class = _Direct
    observer = HttpObserver(app, metrics or Metrics())
    add_systemone(app, frontend, settings, observer)
    add_decisions(app, frontend, settings)

    open_ = {"security": []}  # probes ask for no key

    @app.get("/healthz", openapi_extra=open_, responses={405: {"description": WHY[405]}})
    async def healthz(request: Request) -> Response:
        """Live: the process answers HTTP."""
        return json_response(200, {"status": "ok"})

    @app.get("/readyz", openapi_extra=open_, responses={
        405: {"description": WHY[405]}, 503: {"description": "Not ready (Retry-After)"}})
    async def readyz(request: Request) -> Response:
        """Ready only while the model is loaded and warm (gRPC health SERVING)."""
        if frontend.ready():
            return json_response(200, {"status": "ready"})
        return json_response(503, {"status": "not ready"}, {"Retry-After": "5"})

    @app.get("/metrics", openapi_extra=SECURED, responses={
        200: {"description": "Prometheus text", "content": {"text/plain": {
            "schema": {"type": "string"}}}}} | refusals(401))
    async def prometheus(request: Request) -> Response:
        """Prometheus text: the daemon's metrics and the HTTP front end's."""
        authorize(settings.keys, request)
        return Response(generate_latest(observer.metrics.exposed()),
                        media_type=CONTENT_TYPE_LATEST)

    app.add_exception_handler(BadBody, _bad_body)
    app.add_exception_handler(DeciderError, _decider_error)
    app.add_exception_handler(Refused, _refused)
    app.add_exception_handler(HTTPException, _framework)
    app.add_exception_handler(Exception, _unexpected)
    app.openapi = lambda: openapi.build(app, {"SystemOneRequest": SystemOneRequest,
                                              "DecisionRequest": DecisionRequest})
    return observer
