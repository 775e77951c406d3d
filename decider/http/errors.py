"""One mapping from every refusal to an HTTP status and body (docs/systemone.md).

Bad fields are 422 with FastAPI's {"detail": [{"loc", "msg", "type"}]}; everything else is
{"detail": {"reason", "message", ...numbers}}, the reason being decider's own (as over
gRPC), with Retry-After where trying again later can succeed.
"""

from __future__ import annotations

import json

from starlette.responses import Response

from ..errors import DeciderError

STATUS = {"invalid": 422, "not_found": 404, "out_of_range": 500, "exhausted": 503,
          "unavailable": 503, "deadline": 504, "cancelled": 499, "internal": 500}
BY_REASON = {"PROMPT_TOO_LONG": 400, "QUEUE_FULL": 429}
RETRY_AFTER_S = {429: 1, 503: 5}


class Refused(Exception):
    """A refusal of the HTTP layer itself: no key, body too large or too slow, ..."""

    def __init__(self, status: int, reason: str, message: str, headers: dict | None = None,
                 **metadata) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message
        self.headers = headers or {}
        self.metadata = metadata


def json_response(status: int, body: object, headers: dict | None = None) -> Response:
    return Response(json.dumps(body, ensure_ascii=False), status, headers,
                    media_type="application/json")


def refusal(status: int, reason: str, message: str, headers: dict | None = None,
            **metadata) -> Response:
    headers = dict(headers or {})
    if status in RETRY_AFTER_S:
        headers.setdefault("Retry-After", str(RETRY_AFTER_S[status]))
    return json_response(status, {"detail": {"reason": reason, "message": message,
                                             **metadata}}, headers)


def error_response(error: DeciderError) -> Response:
    """The response for a refusal from decider: counts as numbers where they are numbers."""
    status = BY_REASON.get(error.reason, STATUS[error.kind])
    numbers = {k: int(v) if v.isdigit() else v for k, v in error.metadata.items()}
    return refusal(status, error.reason, error.message, **numbers)


def field_errors_response(errors: list[dict]) -> Response:
    return json_response(422, {"detail": errors})
