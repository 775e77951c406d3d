"""The engine loop: the engine process's one thread of work.

A request over the work bound is refused as it arrives. The moment the engine is free it
takes everything waiting (up to `max_batch` requests, in arrival order; later ones that
share a prefix with those take the places of the youngest that share none) into one
engine call, the requests that share a prefix as one job (decider/prefix_groups.py). A
request whose deadline passed while it waited, or whose front end cancelled it, never
reaches the engine; one past `max_queue` waiting is refused at once. Between the chunks
of a call (engines that have them) the loop reads its socket again: a job whose requests
are all cancelled or past their deadlines by then is dropped from the rest of the call.
Results go back raw but guarded, one message per front end per call
(decider/service/messages.py).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, replace

import structlog
import zmq

from ..engines import Engine, ScoreJob
from ..engines.prefix_cache import CacheStats
from ..errors import (
    Cancelled,
    DeadlineExceeded,
    DeciderError,
    EngineFailure,
    QueueFull,
)
from ..guard import LogitsGuard
from ..plan import check_work
from ..prefix_groups import group_by_prefix, score_groups
from ..questions import Limits
from . import messages
from .messages import Answered, Cancel, Refused, Score, Stop, WireError
from .metrics import Metrics

log = structlog.get_logger("decider.engine")

EXIT_STOPPED, EXIT_ENGINE_FAILED = 0, 3  # the engine process's exit codes
POLLIN = int(zmq.POLLIN)  # a plain int: the flag type's operators cost more than the test


@dataclass(slots=True)
class _Waiting:
    sender: bytes
    rid: int
    job: ScoreJob
    deadline: float
    sent: float  # by the front end: queue time counts from there
    prefix_hash: int  # hashed once: a scan of the queue compares these
    cancelled: bool = False


def _ended(w: _Waiting) -> DeciderError | None:
    """Why the engine should stop working on a request now, if it should."""
    if w.cancelled:
        return Cancelled("the request was cancelled while the engine worked on it")
    if time.monotonic() >= w.deadline:
        return DeadlineExceeded("the deadline passed while the engine worked on the request")
    return None


class EngineLoop:
    def __init__(self, engine: Engine, *, max_batch: int, max_queue: int, limits: Limits,
                 heartbeat, metrics: Metrics) -> None:
        self.engine = engine
        self.limits = limits
        self.metrics = metrics
        self.guard = LogitsGuard(engine.info.sentinel)
        self.max_batch = max_batch
        self.max_queue = max_queue
        # shared double: time.monotonic() of the last sign of progress (a turn of the loop,
        # a chunk of a call), read by the supervisor's liveness check
        self.heartbeat = heartbeat
        self._waiting: dict[tuple[bytes, int], _Waiting] = {}  # arrival order
        self._running: dict[tuple[bytes, int], _Waiting] = {}  # in the engine call now
        self._replies: dict[bytes, list[Answered | Refused]] = {}
        self._cache_counted = CacheStats()  # the prefix cache's counts already in metrics

    def serve(self, sock: zmq.Socket, control) -> int:
        """Until the supervisor says stop (then every accepted request is answered first),
        or the engine fails; returns the process's exit code. The supervisor's pings only
        wake the loop: its heartbeat is the answer."""
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(control, zmq.POLLIN)
        stopping = False
        while True:
            ready = dict(poller.poll(0 if self._waiting else None))
            self.heartbeat.value = time.monotonic()
            if sock in ready:
                self._receive(sock)
            while control.fileno() in ready and control.poll():  # zmq gives back its fd
                stopping = isinstance(messages.control(control.recv_bytes()), Stop) or stopping
            batch = self._take()
            failed = bool(batch) and self._call(batch, sock)
            self._flush(sock)
            if failed:
                return EXIT_ENGINE_FAILED
            if stopping and not self._waiting:
                return EXIT_STOPPED

    def _receive(self, sock: zmq.Socket) -> None:
        """Everything the socket holds, read while its EVENTS say a message waits (a
        zmq.Again raised per drain costs the engine thread more than the test)."""
        while sock.get(zmq.EVENTS) & POLLIN:
            sender, payload = sock.recv_multipart(zmq.NOBLOCK)
            for op in messages.to_engine(payload):
                match op:
                    case Score():
                        self._admit(sender, op)
                    case Cancel(rid=rid):
                        w = self._waiting.pop((sender, rid), None) or \
                            self._running.get((sender, rid))
                        if w is not None:
                            w.cancelled = True

    def _admit(self, sender: bytes, op: Score) -> None:
        try:  # the work bound needs the engine's layout: checked here
            check_work(self.engine, op.job, self.limits)
        except DeciderError as e:
            return self._refuse(sender, op.rid, e)
        if len(self._waiting) >= self.max_queue:
            return self._refuse(sender, op.rid, QueueFull(
                f"the queue is full ({self.max_queue} requests waiting)",
                max_queue=self.max_queue))
        self._waiting[sender, op.rid] = _Waiting(sender, op.rid, op.job, op.deadline, op.sent,
                                                 hash(op.job.prefix))

    def _take(self) -> list[_Waiting]:
        """Up to max_batch requests in arrival order (while more wait, with riders)."""
        batch, now = [], time.monotonic()
        while self._waiting and len(batch) < self.max_batch:
            w = self._waiting.pop(next(iter(self._waiting)))
            if now >= w.deadline:
                self._refuse(w.sender, w.rid, DeadlineExceeded(
                    "the deadline passed while the request waited for the engine"))
            else:
                batch.append(w)
        if self._waiting and batch:
            batch = self._with_riders(batch, now)
        self.metrics.queue_depth.set(len(self._waiting))
        return batch

    def _with_riders(self, batch: list[_Waiting], now: float) -> list[_Waiting]:
        """Later requests that share a taken request's prefix take the places of the
        youngest taken that share theirs with none: they ride on a read the call makes
        anyway. Those put back keep their turn at the queue's head; the oldest stays."""
        taken = {w.prefix_hash: w.job.prefix for w in batch}
        riders = [key for key, w in self._waiting.items() if now < w.deadline and
                  taken.get(w.prefix_hash, ()) == w.job.prefix]
        if not riders:
            return batch
        shared = Counter(w.prefix_hash for w in batch)
        shared.update(self._waiting[key].prefix_hash for key in riders)
        alone = [i for i in range(len(batch) - 1, 0, -1) if shared[batch[i].prefix_hash] == 1]
        out = set(alone[:len(riders)])
        back = {(w.sender, w.rid): w for i, w in enumerate(batch) if i in out}
        batch = [w for i, w in enumerate(batch) if i not in out]
        batch += [self._waiting.pop(key) for key in riders[:len(out)]]
        self._waiting = back | self._waiting
        return batch

    def _call(self, batch: list[_Waiting], sock: zmq.Socket) -> bool:
        """One engine call; True when the engine failed and must be replaced."""
        started = time.monotonic()
        self.metrics.engine_busy.set(1)
        self.metrics.engine_calls.inc()
        self.metrics.engine_requests.inc(len(batch))
        self._running = {(w.sender, w.rid): w for w in batch}

        jobs = [w.job for w in batch]
        groups = group_by_prefix(jobs)
        self.metrics.engine_shared_prefix.inc(len(batch) - len(groups))

        def stop(members: tuple[int, ...]) -> DeciderError | None:
            """Asked between chunks: a job ends when every request in it has ended."""
            self.heartbeat.value = time.monotonic()  # a chunk done: progress
            self._receive(sock)  # cancellations sent since the call began
            self._flush(sock)  # and refusals of what arrived meanwhile go out now
            ended = [_ended(batch[i]) for i in members]
            return ended[0] if all(ended) else None

        try:
            results = score_groups(self.engine, self.guard, jobs, groups, stop)
        except Exception as e:  # noqa: BLE001 - the call itself failed: all of it fails
            error = e if isinstance(e, DeciderError) else EngineFailure(
                f"the engine call failed: {type(e).__name__}: {e}")
            log.error("engine failure", reason=error.reason, error=error.message,
                      requests=len(batch))
            self.metrics.engine_failures.labels(error.reason).inc()
            for w in batch:
                self._refuse(w.sender, w.rid, error)
            return error.kind == "internal"  # out of memory: that call only, no reload
        finally:
            self._running = {}
            self.metrics.engine_busy.set(0)
            self._count_cache()
        compute_ms = 1000 * (time.monotonic() - started)
        for w, r in zip(batch, results, strict=True):
            if isinstance(r, (Cancelled, DeadlineExceeded)):  # a shared job stopped
                r = _ended(w) or r  # each its own reason
            if isinstance(r, DeciderError):
                self._refuse(w.sender, w.rid, r)
            else:
                self._reply(w.sender, Answered(w.rid, r, 1000 * (started - w.sent),
                                               compute_ms, r.cached_tokens))
        return False

    def _count_cache(self) -> None:
        """The prefix cache's counts since the last call, into the metrics."""
        if self.engine.prefix_cache is None:
            return
        now, was = replace(self.engine.prefix_cache.stats), self._cache_counted
        m = self.metrics
        m.cache_lookups.labels("hit").inc(now.hits - was.hits)
        m.cache_lookups.labels("miss").inc(now.misses - was.misses)
        m.cache_tokens.inc(now.hit_tokens - was.hit_tokens)
        m.cache_evictions.inc(now.evictions - was.evictions)
        m.cache_bytes.set(now.bytes)
        self._cache_counted = now

    def _refuse(self, sender: bytes, rid: int, error: DeciderError) -> None:
        self._reply(sender, Refused(rid, WireError.of(error)))

    def _reply(self, sender: bytes, outcome: Answered | Refused) -> None:
        self._replies.setdefault(sender, []).append(outcome)

    def _flush(self, sock: zmq.Socket) -> None:
        for sender, outcomes in self._replies.items():
            sock.send_multipart([sender, messages.encode(outcomes)])
        self._replies.clear()
