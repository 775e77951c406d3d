"""What every API route does around its work: the caller's key checked first, the body
read within the request's deadline, and the decision waited for while the client stays
(one that goes away cancels it, and the engine process drops the request)."""

from __future__ import annotations

import asyncio
import time

from fastapi import Request

from ..answers import Outcome
from ..questions import Request as DeciderRequest
from ..service.frontend import Frontend
from .auth import Keys, digest
from .body import read_body
from .errors import Refused

MULTIPART = "multipart/form-data"
IMAGES = ("images are not supported: this server reads text; send application/json with "
          "the state as text or JSON")


def authorize(keys: Keys, request: Request) -> str:
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


def refuse_multipart(request: Request) -> None:
    """A body with images (TypeSafe's SDK sends an Image asset as multipart/form-data) is
    refused plainly, before it is read."""
    if request.headers.get("content-type", "").lower().startswith(MULTIPART):
        raise Refused(415, "IMAGES_UNSUPPORTED", IMAGES)


async def admit(request: Request, settings) -> tuple[str, float, bytes]:
    """What every decision route does first: the caller authorized and counted against
    its rate limits, images refused, the request's deadline set, and its body read
    within it. (caller, deadline, body)"""
    caller = authorize(settings.keys, request)
    if settings.rate_limits:  # its fields go out with the answer (observer.py)
        request.state.rate_limit = settings.rate_limits.take(caller)
    refuse_multipart(request)
    deadline = time.monotonic() + settings.request_timeout_seconds
    raw = await read_body(request, settings.max_body_bytes, settings.request_timeout_seconds)
    return caller, deadline, raw


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def answer(frontend: Frontend, asked: DeciderRequest, model: str, deadline: float,
                 caller: str, request: Request) -> Outcome:
    """The front end's outcome; the wait is cancelled (and the engine drops the request)
    if the client goes away first."""
    me = asyncio.current_task()
    gone = asyncio.ensure_future(_disconnected(request.receive))
    gone.add_done_callback(lambda g: g.cancelled() or me.cancel())
    try:
        return await frontend.submit(asked, deadline, model, caller=caller)
    except asyncio.CancelledError:
        if gone.done() and not gone.cancelled() and me.uncancel() == 0:
            raise Refused(499, "CLIENT_GONE", "the client closed the connection") from None
        raise
    finally:
        gone.cancel()
