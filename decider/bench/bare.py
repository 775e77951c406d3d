"""The floors a daemon's front end is measured against: a bare grpc.aio server answering
the standard health Check, and a bare uvicorn server answering every POST with a fixed
JSON body, each in a process of its own, so that its CPU per call can be read from /proc
beside the daemon's per request in the same run on the same host.

    with bare_grpc("unix:///tmp/bare.sock") as pid:
        ...  # load unix:///tmp/bare.sock with health Checks; processes.cpu_seconds([pid])
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
from collections.abc import Iterator

# what http_load reads from an answer: the engine's time, none here
ANSWER = b'{"x_decider": {"compute_ms": 0.0}}'


async def _serve_grpc(address: str, ready) -> None:
    import grpc
    from grpc_health.v1 import health_pb2_grpc
    from grpc_health.v1.health import aio

    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(aio.HealthServicer(), server)
    server.add_insecure_port(address)
    await server.start()
    ready.set()
    await server.wait_for_termination()


def _grpc_main(address: str, ready) -> None:
    asyncio.run(_serve_grpc(address, ready))


async def _answer(scope, receive, send) -> None:
    """The least an ASGI app can do: read the request's body, send a fixed JSON one."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(ANSWER)).encode())]})
    await send({"type": "http.response.body", "body": ANSWER})


async def _serve_http(port: int, ready) -> None:
    import uvicorn

    # the daemon's own settings where they cost per request: httptools, no access log
    server = uvicorn.Server(uvicorn.Config(
        _answer, host="127.0.0.1", port=port, http="httptools", lifespan="off",
        log_config=None, access_log=False, server_header=False))
    serving = asyncio.create_task(server.serve())
    while not server.started and not serving.done():
        await asyncio.sleep(0.005)
    ready.set()
    await serving


def _http_main(port: int, ready) -> None:
    asyncio.run(_serve_http(port, ready))


@contextlib.contextmanager
def _spawned(target, *args) -> Iterator[int]:
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    process = ctx.Process(target=target, args=(*args, ready), daemon=True)
    process.start()
    try:
        while not ready.wait(0.1) and process.is_alive():
            pass
        if not process.is_alive():
            raise RuntimeError(f"the bare server ({target.__name__}) did not start")
        yield process.pid
    finally:
        process.kill()
        process.join()


def bare_grpc(address: str) -> contextlib.AbstractContextManager[int]:
    """A bare grpc.aio health server listening on `address`; yields its pid."""
    return _spawned(_grpc_main, address)


def bare_http(port: int) -> contextlib.AbstractContextManager[int]:
    """A bare uvicorn server on 127.0.0.1:port; yields its pid."""
    return _spawned(_http_main, port)
