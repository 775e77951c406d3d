"""One mapping from every refusal to an HTTP status and body (docs/systemone.md).

Bad fields are 422 with FastAPI's {"detail": [{"loc", "msg", "type"}]}; everything else is
TypeSafe's {"detail": {"error_type", "message"}}, with decider's own reason beside them
(as over gRPC) and the numbers that go with it, and Retry-After where trying again later
can succeed. Statuses a client should not retry (the published SDKs retry 408, 429 and
5xx) are 4xx: a request over the window or the work bound is 400, not 500.
"""

from __future__ import annotations

import json

from starlette.responses import Response

from ..errors import DeciderError

STATUS = {"invalid": 422, "not_found": 404, "out_of_range": 400, "exhausted": 503,
          "unavailable": 503, "deadline": 504, "cancelled": 499, "internal": 500}
BY_REASON = {"QUEUE_FULL": 429}
RETRY_AFTER_S = {429: 1, 503: 5}
# TypeSafe's error types: the three it is seen to send, and those its clients' conformance
# suite uses for the statuses it leaves open
ERROR_TYPES = {401: "authentication_error", 403: "authentication_error", 404: "not_found",
               408: "timeout_error", 429: "rate_limit_error", 503: "overloaded_error",
               504: "timeout_error"}
OVER_BUDGET = {"PROMPT_TOO_LONG", "WORK_TOO_LARGE"}  # TypeSafe's max_tokens_exceeded


class Refused(Exception):
    """A refusal of the HTTP layer itself: no key, body too large or too slow, ..."""

    def __init__(self, status: int, reason: str, message: str, headers: dict | None = None,
                 **metadata) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message
        self.headers = headers or {}
        self.metadata = metadata


def error_type(status: int, reason: str) -> str:
    if reason in OVER_BUDGET:
        return "max_tokens_exceeded"
    return ERROR_TYPES.get(status, "internal_error" if status >= 500 else "api_usage_error")


def json_response(status: int, body: object, headers: dict | None = None) -> Response:
    return Response(json.dumps(body, ensure_ascii=False), status, headers,
                    media_type="application/json")


def refusal(status: int, reason: str, message: str, headers: dict | None = None,
            **metadata) -> Response:
    headers = dict(headers or {})
    if status in RETRY_AFTER_S:
        headers.setdefault("Retry-After", str(RETRY_AFTER_S[status]))
    return json_response(status, {"detail": {"error_type": error_type(status, reason),
                                             "message": message, "reason": reason,
                                             **metadata}}, headers)


def error_response(error: DeciderError) -> Response:
    """The response for a refusal from decider: counts as numbers where they are numbers."""
    status = BY_REASON.get(error.reason, STATUS[error.kind])
    numbers = {k: int(v) if v.isdigit() else v for k, v in error.metadata.items()}
    return refusal(status, error.reason, error.message, **numbers)


# OpenAI's error envelope, for the Decisions API: a bad field is a 400 naming it
OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                404: "not_found_error", 429: "rate_limit_error"}


def openai_refusal(status: int, reason: str, message: str, headers: dict | None = None,
                   param: str | None = None) -> Response:
    headers = dict(headers or {})
    if status in RETRY_AFTER_S:
        headers.setdefault("Retry-After", str(RETRY_AFTER_S[status]))
    kind = OPENAI_TYPES.get(status, "server_error" if status >= 500
                            else "invalid_request_error")
    return json_response(status, {"error": {"message": message, "type": kind, "param": param,
                                            "code": reason}}, headers)


def openai_error_response(error: DeciderError) -> Response:
    status = 400 if error.kind == "invalid" else BY_REASON.get(error.reason,
                                                              STATUS[error.kind])
    param = error.violations[0].field if error.violations else None
    return openai_refusal(status, error.reason, error.message, param=param)


def field_errors_response(errors: list[dict]) -> Response:
    return json_response(422, {"detail": errors})
