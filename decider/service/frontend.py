"""What every front end (gRPC, HTTP) does with a request: plan it with the served model's
tokenizer, send its job to that model's engine process, read the typed answer from the
raw results. The model served can change (SIGHUP, a restart after a failure); a request
keeps the one it was planned for, so its answer carries that model's provenance."""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..answers import Decision, Outcome, Usage
from ..calibration import Calibration
from ..chat_template import prompt_format
from ..errors import (
    FieldViolation,
    InvalidRequest,
    ModelNotFound,
    QueueFull,
    Unavailable,
)
from ..plan import Plan, Planner
from ..questions import Limits, Request
from .engine_client import EngineClient
from .messages import ModelFacts

INLINE_TEXT = 2048  # characters planned on the loop: ~0.15 ms with the cached pieces


@dataclass(frozen=True, slots=True)
class ServedModel:
    """One engine process's model, as the front ends use it."""

    facts: ModelFacts
    planner: Planner
    client: EngineClient

    @classmethod
    async def open(cls, facts: ModelFacts, address: str, limits: Limits) -> ServedModel:
        """The model's tokenizer is loaded in a thread (seconds for a large vocabulary;
        llama.cpp lets go of the GIL), so health checks are answered meanwhile."""
        planner = await asyncio.to_thread(_planner, facts, limits)
        return cls(facts, planner, EngineClient(address))


def _planner(facts: ModelFacts, limits: Limits) -> Planner:
    from ..engines.vocab import Vocab  # the model's own tokenizer, loaded vocab-only

    vocab = Vocab(facts.info.model_path, present=True)
    calibration = facts.calibration and Calibration.from_json(facts.calibration)
    info = facts.info  # its chat template too: every front end builds the engine's format
    fmt = prompt_format(facts.prompt_format, info.chat_template, vocab.tokenize)
    return Planner(vocab.tokenize, fmt, info.bos_id, info.n_ctx, limits,
                   add_bos=info.add_bos, calibration=calibration)


class Frontend:
    def __init__(self, max_queue: int, limits: Limits, request_timeout: float,
                 aliases: tuple[str, ...] = ()) -> None:
        self.current: ServedModel | None = None  # None while no engine is ready
        self.max_queue = max_queue
        self.limits = limits
        self.request_timeout = request_timeout  # the deadline of a request without one
        self.aliases = aliases  # more names the served model answers to
        self.accepting = True  # False while draining
        self._held: Counter[str] = Counter()  # places in the queue per TCP connection
        self._planning = ThreadPoolExecutor(min(8, os.cpu_count() or 1), "decider-plan")

    def facts(self) -> ModelFacts | None:
        return self.current.facts if self.current is not None else None

    def ready(self) -> bool:
        """Serving: as gRPC health says SERVING and /readyz 200."""
        return self.accepting and self.current is not None

    def outstanding(self) -> int:
        return self.current.client.outstanding if self.current is not None else 0

    @property
    def share(self) -> int:
        """A quarter of the queue: what one batch, or one caller of a busy queue, may hold."""
        return max(1, self.max_queue // 4)

    def admit_batch(self, n: int, caller: str = "") -> None:
        """A bulk call is admitted whole or refused whole: it may hold at most a quarter
        of the queue, so that one caller never takes every place, and needs room for all
        of its items now (and within its caller's share, `_check_share`)."""
        if n > self.share:
            raise InvalidRequest([FieldViolation(
                "requests", f"{n} items, over the limit of {self.share} a batch (a quarter "
                            f"of the queue of {self.max_queue})")])
        free = self.max_queue - self.outstanding()
        if n > free:
            raise QueueFull(f"the queue has room for {free} requests now, the batch holds "
                            f"{n}", max_queue=self.max_queue)
        self._check_share(caller, n)

    def _check_share(self, caller: str, n: int) -> None:
        """The fair share: while the queue is half full or more, one caller may hold at
        most a quarter of it, so a client flooding the daemon leaves the others room.
        `caller`: a gRPC call's TCP connection, an HTTP request's API key or host; "" for
        unix sockets and in-process callers (the host's own, with no identity to tell
        apart), which are not limited."""
        if not caller or self.outstanding() < self.max_queue // 2:
            return
        if self._held[caller] + n > self.share:
            raise QueueFull(f"the queue is half full or more and this caller (connection "
                            f"or API key) holds {self._held[caller]} of its places: while "
                            f"it is, one caller may hold at most {self.share} (a quarter of "
                            f"the queue of {self.max_queue})", max_queue=self.max_queue,
                            connection_share=self.share)

    async def _plan(self, served: ServedModel, request: Request) -> Plan:
        """A short text is planned here, busy or not: its tokens come mostly from the
        cached pieces, and the thread hop (a future, a wake-up of the loop, the GIL handed
        back and forth) would cost more than the planning. A long one in a thread, where
        llama.cpp's tokenizer lets go of the GIL, so the loop serves others meanwhile."""
        if len(request.text) <= INLINE_TEXT:
            return served.planner.plan(request)
        return await asyncio.get_running_loop().run_in_executor(
            self._planning, served.planner.plan, request)

    async def submit(self, request: Request, deadline: float | None = None,
                     model: str = "", admitted: bool = False, caller: str = "") -> Outcome:
        """The decision for a request; deadline in time.monotonic() seconds (None: the
        server's request_timeout from now); admitted: its place was granted with its
        batch; caller: who sent it, for the fair share. Raises the DeciderError that
        refused it."""
        if deadline is None:
            deadline = time.monotonic() + self.request_timeout
        served = self.current
        if not self.accepting or served is None:
            raise Unavailable("the service is not accepting requests (loading, reloading "
                              "or draining); retry shortly")
        if model and model != served.facts.name and model not in self.aliases:
            raise ModelNotFound(f"model {model!r} is not served here; this daemon serves "
                                f"{served.facts.name!r} (ListModels, GET /v1/models)",
                                model=model)
        plan = await self._plan(served, request)
        if not self.accepting:  # a drain began while it was planned: it waits for no plan
            raise Unavailable("the service is draining; retry shortly")
        if not admitted:
            if served.client.outstanding >= self.max_queue:
                raise QueueFull(f"the queue is full ({self.max_queue} requests waiting)",
                                max_queue=self.max_queue)
            self._check_share(caller, 1)
        self._held[caller] += 1
        try:
            answered = await served.client.score(plan.job, deadline)
        finally:
            self._held[caller] -= 1
            if not self._held[caller]:
                del self._held[caller]
        usage = Usage(plan.prompt_tokens, plan.window_tokens, answered.cached_tokens)
        decision = Decision(plan.read(answered.results), served.facts.name,
                            served.facts.engine, usage)
        return Outcome(decision, answered.queue_ms, answered.compute_ms, served.facts.sha256,
                       served.facts.template_version)


def deadline_after(seconds: float | None) -> float | None:
    return None if seconds is None else time.monotonic() + seconds
