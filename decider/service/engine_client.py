"""A front end's side of the engine process: jobs out, guarded raw results back, over one
ZeroMQ DEALER socket. The requests submitted in one turn of the event loop travel as one
message. Every pending request is resolved: by its result, by its cancellation (the
engine is told, so a request no one waits for never reaches the model), or by the error
that took the engine down.

The socket is a plain one read from the event loop's own reader on its FD (the pattern
libzmq documents for event loops): zmq.asyncio's futures and flag objects cost more than
the rest of the hop on the front end's side."""

from __future__ import annotations

import asyncio
import itertools
import time

import zmq

from ..engines import ScoreJob
from ..errors import DeadlineExceeded, DeciderError
from . import messages
from .engine_loop import POLLIN
from .messages import Answered, Cancel, Refused, Score


class EngineClient:
    def __init__(self, address: str) -> None:
        self.address = address
        self._sock = zmq.Context.instance().socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, 0)  # the engine bounds the queue, not the socket
        self._sock.connect(address)  # its pipe exists from here: a send never waits
        self._pending: dict[int, asyncio.Future] = {}
        self._outbox: list[Score | Cancel] = []
        self._ids = itertools.count()
        self.down: DeciderError | None = None  # set once the engine is gone
        self.answered = 0  # outcomes received: the engine has served
        self.idle = asyncio.Event()  # set while nothing is pending
        self.idle.set()
        self._fd = self._sock.FD
        asyncio.get_running_loop().add_reader(self._fd, self._receive)

    @property
    def outstanding(self) -> int:
        return len(self._pending)

    async def score(self, job: ScoreJob, deadline: float) -> Answered:
        """The engine's answer to one job; raises the engine's error for it, or
        DeadlineExceeded at the deadline (time.monotonic()) whatever the engine does."""
        if self.down is not None:
            raise self.down
        rid = next(self._ids)
        loop = asyncio.get_running_loop()
        future = self._pending[rid] = loop.create_future()
        timer = loop.call_later(deadline - time.monotonic(), self._expire, rid)
        self.idle.clear()
        self._send(Score(rid, deadline, time.monotonic(), job))
        try:
            return await future
        except asyncio.CancelledError:  # the caller went away: free its place
            self._forget(rid)
            raise
        finally:
            timer.cancel()
            if not self._pending:
                self.idle.set()

    def _expire(self, rid: int) -> None:
        """The deadline passed with no outcome from the engine (it may be hung): the
        request is refused here and dropped there."""
        future = self._pending.get(rid)
        if future is not None and not future.done():
            future.set_exception(DeadlineExceeded(
                "the deadline passed before the engine answered"))
            self._forget(rid)

    def _forget(self, rid: int) -> None:
        if self._pending.pop(rid, None) is not None:
            self._send(Cancel(rid))

    def fail_all(self, error: DeciderError) -> None:
        """The engine is gone: every pending request, and every later one, gets `error`."""
        self.down = error
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)
        self.idle.set()

    async def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self._fd)
        self._sock.close(linger=0)

    def _send(self, op: Score | Cancel) -> None:
        self._outbox.append(op)
        if len(self._outbox) == 1:
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        ops, self._outbox = self._outbox, []
        self._sock.send(messages.encode(ops), zmq.NOBLOCK)
        self._receive()  # the send may have taken in a reply without the FD telling

    def _receive(self) -> None:
        """Everything the socket holds: its FD says only that there may be some."""
        while self._sock.get(zmq.EVENTS) & POLLIN:
            message = self._sock.recv(zmq.NOBLOCK)
            for outcome in messages.from_engine(message):
                self.answered += 1
                future = self._pending.pop(outcome.rid, None)
                if future is None or future.done():
                    continue
                if isinstance(outcome, Refused):
                    future.set_exception(outcome.error.error())
                else:
                    future.set_result(outcome)
