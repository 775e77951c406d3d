"""Extra front-end processes (`decider serve --frontends N`): where one process's Python
work per request (gRPC, planning, answers) cannot keep the engine busy, several share the
TCP listeners and talk to the one engine process, each over its own ZeroMQ socket.

The daemon process stays the supervisor: it tells each worker, over a pipe, which engine
process serves (Serve), that none does (Down: the requests it held are refused with its
error), and when to drain and stop (Stop); a worker tells it once it listens (Listening:
the daemon is ready when every one does). A worker whose daemon is gone drains and exits
too. Spawned, never forked.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import sys

import structlog

from ..config import Config
from . import messages
from .messages import Down, Listening, Serve, Stop
from .process_names import FRONT_END, name_this_process


def worker_main(cfg: Config, conn) -> None:
    from ..logs import configure

    name_this_process(FRONT_END)
    configure(level=cfg.server.log_level, fmt=cfg.server.log_format, stream=sys.stdout)
    asyncio.run(_serve(cfg, conn))


async def _serve(cfg: Config, conn) -> None:
    from .frontend import ServedModel
    from .metrics import Metrics
    from .servers import Servers

    servers = Servers(cfg, Metrics())
    await servers.set_health(False)
    loop = asyncio.get_running_loop()
    told: asyncio.Queue[Serve | Down | Stop] = asyncio.Queue()  # in order, one at a time

    async def swap(message: Serve | Down) -> None:
        old = servers.frontend.current
        if isinstance(message, Serve):
            servers.frontend.current = await ServedModel.open(message.facts, message.address,
                                                         message.limits)
        else:
            servers.frontend.current = None
            if old is not None:
                old.client.fail_all(message.error.error())
        # it listens once it can serve: the kernel gives the shared ports' connections to
        # listening processes only, so none lands on one still opening its tokenizer
        if servers.server is None and servers.frontend.current is not None:
            await servers.start()  # sets servers.server before it yields
            structlog.get_logger("decider.server").info("front-end process serving",
                                                        pid=os.getpid())
            with contextlib.suppress(OSError):  # a daemon gone: its pipe's end stops us
                conn.send_bytes(messages.encode(Listening()))  # its readiness waits on it
        await servers.set_health(servers.frontend.current is not None)
        if old is not None:  # the old engine answers what it holds, then goes
            loop.create_task(_close_when_idle(old.client))

    def on_message() -> None:
        try:
            message = messages.to_worker(conn.recv_bytes())
        except (EOFError, OSError):  # the daemon is gone
            loop.remove_reader(conn.fileno())
            message = Stop()
        told.put_nowait(message)

    loop.add_reader(conn.fileno(), on_message)
    while not isinstance(message := await told.get(), Stop):
        await swap(message)
    await servers.drain(cfg.server.grace_seconds)
    await servers.close()


async def _close_when_idle(client) -> None:
    """Every request waits with a deadline, so the old engine's client is idle soon."""
    await client.idle.wait()
    await client.close()


class FrontendWorker:
    """The daemon's handle on one extra front-end process."""

    def __init__(self, cfg: Config) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=worker_main, args=(cfg, child),
                                   name="decider-frontend", daemon=True)
        self.process.start()
        child.close()
        loop = asyncio.get_running_loop()
        self.ended = loop.create_future()  # its exit code, once it is gone
        self.listening = loop.create_future()  # set once it takes its share of connections
        loop.add_reader(self.process.sentinel, self._on_exit)
        loop.add_reader(self._conn.fileno(), self._on_message)

    def _on_message(self) -> None:
        try:
            messages.from_worker(self._conn.recv_bytes())
        except (EOFError, OSError):  # it is gone: its exit is watched apart
            asyncio.get_running_loop().remove_reader(self._conn.fileno())
            return
        if not self.listening.done():
            self.listening.set_result(None)

    def _on_exit(self) -> None:
        asyncio.get_running_loop().remove_reader(self.process.sentinel)
        self.process.join()
        if not self.ended.done():
            self.ended.set_result(self.process.exitcode)

    def send(self, message: Serve | Down | Stop) -> None:
        try:
            self._conn.send_bytes(messages.encode(message))
        except (BrokenPipeError, OSError):  # it is gone: the daemon's watch says so
            pass

    async def stop(self, timeout: float) -> None:
        self.send(Stop())
        try:
            await asyncio.wait_for(asyncio.shield(self.ended), timeout)
        except TimeoutError:
            self.process.kill()
