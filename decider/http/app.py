"""The FastAPI application: POST /v1/systemone, GET /v1/models, health, metrics, OpenAPI."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import structlog
from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from .. import __version__
from ..errors import DeciderError, InvalidRequest, Unavailable
from ..service.frontend import Frontend
from ..service.metrics import Metrics
from ..systemone.mapping import BadBody, parse_body, to_decider
from ..systemone.schema import (
    ModelCard,
    ModelList,
    Refusal,
    SystemOneRequest,
    SystemOneResponse,
    ValidationFailed,
)
from .auth import Keys, digest
from .body import read_body
from .errors import (
    Refused,
    error_response,
    field_errors_response,
    json_response,
    refusal,
)
from .observer import HttpObserver

log = structlog.get_logger("decider.http")
REFUSALS = {
    400: "Over the loaded window (prompt_tokens, n_ctx), or an undecodable body",
    401: "No API key, or not a valid one",
    404: "The model is not served here",
    408: "The body did not arrive in time",
    413: "The body is over the limit (limit)",
    415: "An unsupported Content-Encoding",
    429: "The queue is full (Retry-After)",
    500: "The engine failed, or returned no logits",
    503: "Not ready, draining, or out of memory (Retry-After)",
    504: "The request's time ran out",
}
SECURED = {"security": [{"HTTPBearer": []}]}


@dataclass(frozen=True, slots=True)
class Settings:
    keys: Keys
    max_body_bytes: int = 16 * 2**20
    request_timeout_seconds: float = 30.0
    log_text: bool = False


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _answer(frontend: Frontend, request, model: str, deadline: float, caller: str,
                  receive):
    """The frontend's outcome; the wait is cancelled (and the engine drops the request)
    if the client goes away first."""
    me = asyncio.current_task()
    gone = asyncio.ensure_future(_disconnected(receive))
    gone.add_done_callback(lambda g: g.cancelled() or me.cancel())
    try:
        return await frontend.submit(request, deadline, model, caller=caller)
    except asyncio.CancelledError:
        if gone.done() and not gone.cancelled() and me.uncancel() == 0:
            raise Refused(499, "CLIENT_GONE", "the client closed the connection") from None
        raise
    finally:
        gone.cancel()


def _authorize(keys: Keys, request: Request) -> str:
    """Checked first, before the body is read. The caller, for the queue's fair share:
    its API key (by digest) where keys are asked for, else its host over TCP; "" over a
    unix socket. (An HTTP/1.1 connection holds one request at a time, so connections
    would not tell clients apart.)"""
    if not keys:
        client = request.client  # None, or no host, over a unix socket
        return f"host:{client.host}" if client and client.host else ""
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not key:
        raise Refused(401, "UNAUTHENTICATED", "send an API key as Authorization: Bearer <key>",
                      headers={"WWW-Authenticate": 'Bearer realm="decider"'})
    if not keys.accepts(key.strip()):
        raise Refused(401, "UNAUTHENTICATED", "the API key is not valid",
                      headers={"WWW-Authenticate": 'Bearer realm="decider"'})
    return "key:" + digest(key.strip()).hex()[:16]


def _openapi(app: FastAPI) -> dict:
    """FastAPI's document, with the request schema (the body is parsed by hand, so FastAPI
    does not see it) and the bearer scheme the routes name."""
    if app.openapi_schema is None:
        doc = get_openapi(title=app.title, version=app.version, routes=app.routes,
                          description="docs/systemone.md: the mapping to decider")
        schema = SystemOneRequest.model_json_schema(ref_template="#/components/schemas/{model}")
        components = doc.setdefault("components", {})
        components.setdefault("schemas", {}).update(schema.pop("$defs", {}),
                                                    SystemOneRequest=schema)
        components["securitySchemes"] = {"HTTPBearer": {
            "type": "http", "scheme": "bearer", "description": "An API key of [http] api_keys "
            "or key_file; not asked for when none is configured (loopback)."}}
        app.openapi_schema = doc
    return app.openapi_schema


def _unexpected(request: Request, exc: Exception) -> Response:
    """A bug, not a refusal: logged with its traceback, answered 500 without it."""
    log.error("unexpected error", path=request.url.path, exc_info=exc)
    return refusal(500, "INTERNAL", "an unexpected error; the server's log has it")


def _noted(handler):
    """An exception handler that also notes the refusal's reason for the request's log."""
    async def handle(request: Request, exc: DeciderError | Refused) -> Response:
        request.state.outcome = exc.reason
        return handler(exc)
    return handle


class _Direct(APIRoute):
    """Endpoints take the Request and return a Response, without FastAPI's dependency
    injection (it cost more than the rest of a decision's HTTP work, docs/benchmarks.md);
    the route still describes itself in the OpenAPI document."""

    def get_route_handler(self):
        return self.endpoint


def build_app(frontend: Frontend, settings: Settings, metrics: Metrics | None = None
              ) -> HttpObserver:
    """The ASGI application: FastAPI's, inside HttpObserver (which sees every response, FastAPI's
    own 500 included, to give it a request id, a log line and its metrics)."""
    app = FastAPI(title="decider: the System One API", version=__version__, docs_url=None,
                  redoc_url=None, openapi_url="/openapi.json")
    app.router.route_class = _Direct
    metrics = metrics or Metrics()

    def served():
        model = frontend.facts()
        if model is None:
            raise Unavailable("no model is loaded yet")
        return model

    @app.post("/v1/systemone", response_model=SystemOneResponse, responses={
        422: {"model": ValidationFailed}} | {
        s: {"model": Refusal, "description": d} for s, d in REFUSALS.items()},
        openapi_extra={**SECURED, "requestBody": {"required": True, "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/SystemOneRequest"}}}}})
    async def systemone(request: Request) -> Response:
        """Answer typed questions about one state."""
        caller = _authorize(settings.keys, request)
        deadline = time.monotonic() + settings.request_timeout_seconds
        raw = await read_body(request, settings.max_body_bytes,
                              settings.request_timeout_seconds)
        body = parse_body(raw)
        asked = to_decider(body)
        request.state.questions = len(asked.request.questions)
        if settings.log_text:
            request.state.text = asked.request.text
        try:
            outcome = await _answer(frontend, asked.request, body.model, deadline, caller,
                                    request.receive)
        except InvalidRequest as e:
            raise asked.bad_body(e) from None
        request.state.outcome = "OK"
        request.state.prompt_tokens = outcome.decision.usage.prompt_tokens
        out = asked.response(outcome)
        return Response(out.model_dump_json(), media_type="application/json")

    @app.get("/v1/models", response_model=ModelList, openapi_extra=SECURED,
             responses={401: {"model": Refusal, "description": REFUSALS[401]}})
    async def models(request: Request) -> Response:
        """The model served here, under its name and each alias."""
        _authorize(settings.keys, request)
        m = served()
        card = ModelCard(name=m.name, description=m.description, release_date=m.release_date,
                         n_ctx=m.info.n_ctx, engine=m.engine, sha256=m.sha256)
        listed = ModelList(models=[card, *(card.model_copy(update={
            "name": a, "description": f"{m.name} under another name: {m.description}"})
            for a in frontend.aliases)])
        return Response(listed.model_dump_json(), media_type="application/json")

    @app.get("/healthz")
    async def healthz(request: Request) -> Response:
        """Live: the process answers HTTP."""
        return json_response(200, {"status": "ok"})

    @app.get("/readyz", responses={503: {"description": "Not ready (Retry-After)"}})
    async def readyz(request: Request) -> Response:
        """Ready only while the model is loaded and warm (gRPC health SERVING)."""
        if frontend.ready():
            return json_response(200, {"status": "ready"})
        return json_response(503, {"status": "not ready"}, {"Retry-After": "5"})

    @app.get("/metrics", openapi_extra=SECURED,
             responses={401: {"model": Refusal, "description": REFUSALS[401]}})
    async def prometheus(request: Request) -> Response:
        """Prometheus text: the daemon's metrics and the HTTP front end's."""
        _authorize(settings.keys, request)
        return Response(generate_latest(metrics.exposed()), media_type=CONTENT_TYPE_LATEST)

    app.add_exception_handler(BadBody, _noted(lambda e: field_errors_response(e.errors)))
    app.add_exception_handler(DeciderError, _noted(error_response))
    app.add_exception_handler(Refused, _noted(lambda e: refusal(
        e.status, e.reason, e.message, e.headers, **e.metadata)))
    app.add_exception_handler(Exception, _unexpected)
    app.openapi = lambda: _openapi(app)
    return HttpObserver(app, metrics)
