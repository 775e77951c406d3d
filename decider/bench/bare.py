"""The floors a daemon's front end is measured against: a bare grpc.aio server answering
the standard health Check, and a bare uvicorn server answering every POST with a fixed
JSON body, each in a process of its own, so that its CPU per call can be read from /proc
beside the daemon's per request in the same run on the same host.

With `hop=True` each call first crosses to another process and back, as a daemon's
request crosses to its engine process: the least such a hop costs (a few bytes over one
ZeroMQ DEALER socket read from the event loop's reader, the calls of one loop turn in
one message, an echo process on the other side). That server is the floor of a front
end in front of an engine process; the bare one, of a server that does no work. An
engine on the same CPUs also sweeps the caches the front end works from (llama.cpp reads
its weights every call): `read_mb` makes the echo process read that many MB a message,
and the floor's CPU a call rises with it (docs/experiments.md, 2026-12-07). `busy_ms`
keeps the echo process busy that long a message, as an engine's call keeps its process
(computing on the CPU, spinning on the GPU's stream): a server whose answer waits on
another process answers later than a bare one by more than the wait (docs/experiments.md,
2026-12-08), and that is the floor of one client's latency.

    with bare_grpc() as (pid, address):
        ...  # load the address with health Checks; processes.cpu_seconds([pid])
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import multiprocessing
import socket
import tempfile
import time
from collections.abc import Iterator

import zmq

Serving = contextlib.AbstractContextManager[tuple[int, str]]  # the server's pid, address
# what http_load reads from an answer: the engine's time, none here
ANSWER = b'{"x_decider": {"compute_ms": 0.0}}'


def _echo_main(address: str, read_mb: int, busy_ms: float) -> None:
    """The other process of a hop: every message back to its sender, after reading
    `read_mb` MB of its memory, busy `busy_ms` ms in all."""
    import numpy as np

    weights = np.ones(read_mb << 18, dtype=np.float32)
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.bind(address)
    while True:
        message = sock.recv_multipart()
        until = time.perf_counter() + busy_ms / 1000
        weights.sum()
        while time.perf_counter() < until:  # busy, not asleep: as an engine's call is
            pass
        sock.send_multipart(message)


class _Hop:
    """A call's round trip to the echo process: 8 bytes of id out, the same back."""

    def __init__(self, address: str) -> None:
        self._sock = zmq.Context.instance().socket(zmq.DEALER)
        self._sock.connect(address)
        self._pending: dict[bytes, asyncio.Future] = {}
        self._outbox: list[bytes] = []
        self._ids = itertools.count()
        asyncio.get_running_loop().add_reader(self._sock.FD, self._receive)

    async def __call__(self) -> None:
        rid = next(self._ids).to_bytes(8, "little")
        future = self._pending[rid] = asyncio.get_running_loop().create_future()
        self._outbox.append(rid)
        if len(self._outbox) == 1:
            asyncio.get_running_loop().call_soon(self._flush)
        await future

    def _flush(self) -> None:
        ids, self._outbox = b"".join(self._outbox), []
        self._sock.send(ids, zmq.NOBLOCK)
        self._receive()

    def _receive(self) -> None:
        while self._sock.get(zmq.EVENTS) & zmq.POLLIN:
            ids = self._sock.recv(zmq.NOBLOCK)
            for k in range(0, len(ids), 8):
                self._pending.pop(ids[k:k + 8]).set_result(None)


async def _no_hop() -> None:
    pass


def _hop_to(address: str | None):
    return _Hop(address) if address else _no_hop


async def _serve_grpc(ready, hop_address: str | None) -> None:
    import grpc
    from grpc_health.v1 import health_pb2_grpc
    from grpc_health.v1.health import aio

    hop = _hop_to(hop_address)

    class Health(aio.HealthServicer):
        async def Check(self, request, context):
            await hop()
            return await super().Check(request, context)

    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(Health(), server)
    address = f"unix://{tempfile.mkdtemp(prefix='bare-')}/bare.sock"
    server.add_insecure_port(address)
    await server.start()
    ready.send(address)
    await server.wait_for_termination()


def _grpc_main(ready, hop_address: str | None) -> None:
    asyncio.run(_serve_grpc(ready, hop_address))


async def _answer(scope, receive, send, hop=_no_hop) -> None:
    """The least an ASGI app can do: read the request's body, send a fixed JSON one."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await hop()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(ANSWER)).encode())]})
    await send({"type": "http.response.body", "body": ANSWER})


async def _serve_http(ready, hop_address: str | None) -> None:
    import uvicorn

    # the daemon's own settings where they cost per request: a TCP socket asyncio sets
    # TCP_NODELAY on, httptools, no access log
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(
        functools.partial(_answer, hop=_hop_to(hop_address)), interface="asgi3",
        http="httptools", lifespan="off", log_config=None, access_log=False, server_header=False))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.005)
    ready.send(f"http://127.0.0.1:{sock.getsockname()[1]}")
    await serving


def _http_main(ready, hop_address: str | None) -> None:
    asyncio.run(_serve_http(ready, hop_address))


@contextlib.contextmanager
def _spawned(target, hop: bool, read_mb: int = 0, busy_ms: float = 0.0
             ) -> Iterator[tuple[int, str]]:
    ctx = multiprocessing.get_context("spawn")
    hop_address = f"ipc://{tempfile.mkdtemp(prefix='bare-')}/hop" if hop else None
    echo = ctx.Process(target=_echo_main, args=(hop_address, read_mb, busy_ms),
                       daemon=True) if hop else None
    ready, sent = ctx.Pipe(duplex=False)
    process = ctx.Process(target=target, args=(sent, hop_address), daemon=True)
    try:
        for p in (echo, process):
            if p is not None:
                p.start()
        while not ready.poll(0.1) and process.is_alive():
            pass
        if not ready.poll():
            raise RuntimeError(f"the bare server ({target.__name__}) did not start")
        yield process.pid, ready.recv()
    finally:
        for p in (process, echo):
            if p is not None and p.pid is not None:
                p.kill()
                p.join()


def bare_grpc(hop: bool = False, read_mb: int = 0, busy_ms: float = 0.0) -> Serving:
    """A bare grpc.aio health server on a unix socket (each Check after a hop to another
    process, with `hop`); yields its pid and address."""
    return _spawned(_grpc_main, hop, read_mb, busy_ms)


def bare_http(hop: bool = False, read_mb: int = 0, busy_ms: float = 0.0) -> Serving:
    """A bare uvicorn server on a free loopback port (each answer after a hop to another
    process, with `hop`); yields its pid and address."""
    return _spawned(_http_main, hop, read_mb, busy_ms)
