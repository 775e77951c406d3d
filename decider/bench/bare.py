"""The floors a daemon's front end is measured against: a bare grpc.aio server answering
the standard health Check, and a bare uvicorn server answering every POST with a fixed
JSON body, each in a process of its own, so that its CPU per call can be read from /proc
beside the daemon's per request in the same run on the same host.

    with bare_grpc() as (pid, address):
        ...  # load the address with health Checks; processes.cpu_seconds([pid])
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import socket
import tempfile
from collections.abc import Iterator

# what http_load reads from an answer: the engine's time, none here
ANSWER = b'{"x_decider": {"compute_ms": 0.0}}'


async def _serve_grpc(ready) -> None:
    import grpc
    from grpc_health.v1 import health_pb2_grpc
    from grpc_health.v1.health import aio

    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(aio.HealthServicer(), server)
    address = f"unix://{tempfile.mkdtemp(prefix='bare-')}/bare.sock"
    server.add_insecure_port(address)
    await server.start()
    ready.send(address)
    await server.wait_for_termination()


def _grpc_main(ready) -> None:
    asyncio.run(_serve_grpc(ready))


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


async def _serve_http(ready) -> None:
    import uvicorn

    # the daemon's own settings where they cost per request: a TCP socket asyncio sets
    # TCP_NODELAY on, httptools, no access log
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(
        _answer, http="httptools", lifespan="off", log_config=None, access_log=False,
        server_header=False))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.005)
    ready.send(f"http://127.0.0.1:{sock.getsockname()[1]}")
    await serving


def _http_main(ready) -> None:
    asyncio.run(_serve_http(ready))


@contextlib.contextmanager
def _spawned(target) -> Iterator[tuple[int, str]]:
    ctx = multiprocessing.get_context("spawn")
    ready, sent = ctx.Pipe(duplex=False)
    process = ctx.Process(target=target, args=(sent,), daemon=True)
    process.start()
    try:
        while not ready.poll(0.1) and process.is_alive():
            pass
        if not ready.poll():
            raise RuntimeError(f"the bare server ({target.__name__}) did not start")
        yield process.pid, ready.recv()
    finally:
        process.kill()
        process.join()


def bare_grpc() -> contextlib.AbstractContextManager[tuple[int, str]]:
    """A bare grpc.aio health server on a unix socket; yields its pid and address."""
    return _spawned(_grpc_main)


def bare_http() -> contextlib.AbstractContextManager[tuple[int, str]]:
    """A bare uvicorn server on a free loopback port; yields its pid and address."""
    return _spawned(_http_main)
