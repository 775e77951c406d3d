"""The in-process API: load a model once, then answer typed questions about texts.

    from decider import Decider, YesNo
    with Decider("gemma-3-270m") as d:
        print(d.decide("I was charged twice", [YesNo("Is this about billing?")]))

The CLI and the gRPC service run this same flow.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import structlog

from decider.engines import Engine, engine_class, engine_options, load_engine

from .answers import Decision, Usage
from .calibration import Calibration
from .catalog import Catalog, ModelEntry
from .chat_template import prompt_format
from .engine_choice import choose_engine
from .errors import DeciderError
from .guard import LogitsGuard
from .logs import default_to_stderr
from .plan import Plan, Planner, check_work
from .prefix_groups import group_by_prefix, score_groups
from .questions import Limits, Question, Request, Scored

log = structlog.get_logger("decider")


class Decider:
    def __init__(
        self,
        model: str | ModelEntry | None = None,
        *,
        engine: str | None = None,
        n_ctx: int | None = None,
        limits: Limits = Limits(),
        catalog: Catalog | None = None,
        calibration: str | Path | Calibration | None = None,
        prefix_cache_bytes: int | None = None,
        **options,
    ) -> None:
        """prefix_cache_bytes: the budget of the engine's prefix cache (docs/design.md, "The
        prefix cache"); None: the engine's default (a share of the memory it keeps them in);
        0: none. options: the engine's own (n_threads, dtype, ...)."""
        default_to_stderr()
        if calibration is not None and not isinstance(calibration, Calibration):
            calibration = Calibration.load(calibration)  # a bad file fails before the load
        catalog = catalog or Catalog()
        self.entry = model if isinstance(model, ModelEntry) else catalog.get(
            model or catalog.default)
        path = catalog.locate(self.entry)
        self.catalog = catalog
        self.limits = limits
        engine = choose_engine(self.entry, path, engine)
        if prefix_cache_bytes != 0 and "prefix_cache_bytes" in engine_options(
                engine_class(engine)):
            options["prefix_cache_bytes"] = prefix_cache_bytes  # None: the engine's default
        self.engine: Engine = load_engine(engine, path, n_ctx or self.entry.n_ctx or None,
                                          model_name=self.entry.name, **options)
        info = self.engine.info
        fmt = prompt_format(self.entry.prompt_format, info.chat_template, self.engine.tokenize)
        self.planner = Planner(self.engine.tokenize, fmt, info.bos_id, info.n_ctx, limits,
                               add_bos=info.add_bos)
        if calibration is not None:
            self.use_calibration(calibration)
        self.guard = LogitsGuard(info.sentinel)
        self._call_lock = threading.Lock()  # one guarded call at a time: the guard's order
        log.info("model loaded", model=info.model_name, engine=self.engine.name,
                 n_ctx=info.n_ctx, weights=info.weights, memory=info.memory)

    @functools.cached_property
    def model_sha256(self) -> str:
        """What answers carry as the model's provenance (hashed once per file)."""
        return self.catalog.digest(self.entry)

    @property
    def template_version(self) -> str:
        """What answers carry as the prompt template's version (with a model's own chat
        template, its sha256)."""
        return self.planner.format.version

    def use_calibration(self, calibration: str | Path | Calibration | None) -> None:
        """Apply a calibration (a file or one in hand) to every later answer; None: none.
        One made for another model file or prompt template is refused."""
        if calibration is not None and not isinstance(calibration, Calibration):
            calibration = Calibration.load(calibration)
        if calibration is not None:
            calibration.check(self.model_sha256, self.template_version)
        self.planner = replace(self.planner, calibration=calibration)

    @property
    def calibration(self) -> Calibration | None:
        return self.planner.calibration

    @property
    def n_ctx(self) -> int:
        return self.engine.info.n_ctx

    def decide(self, text: str, questions: Sequence[Question], instructions: str = "") -> Decision:
        return self.decide_request(Request(text, tuple(questions), instructions))

    def decide_request(self, request: Request) -> Decision:
        result = self.decide_many([request])[0]
        if isinstance(result, DeciderError):
            raise result
        return result

    def decide_systemone(self, body: bytes | str | dict) -> dict:
        """Answer a System One request (docs/systemone.md): the JSON of POST /v1/systemone,
        as bytes, text or parsed; returns the response's JSON shape. A bad field raises
        InvalidRequest naming it (System One's place for it: body.questions.tone.criteria)."""
        from .systemone.mapping import answer_here

        return answer_here(self, body).model_dump(mode="json")

    def decide_many(self, requests: Sequence[Request]) -> list[Decision | DeciderError]:
        """Answer several requests in one engine call, those that share a prefix (a text
        asked about again) read as one job. A request that is invalid or over the window
        gets its own error, as does one whose activations overflow (the others are then
        answered again, each alone); an engine failure raises for all of them."""
        return [self.read(plan, results) for plan, results in self._score(requests)]

    def branch_scores(self, requests: Sequence[Request]
                      ) -> list[list[list[Scored]] | DeciderError]:
        """The model's own probabilities for each request, per question, per branch: what
        `decider calibrate` fits on (no calibration, no abstention)."""
        return [results if isinstance(results, DeciderError) else plan.scored(results)
                for plan, results in self._score(requests)]

    def _score(self, requests: Sequence[Request]) -> list[tuple[Plan | None, object]]:
        plans: list[Plan | DeciderError] = []
        for request in requests:
            try:
                plans.append(self.plan(request))
            except DeciderError as e:
                plans.append(e)
        jobs = [p.job for p in plans if isinstance(p, Plan)]
        if jobs:
            with self._call_lock:
                scored = iter(score_groups(self.engine, self.guard, jobs, group_by_prefix(jobs)))
        return [(None, p) if isinstance(p, DeciderError) else (p, next(scored)) for p in plans]

    def plan(self, request: Request) -> Plan:
        """Validate, tokenize, window-check and cost one request (no engine pass)."""
        plan = self.planner.plan(request)
        check_work(self.engine, plan.job, self.limits)
        return plan

    def read(self, plan: Plan | None, results) -> Decision | DeciderError:
        """The decision from a plan's guarded results (or the error they are)."""
        if isinstance(results, DeciderError):
            return results
        usage = Usage(plan.prompt_tokens, plan.window_tokens, results.cached_tokens)
        return Decision(plan.read(results), self.entry.name, self.engine.name, usage)

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> Decider:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
