"""System One requests to decider's, and decider's answers back (docs/systemone.md).

Each System One question becomes one decider question, asked about the rendered state:
  noul                  yes_no; with criteria, a choice between "yes" and "no" described
  choice, 2+ options    choice over the option names, described by their criteria
  score                 scale over the levels "0", "1", ... described by their criteria
  choice or score of 1  one multi_label branch (the window is checked, the answer is sure)
  decider.multi_label   multi_label, with per-option thresholds applied to each p
Every field decider refuses is reported at its System One place, FastAPI style.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pydantic import ValidationError

from .. import __version__
from ..answers import Answer, Outcome
from ..errors import FieldViolation, InvalidRequest, ModelNotFound
from ..questions import (
    Choice,
    Label,
    Limits,
    MultiLabel,
    Question,
    Request,
    Scale,
    YesNo,
)
from .render import JSON_ERROR, content_line, content_text, is_empty, non_finite
from .schema import (
    ChoiceAnswer,
    ChoiceQuestion,
    LabelVerdict,
    MultiLabelAnswer,
    NoulAnswer,
    NoulCriteria,
    NoulQuestion,
    Provenance,
    ScoreAnswer,
    ScoreQuestion,
    SystemOneRequest,
    SystemOneResponse,
    Usage,
)

ASK_BY_DEFAULT = {"noul": "Which answer fits the text?", "choice": "Which option fits the "
                  "text best?", "score": "Which level fits the text?",
                  "decider.multi_label": "Which options apply to the text?"}


class BadBody(InvalidRequest):
    """The body is not a valid System One request; `errors` are FastAPI-style field errors
    (the violations name the same fields, dotted, for the CLI and the Python API)."""

    def __init__(self, errors: list[dict]) -> None:
        self.errors = errors
        super().__init__([FieldViolation(".".join(map(str, e["loc"])), e["msg"]) for e in errors])


def field_error(loc: tuple, msg: str, kind: str = "value_error", **ctx) -> dict:
    return {"loc": ["body", *loc], "msg": msg, "type": kind, **({"ctx": ctx} if ctx else {})}


def parse_body(raw: bytes | str | Mapping) -> SystemOneRequest:
    """Validate a request body (JSON text, or data already parsed) against the schema."""
    try:
        if isinstance(raw, Mapping):
            return SystemOneRequest.model_validate(raw)
        return SystemOneRequest.model_validate_json(raw)
    except ValidationError as e:
        raise BadBody([field_error(tuple(x["loc"]), x["msg"], x["type"], **_plain(x.get("ctx")))
                       for x in e.errors(include_url=False, include_input=False)]) from None


def _plain(ctx: dict | None) -> dict:
    ok = (str, int, float, bool, type(None))
    return {k: v if isinstance(v, ok) else str(v) for k, v in (ctx or {}).items()}


def certainty(ps: list[float]) -> float:
    """What System One answers as `confidence`: 0 for a uniform distribution, 1 for a
    certain one, 1 - H(p) / ln(n). (decider's own confidence, ChoiceAnswer.confidence, is
    the chosen label's probability.)"""
    if len(ps) < 2:
        return 1.0
    entropy = -sum(p * math.log(p) for p in ps if p > 0)
    return min(1.0, max(0.0, 1.0 - entropy / math.log(len(ps))))


@dataclass(frozen=True, slots=True)
class _Slot:
    key: str  # the name the answer goes under
    loc: tuple  # the question's place: ("questions", key, type)
    option_locs: tuple  # the criteria place of each of decider's labels, in order
    read: Callable[[Answer], object]  # decider's answer -> the System One answer


def _sure(ask: str, name: str, description, at: tuple, locs: tuple, read):
    """A one-option choice or one-level score: one branch (the state meets the same window
    check), its answer certain."""
    return MultiLabel(ask, [Label(name, content_line(description))]), _Slot(at[1], at, locs, read)


def _ask(key: str, q) -> tuple[Question, _Slot]:
    ask = content_text(q.instructions) if q.instructions is not None else ASK_BY_DEFAULT[q.type]
    at = ("questions", key, q.type)
    if isinstance(q, NoulQuestion):
        c = q.criteria
        if c is None or (c.true is None and c.false is None):
            return YesNo(ask), _Slot(key, at, (), lambda a: NoulAnswer(
                noul=a.p_yes, label_mass=a.label_mass))
        labels = [Label("yes", content_line(c.true)), Label("no", content_line(c.false))]
        return Choice(ask, labels), _Slot(key, at, ("true", "false"), lambda a: NoulAnswer(
            noul=a.probabilities["yes"], label_mass=a.label_mass))
    if isinstance(q, ChoiceQuestion):
        names = tuple(q.criteria)
        if len(names) == 1:
            return _sure(ask, names[0], q.criteria[names[0]], at, names, lambda a: ChoiceAnswer(
                choice=names[0], confidence=1.0, probabilities={names[0]: 1.0},
                label_mass=a.label_mass))
        labels = [Label(n, content_line(d)) for n, d in q.criteria.items()]
        return Choice(ask, labels), _Slot(key, at, names, lambda a: ChoiceAnswer(
            choice=a.label, confidence=certainty(list(a.probabilities.values())),
            probabilities=a.probabilities, label_mass=a.label_mass))
    if isinstance(q, ScoreQuestion):
        legend = {str(i): level for i, level in enumerate(q.criteria)}
        indices = tuple(range(len(q.criteria)))
        if len(indices) == 1:
            return _sure(ask, "0", q.criteria[0], at, indices, lambda a: ScoreAnswer(
                score=0.0, confidence=1.0, legend=legend, probabilities={"0": 1.0},
                label_mass=a.label_mass))
        levels = [Label(str(i), content_line(level)) for i, level in enumerate(q.criteria)]
        return Scale(ask, levels), _Slot(key, at, indices, lambda a: ScoreAnswer(
            score=a.expected_index, confidence=certainty(list(a.probabilities.values())),
            legend=legend, probabilities=a.probabilities, label_mass=a.label_mass))
    limit = {n: q.thresholds.get(n, q.threshold) for n in q.criteria}
    labels = [Label(n, content_line(d)) for n, d in q.criteria.items()]

    def read_multi(a) -> MultiLabelAnswer:
        verdicts = {d.label: LabelVerdict(p=d.p, threshold=limit[d.label],
                                          chosen=d.p >= limit[d.label]) for d in a.labels}
        return MultiLabelAnswer(labels=verdicts, label_mass=a.label_mass,
                                chosen=[n for n, v in verdicts.items() if v.chosen])

    return MultiLabel(ask, labels, q.threshold), _Slot(key, at, tuple(q.criteria), read_multi)


_FIELD = re.compile(r"questions\[(\d+)\](?:\.(question|threshold|labels|levels)"
                    r"(?:\[(\d+)\](\.description)?)?)?")
_LABEL_REF = re.compile(r"\b(?:labels|levels)\[(\d+)\]")


@dataclass(frozen=True, slots=True)
class Asked:
    """A System One request as decider's Request, and how to read its answers back."""

    request: Request
    slots: tuple[_Slot, ...]

    def response(self, outcome: Outcome, template_version: str) -> SystemOneResponse:
        d = outcome.decision
        return SystemOneResponse(
            model=d.model,
            answers={s.key: s.read(a) for s, a in zip(self.slots, d.answers, strict=True)},
            usage=Usage(input_tokens=d.usage.prompt_tokens, output_tokens=0),
            decider=Provenance(version=__version__, engine=d.engine,
                               model_sha256=outcome.model_sha256,
                               template_version=template_version,
                               window_tokens=d.usage.window_tokens,
                               queue_ms=outcome.queue_ms, compute_ms=outcome.compute_ms))

    def bad_body(self, error: InvalidRequest) -> BadBody:
        return BadBody([self._locate(v) for v in error.violations])

    def _locate(self, v: FieldViolation) -> dict:
        if v.field == "text":
            return field_error(("state",), v.description)
        m = _FIELD.fullmatch(v.field)
        if not m:
            return field_error(("questions",), v.description)
        slot = self.slots[int(m[1])]
        part, j, of_description = m[2], m[3], m[4]
        msg = _LABEL_REF.sub(lambda r: f"option {slot.option_locs[int(r[1])]!r}", v.description)
        if part in ("question", "threshold"):
            return field_error((*slot.loc, "instructions" if part == "question" else part), msg)
        if j is None:
            return field_error((*slot.loc, "criteria") if part else slot.loc, msg)
        what = "the description " if of_description else "the name "
        return field_error((*slot.loc, "criteria", slot.option_locs[int(j)]), what + msg)


def to_decider(body: SystemOneRequest, limits: Limits) -> Asked:
    """Map and validate a request: BadBody names every field decider would refuse."""
    bad = []
    if is_empty(body.state) or non_finite(body.state):
        bad.append(field_error(("state",), JSON_ERROR if non_finite(body.state)
                               else "must not be empty"))
    state_refused = bool(bad)  # then decider's own word on the text adds nothing
    questions, slots = [], []
    for key, q in body.questions.items():
        c = q.criteria
        if non_finite((q.instructions, (c.true, c.false) if isinstance(c, NoulCriteria) else c)):
            bad.append(field_error(("questions", key, q.type), JSON_ERROR))
        question, slot = _ask(key, q)
        questions.append(question)
        slots.append(slot)
    asked = Asked(Request(content_text(body.state), tuple(questions)), tuple(slots))
    try:
        asked.request.validate(limits)
    except InvalidRequest as e:
        bad += [x for x in asked.bad_body(e).errors
                if not (state_refused and x["loc"] == ["body", "state"])]
    if bad:
        raise BadBody(bad)
    return asked


def answer_here(decider, raw: bytes | str | Mapping) -> SystemOneResponse:
    """A System One request answered by an in-process Decider (the Python API and the CLI):
    the same validation, prompts and answers as over HTTP, with no queue."""
    from ..prompts import TEMPLATE_VERSION

    body = parse_body(raw)
    if body.model != decider.entry.name:
        raise ModelNotFound(f"model {body.model!r} is not loaded here; this is "
                            f"{decider.entry.name!r}", model=body.model)
    asked = to_decider(body, decider.limits)
    t0 = time.perf_counter()
    try:
        decision = decider.decide_request(asked.request)
    except InvalidRequest as e:
        raise asked.bad_body(e) from None
    outcome = Outcome(decision, 0.0, 1000 * (time.perf_counter() - t0), decider.model_sha256)
    return asked.response(outcome, TEMPLATE_VERSION)
