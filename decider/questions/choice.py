"""choice: exactly one of the labels; the probabilities over the labels sum to 1.

The labels are listed in the prompt in a canonical order (by name), so an answer never
depends on the order they were given in."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from ..errors import FieldViolation, Path
from ..prompts import BranchPlan, PromptFormat, canonical, listing
from .base import (
    Answer,
    Label,
    Limits,
    Question,
    Scored,
    check_options,
    labels_from_json,
    labels_from_proto,
    labels_to_json,
    one_of,
    question_type,
)
from .confidence import peak


@dataclass(frozen=True, slots=True)
class ChoiceAnswer(Answer):
    question: str
    label: str  # the most probable label
    confidence: float  # confidence.peak: 0 for uniform probabilities, 1 for a certain one
    probabilities: dict[str, float]  # every label, in the order given; they sum to 1
    label_mass: float
    type = "choice"

    def verdict(self) -> str:
        dist = ", ".join(f"{k} {v:.3f}" for k, v in self.probabilities.items())
        return f"{self.label}  ({dist}; label mass {self.label_mass:.2f})"

    def proto_fields(self) -> dict:
        return {"label": self.label, "confidence": self.confidence,
                "probabilities": [{"label": k, "p": p} for k, p in self.probabilities.items()]}

    @classmethod
    def from_proto(cls, question: str, label_mass: float, m) -> ChoiceAnswer:
        return cls(question, m.label, m.confidence, {p.label: p.p for p in m.probabilities},
                   label_mass)


@question_type
@dataclass(frozen=True, slots=True)
class Choice(Question):
    question: str
    labels: tuple[Label, ...]
    type = "choice"
    answer_type = ChoiceAnswer

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", tuple(Label.of(v) for v in self.labels))

    def violations(self, at: Path, limits: Limits) -> Iterator[FieldViolation]:
        yield from Question.violations(self, at, limits)
        yield from check_options(at + ("labels",), self.labels, 2, limits)

    def options(self) -> tuple[str, tuple[Label, ...]]:
        return "labels", self.labels

    def branches(self, fmt: PromptFormat) -> list[BranchPlan]:
        labels = canonical(self.labels)
        body = f"Question: {self.question.strip()}\nOptions:{listing(labels)}"
        return [BranchPlan(fmt.render_suffix(body), tuple(lb.name for lb in labels))]

    def answer(self, scored: Sequence[Scored]) -> ChoiceAnswer:
        [branch] = scored
        ordered = {lb.name: branch.probabilities[lb.name] for lb in self.labels}
        best = max(ordered, key=ordered.get)
        return ChoiceAnswer(self.question, best, peak(list(ordered.values())), ordered,
                            branch.label_mass)

    def expected(self, gold: object) -> tuple[str, ...]:
        return (one_of(gold, self.labels),)

    def fields(self) -> dict:
        return {"labels": labels_to_json(self.labels)}

    @classmethod
    def from_fields(cls, question: str, fields: Mapping, at: Path,
                    bad: list[FieldViolation]) -> Choice | None:
        labels = labels_from_json(at + ("labels",), fields.get("labels", []), bad)
        return None if labels is None else cls(question, labels)

    @classmethod
    def from_proto(cls, question: str, m) -> Choice:
        return cls(question, labels_from_proto(m.labels))
