"""The one interceptor of the gRPC service: every Decider RPC gets a request id, the one
error mapping (wire.error_status; no traceback reaches a client), its metrics and its log
line, written once the call has ended. The request bytes are decoded here too, so a
message that is not valid protobuf (or holds invalid UTF-8) is INVALID_ARGUMENT with
ErrorInfo, counted and logged like any other refusal, not the UNKNOWN grpc would answer.
DecideBatch items are recorded one by one through `record`, like Decide calls."""

from __future__ import annotations

import re
import time
import uuid

import grpc
import structlog
from grpc_status import rpc_status

from ..errors import DeciderError, FieldViolation, InvalidRequest
from .convert import error_status, internal_status
from .metrics import Metrics

log = structlog.get_logger("decider.server")

SERVICE_PREFIX = "/decider.v1.Decider/"
_CLIENT_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


def request_id(context) -> str:
    """The client's x-request-id when it is a sane one, else a new one."""
    given = dict(context.invocation_metadata() or ()).get("x-request-id", "")
    return given if _CLIENT_ID.fullmatch(given) else uuid.uuid4().hex[:16]


class Observer(grpc.aio.ServerInterceptor):
    def __init__(self, metrics: Metrics, log_text: bool = False) -> None:
        self.metrics = metrics
        self.log_text = log_text  # the operator's opt-in; off, no text is ever logged
        self._observed: dict[str, tuple] = {}  # per method: (its handler, the one wrapped)
        self._outcomes: dict[str, object] = {}  # the requests counter's child per outcome

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or not details.method.startswith(SERVICE_PREFIX) \
                or handler.unary_unary is None:
            return handler
        known = self._observed.get(details.method)
        if known is None or known[0] is not handler:  # wrapped once, not per call
            known = self._observed[details.method] = (
                handler, self._wrap(details.method.removeprefix(SERVICE_PREFIX), handler))
        return known[1]

    def _wrap(self, method: str, handler):
        inner, decode = handler.unary_unary, handler.request_deserializer

        async def observed(raw: bytes, context):
            rid, started = request_id(context), time.monotonic()
            context.set_trailing_metadata((("x-request-id", rid),))
            # the log line and metrics once the call has ended, the answer already sent:
            # off the caller's wait (0.16 ms at one client, docs/experiments.md)
            line = {"outcome": "CANCELLED"}  # unless the call ends otherwise
            context.add_done_callback(lambda _: self.record(method, rid, started, **line))
            try:
                try:
                    request = decode(raw)
                except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and kin
                    raise InvalidRequest([FieldViolation(
                        "request", f"is not a valid {method} message: {e}")]) from None
                response = await inner(request, context)
            except DeciderError as e:
                line["outcome"] = e.reason
                status = rpc_status.to_status(error_status(e))
                # the status supersedes the trailers set above: the request id again, and
                # gRPC's own word against an automatic retry (gRFC A6: a negative
                # pushback) where the request reached an engine
                trailers = (("x-request-id", rid),) + (
                    (("grpc-retry-pushback-ms", "-1"),) if e.reached_engine else ())
                await context.abort_with_status(status._replace(
                    trailing_metadata=status.trailing_metadata + trailers))
            except Exception:  # a bug: logged with its traceback, the client gets INTERNAL
                log.exception("unexpected error", method=method, request_id=rid)
                line["outcome"] = "INTERNAL"
                await context.abort_with_status(rpc_status.to_status(internal_status()))
            text = {"text": request.text} if self.log_text and method == "Decide" else {}
            line.update(outcome="OK", **_fields(response), **text)
            return response

        return grpc.unary_unary_rpc_method_handler(
            observed, request_deserializer=None,
            response_serializer=handler.response_serializer)

    def record(self, method: str, rid: str, started: float, outcome: str, **fields) -> None:
        seconds = time.monotonic() - started
        if method in ("Decide", "DecideItem"):
            if outcome not in self._outcomes:  # labels() looked up once per outcome
                self._outcomes[outcome] = self.metrics.requests.labels(outcome)
            self._outcomes[outcome].inc()
            self.metrics.latency.observe(seconds)
            if "prompt_tokens" in fields:
                self.metrics.prompt_tokens.inc(fields["prompt_tokens"])
        log.info(method.lower(), request_id=rid, outcome=outcome,
                 ms=round(1000 * seconds, 2), **fields)


def _fields(response) -> dict:
    """What a response's log line says about it (never the text)."""
    if hasattr(response, "usage"):
        return {"questions": len(response.answers),
                "prompt_tokens": response.usage.prompt_tokens}
    if hasattr(response, "items"):
        return {"items": len(response.items)}
    return {}
