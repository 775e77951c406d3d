"""What the HTTP front end needs from the daemon: the seam it is built against.

A backend submits decider requests (the scheduler's `submit`: an Outcome, or a
DeciderError for a refusal), says whether it is ready (as gRPC health says SERVING), and
describes the model it serves. `LocalBackend` is that over an in-process Decider and its
own Scheduler (tests, benchmarks).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..api import Decider
from ..catalog import file_sha256
from ..prompts import TEMPLATE_VERSION
from ..questions import Limits, Request
from ..scheduler import Outcome, Scheduler


@dataclass(frozen=True, slots=True)
class ServedModel:
    name: str
    description: str
    release_date: str  # YYYY-MM-DD
    engine: str
    n_ctx: int
    sha256: str
    template_version: str
    limits: Limits

    @classmethod
    def of(cls, decider: Decider, sha256: str) -> ServedModel:
        """The facts of a loaded Decider; its file's date stands for the release date."""
        info = decider.engine.info
        mtime = Path(info.model_path).stat().st_mtime
        day = datetime.datetime.fromtimestamp(mtime, datetime.UTC).date().isoformat()
        return cls(decider.entry.name, decider.entry.description, day, decider.engine.name,
                   info.n_ctx, sha256, TEMPLATE_VERSION, decider.limits)


class Backend(Protocol):
    def served(self) -> ServedModel | None: ...  # None while no model is loaded

    def ready(self) -> bool: ...  # True only while gRPC health says SERVING

    async def submit(self, request: Request, deadline: float | None) -> Outcome: ...


class LocalBackend:
    """An in-process Decider behind a Scheduler of its own, started in the running loop."""

    def __init__(self, decider: Decider, **scheduler_options) -> None:
        self.scheduler = Scheduler(decider.decide_many, **scheduler_options)
        self._served = ServedModel.of(decider, file_sha256(Path(decider.engine.info.model_path)))

    def start(self) -> None:
        self.scheduler.start()

    def served(self) -> ServedModel:
        return self._served

    def ready(self) -> bool:
        return self.scheduler.accepting

    async def submit(self, request: Request, deadline: float | None) -> Outcome:
        return await self.scheduler.submit(request, deadline)

    async def close(self) -> None:
        await self.scheduler.drain()
        await self.scheduler.close()
