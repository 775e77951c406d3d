"""Each System One question type as one of decider's, and decider's answer back
(docs/systemone.md):

  noul                  yes_no; with criteria, a choice between "yes" and "no" described
  choice, 2+ options    choice over the option names, described by their criteria
  score                 scale over the levels "0", "1", ... described by their criteria
  choice or score of 1  one multi_label branch (the window is checked, the answer is sure)
  x_multi_label         multi_label, with per-option thresholds applied to each p
                        (decider.multi_label: its deprecated name, still read)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ..questions import Answer, Choice, Label, MultiLabel, Question, Scale, YesNo
from .render import content_line, content_text
from .schema import (
    LEGACY_MULTI_LABEL,
    MULTI_LABEL,
    ChoiceAnswer,
    ChoiceQuestion,
    LabelVerdict,
    MultiLabelAnswer,
    MultiLabelQuestion,
    NoulAnswer,
    NoulQuestion,
    ScoreAnswer,
    ScoreQuestion,
)

ASK_BY_DEFAULT = {"noul": "Which answer fits the text?", "choice": "Which option fits the "
                  "text best?", "score": "Which level fits the text?",
                  MULTI_LABEL: "Which options apply to the text?",
                  LEGACY_MULTI_LABEL: "Which options apply to the text?"}


@dataclass(frozen=True, slots=True)
class Slot:
    """Where a System One question's answer goes, and how decider's is read into it."""

    key: str  # the name the answer goes under
    loc: tuple  # the question's place: ("questions", key, type)
    option_locs: tuple  # the criteria place of each of decider's labels, in order
    read: Callable[[Answer], object]  # decider's answer -> the System One answer


def ask(key: str, q) -> tuple[Question, Slot]:
    """The decider question for System One question `q` (asked under `key`)."""
    text = content_text(q.instructions) if q.instructions is not None else \
        ASK_BY_DEFAULT[q.type]
    question, slot = _ASK[q.type](text, q, ("questions", key, q.type))
    question = replace(question, abstain_below=q.x_abstain_below,
                       min_label_mass=q.x_min_label_mass)
    return question, replace(slot, read=_with_trust(slot.read))


def _with_trust(read: Callable[[Answer], object]) -> Callable[[Answer], object]:
    """A slot's reading, with every answer's calibration and abstention beside it."""
    return lambda a: read(a).model_copy(update={
        "x_calibrated": a.calibrated, "x_abstained": a.abstained,
        "x_abstain_reason": a.abstain_reason})


def _sure(text: str, name: str, description, at: tuple, locs: tuple, read):
    """A one-option choice or one-level score: one branch (the state meets the same window
    check), its answer certain."""
    return MultiLabel(text, [Label(name, content_line(description))]), Slot(at[1], at, locs,
                                                                            read)


def _noul(text: str, q: NoulQuestion, at: tuple) -> tuple[Question, Slot]:
    c = q.criteria
    if c is None or (c.true is None and c.false is None):
        return YesNo(text), Slot(at[1], at, (), lambda a: NoulAnswer(
            type="noul", noul=a.p_yes, x_label_mass=a.label_mass))
    labels = [Label("yes", content_line(c.true)), Label("no", content_line(c.false))]
    return Choice(text, labels), Slot(at[1], at, ("true", "false"), lambda a: NoulAnswer(
        type="noul", noul=a.probabilities["yes"], x_label_mass=a.label_mass))


def _choice(text: str, q: ChoiceQuestion, at: tuple) -> tuple[Question, Slot]:
    names = tuple(q.criteria)
    if len(names) == 1:
        return _sure(text, names[0], q.criteria[names[0]], at, names, lambda a: ChoiceAnswer(
            type="choice", choice=names[0], confidence=1.0, probabilities={names[0]: 1.0},
            x_label_mass=a.label_mass))
    labels = [Label(n, content_line(d)) for n, d in q.criteria.items()]
    return Choice(text, labels), Slot(at[1], at, names, lambda a: ChoiceAnswer(
        type="choice", choice=a.label, confidence=a.confidence,
        probabilities=a.probabilities, x_label_mass=a.label_mass))


def _score(text: str, q: ScoreQuestion, at: tuple) -> tuple[Question, Slot]:
    legend = {str(i): level for i, level in enumerate(q.criteria)}
    indices = tuple(range(len(q.criteria)))
    if len(indices) == 1:
        return _sure(text, "0", q.criteria[0], at, indices, lambda a: ScoreAnswer(
            type="score", score=0.0, confidence=1.0, legend=legend, probabilities={"0": 1.0},
            x_label_mass=a.label_mass))
    levels = [Label(str(i), content_line(level)) for i, level in enumerate(q.criteria)]
    return Scale(text, levels), Slot(at[1], at, indices, lambda a: ScoreAnswer(
        type="score", score=a.expected_index, confidence=a.confidence,
        legend=legend, probabilities=a.probabilities, x_label_mass=a.label_mass))


def _multi_label(text: str, q: MultiLabelQuestion, at: tuple) -> tuple[Question, Slot]:
    limit = {n: q.thresholds.get(n, q.threshold) for n in q.criteria}
    labels = [Label(n, content_line(d)) for n, d in q.criteria.items()]

    def read(a) -> MultiLabelAnswer:
        verdicts = {d.label: LabelVerdict(p=d.p, threshold=limit[d.label],
                                          chosen=d.p >= limit[d.label]) for d in a.labels}
        return MultiLabelAnswer(type=q.type, labels=verdicts, x_label_mass=a.label_mass,
                                chosen=[n for n, v in verdicts.items() if v.chosen])

    return MultiLabel(text, labels, q.threshold), Slot(at[1], at, tuple(q.criteria), read)


_ASK = {"noul": _noul, "choice": _choice, "score": _score, MULTI_LABEL: _multi_label,
        LEGACY_MULTI_LABEL: _multi_label}
