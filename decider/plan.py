"""A request as engine work: one ScoreJob (shared prefix + branches), and the way back
from the branches' raw logits to typed answers. The one place a request is validated
and checked against the loaded window (the engine checks its window again)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from decider.engines.base import Branch, BranchResult, Engine, ScoreJob

from .calibration import Calibration
from .errors import FieldViolation, InvalidRequest, PromptTooLong, WorkTooLarge
from .prompts import Piece, PromptFormat
from .questions import Answer, Limits, Question, Request, Scored
from .scoring import Candidates, answer_log_probs, build_candidates, label_mass, logsumexp
from .trust import judged_answer

Tokenize = Callable[..., list[int]]  # (text, special=False): the engine's tokenize


@dataclass(frozen=True, slots=True)
class _BranchKey:
    candidates: Candidates
    answers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    job: ScoreJob
    questions: tuple[Question, ...]
    keys: tuple[tuple[_BranchKey, ...], ...]  # per question, per branch (job order)
    calibration: Calibration | None = None

    @property
    def window_tokens(self) -> int:
        return self.job.window_tokens()

    @property
    def prompt_tokens(self) -> int:
        return len(self.job.prefix) + sum(b.positions() + 1 for b in self.job.branches)

    def read(self, results: Sequence[BranchResult]) -> tuple[Answer, ...]:
        """Typed answers from the engine's (already guarded) results for this job."""
        return tuple(judged_answer(q, scored, self.calibration)
                     for q, scored in zip(self.questions, self.scored(results)))

    def scored(self, results: Sequence[BranchResult]) -> list[list[Scored]]:
        """Each question's branches read: the model's own probabilities, uncalibrated."""
        it = iter(results)
        return [[_scored(k, r) for k, r in zip(keys, it)] for keys in self.keys]


@dataclass(frozen=True, slots=True)
class Planner:
    """Requests into engine work for one loaded model: validated, tokenized by the model's
    tokenizer, checked against its window. Every front end plans with one."""

    tokenize: Tokenize
    format: PromptFormat
    bos_id: int
    n_ctx: int
    limits: Limits = Limits()
    add_bos: bool = True  # the model's tokenizer puts bos_id first (EngineInfo.add_bos)
    calibration: Calibration | None = None  # checked against the model by whoever loads it
    short: Tokenize = field(init=False, repr=False, compare=False)
    work: Callable[[tuple[Question, ...]], QuestionWork] = field(init=False, repr=False,
                                                                 compare=False)

    def __post_init__(self) -> None:
        # the template's pieces, the questions and the labels recur from request to request
        def tokens(text: str, special: bool = False) -> tuple[int, ...]:
            return tuple(self.tokenize(text, special=special))
        object.__setattr__(self, "short", functools.lru_cache(maxsize=4096)(tokens))

        def work(questions: tuple[Question, ...]) -> QuestionWork:
            return question_work(questions, self.format, self.short)
        object.__setattr__(self, "work", functools.lru_cache(maxsize=1024)(work))

    def plan(self, request: Request) -> Plan:
        request.validate(self.limits)  # so its questions are Questions, hashable
        plan = build_plan(request, self.format, self.tokenize,
                          self.bos_id if self.add_bos else None, self.short,
                          self.work(request.questions), self.calibration)
        if plan.window_tokens > self.n_ctx:
            raise PromptTooLong(plan.window_tokens, self.n_ctx)
        return plan


def check_work(engine: Engine, job: ScoreJob, limits: Limits) -> None:
    """The work bound, before any compute: the job's cost in the engine's work measure
    (it plans a loaded model's layout; the window check above does not need one).
    A job whose work ceiling is within the bound needs no layout: most jobs, and the
    layout costs the engine thread more than the ceiling's sum."""
    if job.work_ceiling() <= limits.max_work_tokens:
        return
    work = engine.work_tokens(job)
    if work > limits.max_work_tokens:
        raise WorkTooLarge(work, limits.max_work_tokens)


@dataclass(frozen=True, slots=True)
class QuestionWork:
    """What a request's questions add to its job, whatever its text: their branches and
    the keys that read them back. The same questions asked again (most requests) reuse
    it: a Planner keeps the recent ones."""

    branches: tuple[Branch, ...]
    keys: tuple[tuple[_BranchKey, ...], ...]  # per question, per branch (job order)


def question_work(questions: tuple[Question, ...], fmt: PromptFormat,
                  short: Tokenize) -> QuestionWork:
    _refuse_control_labels(questions, short)
    end = _tokens(fmt.render_end(), short)
    branches, keys = [], []
    for q in questions:
        q_keys = []
        for bp in q.branches(fmt):
            cands = build_candidates([fmt.surface_forms(a) for a in bp.answers], short, end)
            branches.append(Branch(_tokens(bp.suffix, short), cands.sequences))
            q_keys.append(_BranchKey(cands, bp.answers))
        keys.append(tuple(q_keys))
    return QuestionWork(tuple(branches), tuple(keys))


def build_plan(request: Request, fmt: PromptFormat, tokenize: Tokenize, bos: int | None,
               short: Tokenize | None = None, work: QuestionWork | None = None,
               calibration: Calibration | None = None) -> Plan:
    """bos: the token the model's prompts begin with (None: its tokenizer adds none), placed
    unless the template's own head already begins with it. short: the tokenizer for
    everything but the prefix's text and instructions, where a cached one saves the
    recurring pieces' tokenization (the template's markers too). work: the questions'
    part, where the caller has it already. calibration: the one its answers are read
    with."""
    short = short or tokenize
    work = work or question_work(request.questions, fmt, short)
    prefix = _tokens(fmt.render_prefix(request.text, request.instructions), tokenize, short)
    if bos is not None and prefix[:1] != (bos,):
        prefix = (bos, *prefix)
    return Plan(ScoreJob(prefix, work.branches, tuple(map(len, work.keys))),
                request.questions, work.keys, calibration)


def _tokens(pieces: tuple[Piece, ...], tokenize: Tokenize,
            markers: Tokenize | None = None) -> tuple[int, ...]:
    """Template markers with special tokens parsed (by `markers` where given); everything
    else as plain text."""
    markers = markers or tokenize
    out: list[int] = []
    for text, marker in pieces:
        out += (markers if marker else tokenize)(text, special=marker)
    return tuple(out)


def _refuse_control_labels(questions: tuple[Question, ...], tokenize: Tokenize) -> None:
    """A label is answer text: one that spells a control token of the model (`<eos>`)
    would be scored as text the model never writes, so it is refused."""
    bad = []
    for i, q in enumerate(questions):
        name, labels = q.options()
        bad += [FieldViolation(("questions", i, name, j), f"{label.name!r} spells a control "
                               "token of the model, not answer text")
                for j, label in enumerate(labels)
                if tokenize(label.name, special=True) != tokenize(label.name)]
    if bad:
        raise InvalidRequest(bad)


def _scored(key: _BranchKey, result: BranchResult) -> Scored:
    lp = answer_log_probs(key.candidates, result, len(key.answers))
    total = logsumexp(lp)
    return Scored({name: math.exp(v - total) for name, v in zip(key.answers, lp)},
                  label_mass(result))
