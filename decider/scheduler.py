"""The scheduler: a bounded queue of requests, grouped into engine calls that run off the
event loop, one at a time (an engine context is not shared between threads).

A request whose deadline passes while it waits never reaches the engine; one whose
client went away is dropped. An engine failure fails the requests of that call, and the
owner's `on_engine_failure` decides what happens next (the server reloads the model).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import structlog

from .answers import Decision
from .errors import DeadlineExceeded, DeciderError, EngineFailure, QueueFull, Unavailable
from .metrics import Metrics
from .questions import Request

log = structlog.get_logger("decider.scheduler")


@dataclass(slots=True)
class Outcome:
    decision: Decision
    queue_ms: float
    compute_ms: float


@dataclass(slots=True)
class _Pending:
    request: Request
    deadline: float | None  # time.monotonic() seconds
    future: asyncio.Future
    enqueued: float = field(default_factory=time.monotonic)


class Scheduler:
    def __init__(
        self,
        decide_many: Callable[[list[Request]], list],
        *,
        max_queue: int = 256,
        max_batch: int = 16,
        on_engine_failure: Callable[[DeciderError], Awaitable[None]] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.decide_many = decide_many  # swapped by the server after a reload
        self.max_queue = max_queue
        self.max_batch = max_batch
        self.accepting = True
        self._on_failure = on_engine_failure
        self.metrics = metrics or Metrics()
        self._queue: deque[_Pending] = deque()
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="decider-engine")
        self._task: asyncio.Task | None = None
        self.engine_lock = asyncio.Lock()  # held by each engine call; a model swap waits
        self.busy_since: float | None = None  # monotonic start of the running engine call

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="scheduler")

    async def submit(self, request: Request, deadline: float | None = None) -> Outcome:
        if not self.accepting:
            raise Unavailable("the service is not accepting requests (draining or reloading)")
        if len(self._queue) >= self.max_queue:
            raise QueueFull(f"the queue is full ({self.max_queue} requests waiting)",
                            max_queue=self.max_queue)
        pending = _Pending(request, deadline, asyncio.get_running_loop().create_future())
        self._queue.append(pending)
        self.metrics.queue_depth.set(len(self._queue))
        self._wake.set()
        try:
            return await pending.future
        except asyncio.CancelledError:  # the client went away: free its place
            pending.future.cancel()
            if pending in self._queue:
                self._queue.remove(pending)
            raise

    async def drain(self) -> None:
        """Stop accepting; return once every accepted request has its answer."""
        self.accepting = False
        while self._queue or self.busy_since is not None:
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
        self._executor.shutdown(wait=True)

    def _take_batch(self) -> list[_Pending]:
        batch, now = [], time.monotonic()
        while self._queue and len(batch) < self.max_batch:
            p = self._queue.popleft()
            if p.future.done():
                continue
            if p.deadline is not None and now >= p.deadline:
                p.future.set_exception(DeadlineExceeded(
                    "the deadline passed while the request waited for the engine"))
                continue
            batch.append(p)
        self.metrics.queue_depth.set(len(self._queue))
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            while batch := self._take_batch():
                self.busy_since = started = time.monotonic()
                self.metrics.engine_calls.inc()
                self.metrics.engine_requests.inc(len(batch))
                try:
                    async with self.engine_lock:
                        results = await loop.run_in_executor(
                            self._executor, self.decide_many, [p.request for p in batch])
                except Exception as e:  # the engine call itself failed: all of it fails
                    error = e if isinstance(e, DeciderError) else EngineFailure(
                        f"the engine call failed: {type(e).__name__}: {e}")
                    log.error("engine failure", reason=error.reason, error=error.message,
                              requests=len(batch))
                    self.metrics.engine_failures.labels(error.reason).inc()
                    self._resolve(batch, [error] * len(batch))
                    self.busy_since = None
                    if self._on_failure and error.kind == "internal":
                        await self._on_failure(error)
                    continue
                finally:
                    self.busy_since = None
                self._resolve(batch, results, started, 1000 * (time.monotonic() - started))

    @staticmethod
    def _resolve(batch, results, started: float = 0.0, compute_ms: float = 0.0) -> None:
        """Resolve each pending future with its result or error."""
        for p, r in zip(batch, results):
            if p.future.done():
                continue
            if isinstance(r, Exception):
                p.future.set_exception(r)
            else:
                p.future.set_result(Outcome(r, 1000 * (started - p.enqueued), compute_ms))
