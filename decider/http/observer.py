"""Every HTTP request's request id, log line and metrics, as the gRPC side keeps them.

The request id is the caller's X-Request-ID when it is a sane token, else a new one; it
comes back as X-Request-ID and x-typesafe-request-id (where TypeSafe's SDK reads it).
Log lines are JSON (structlog) and never hold request text unless [server] log_text is on.
"""

from __future__ import annotations

import re
import time
import uuid

import structlog
from prometheus_client import Counter, Histogram

from ..service.metrics import Metrics

log = structlog.get_logger("decider.http")
DECIDE = ("/v1/systemone", "/v1/systemone/", "/v1/decisions")
ROUTES = (*DECIDE, "/v1/models", "/healthz", "/readyz", "/metrics", "/openapi.json")
PROBES = ("/healthz", "/readyz", "/metrics")  # logged at debug: scraped every few seconds
_TOKEN = re.compile(r"[A-Za-z0-9._:-]{1,128}")


class HttpObserver:
    """Pure ASGI middleware (no per-request task, unlike Starlette's BaseHTTPMiddleware),
    outside FastAPI's stack so that its 500 for a bug passes here too."""

    def __init__(self, app, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics
        r = metrics.registry
        self.requests = Counter("decider_http_requests", "HTTP requests by path and status",
                                ["path", "status"], registry=r)
        self._children: dict[tuple[str, str], tuple] = {}  # labels() looked up once
        self._outcomes: dict[str, Counter] = {}
        self._ignored = Counter("decider_http_ignored_fields", "Request fields decider does "
                                "not know, ignored", registry=r)
        self.seconds = Histogram("decider_http_request_seconds", "HTTP latency by path, end "
                                 "to end", ["path"], registry=r,
                                 buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1,
                                          2.5, 5, 10, 30))

    def ignored(self, n: int) -> None:
        self._ignored.inc(n)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        rid = given if _TOKEN.fullmatch(given) else uuid.uuid4().hex
        state = scope.setdefault("state", {})
        status, started = 500, False
        ids = [(b"x-request-id", rid.encode()), (b"x-typesafe-request-id", rid.encode())]

        async def send_with_id(message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status, started = message["status"], True
                message = {**message, "headers": [*message.get("headers", ()), *ids,
                                                  *state.get("rate_limit", ())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            if not started:  # else FastAPI answered the bug (500) and logged it
                raise
        finally:
            self._record(scope["method"], scope["path"], status, rid, state,
                         time.perf_counter() - t0)

    def _record(self, method, path, status, rid, state, seconds) -> None:
        route = path if path in ROUTES else "other"
        key = (route, str(status))
        if key not in self._children:
            self._children[key] = (self.requests.labels(*key), self.seconds.labels(route))
        count, latency = self._children[key]
        count.inc()
        latency.observe(seconds)
        fields = {k: state[k] for k in ("outcome", "questions", "prompt_tokens", "text")
                  if k in state}
        if path in DECIDE:
            outcome = state.get("outcome", f"HTTP_{status}")
            if outcome not in self._outcomes:
                self._outcomes[outcome] = self.metrics.requests.labels(outcome)
            self._outcomes[outcome].inc()
            self.metrics.latency.observe(seconds)
            self.metrics.prompt_tokens.inc(state.get("prompt_tokens", 0))
        emit = log.debug if path in PROBES else log.info
        emit("http", request_id=rid, method=method, path=path, status=status,
             ms=round(1000 * seconds, 2), **fields)
