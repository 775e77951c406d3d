"""The System One HTTP API for tests: serve_http (real uvicorn, a real socket) in an event
loop of its own thread, over a real Decider behind a Scheduler, so a test talks to it with
blocking clients (TypeSafe's SDK, httpx2, raw sockets) as an application would."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace

from decider.config import Config, HttpSection, ServerSection
from decider.http.backend import LocalBackend
from decider.http.serve import serve_http

KEY = "test-key-0123456789abcdef"  # what clients send
MODEL = "gemma-3-270m"


class HttpThread:
    def __init__(self, decider, http: HttpSection | None = None, *,
                 server: ServerSection | None = None, **scheduler_options) -> None:
        http = http or HttpSection(address="127.0.0.1:0", api_keys=(KEY,))
        self.cfg = replace(Config(), http=http, server=server or ServerSection())
        self.decider, self.options = decider, scheduler_options
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> HttpThread:
        self.thread.start()
        self.run(self._start())
        return self

    async def _start(self) -> None:
        self.backend = LocalBackend(self.decider, **self.options)
        self.backend.start()
        self.handle = await serve_http(self.cfg, self.backend, self.backend.scheduler.metrics)
        self.url = self.handle.url

    def run(self, coro, timeout: float = 120):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def __exit__(self, *exc) -> None:
        async def stop() -> None:
            await self.handle.stop()
            await self.backend.close()

        self.run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
