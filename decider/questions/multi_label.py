"""multi_label: any of the labels. Each label is an independent yes/no branch of its own,
chosen at p >= threshold; the branches go in canonical order (by name), since the batch a
branch lands in can move its logits."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from ..errors import FieldViolation, Path
from ..prompts import NO, YES, BranchPlan, PromptFormat, canonical, describe
from .base import (
    Answer,
    Label,
    Limits,
    Question,
    Scored,
    check_options,
    check_threshold,
    labels_from_json,
    labels_from_proto,
    labels_to_json,
    one_of,
    question_type,
)


@dataclass(frozen=True, slots=True)
class LabelDecision:
    label: str
    p: float  # probability that the label applies (its own yes/no)
    chosen: bool  # p >= threshold
    label_mass: float


@dataclass(frozen=True, slots=True)
class MultiLabelAnswer(Answer):
    question: str
    labels: tuple[LabelDecision, ...]  # in the order given
    chosen: tuple[str, ...]
    threshold: float
    label_mass: float  # the lowest over the labels' branches
    type = "multi_label"

    def verdict(self) -> str:
        per = ", ".join(f"{d.label} {d.p:.3f}" for d in self.labels)
        return (f"{', '.join(self.chosen) or '(none)'}  ({per}; "
                f"label mass {self.label_mass:.2f})")

    def proto_fields(self) -> dict:
        return {"labels": [{"label": d.label, "p": d.p, "chosen": d.chosen,
                            "label_mass": d.label_mass} for d in self.labels],
                "chosen": list(self.chosen), "threshold": self.threshold}

    @classmethod
    def from_proto(cls, question: str, label_mass: float, m) -> MultiLabelAnswer:
        decisions = tuple(LabelDecision(d.label, d.p, d.chosen, d.label_mass)
                          for d in m.labels)
        return cls(question, decisions, tuple(m.chosen), m.threshold, label_mass)


@question_type
@dataclass(frozen=True, slots=True)
class MultiLabel(Question):
    question: str
    labels: tuple[Label, ...]
    threshold: float = 0.5
    type = "multi_label"
    answer_type = MultiLabelAnswer

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", tuple(Label.of(v) for v in self.labels))

    def violations(self, at: Path, limits: Limits) -> Iterator[FieldViolation]:
        yield from Question.violations(self, at, limits)
        yield from check_threshold(at + ("threshold",), self.threshold)
        yield from check_options(at + ("labels",), self.labels, 1, limits)

    def options(self) -> tuple[str, tuple[Label, ...]]:
        return "labels", self.labels

    def branches(self, fmt: PromptFormat) -> list[BranchPlan]:
        ask = self.question.strip()
        return [BranchPlan(fmt.render_suffix(f"Question: {ask}\nLabel: {describe(label)}\n"
                                             "Does this label apply? (yes or no)"), (YES, NO))
                for label in canonical(self.labels)]

    def answer(self, scored: Sequence[Scored]) -> MultiLabelAnswer:
        by_name = {lb.name: s for lb, s in zip(canonical(self.labels), scored, strict=True)}
        decisions = tuple(LabelDecision(lb.name, p, p >= self.threshold, s.label_mass)
                          for lb in self.labels
                          for s in [by_name[lb.name]] for p in [s.probabilities[YES]])
        chosen = tuple(d.label for d in decisions if d.chosen)
        return MultiLabelAnswer(self.question, decisions, chosen, self.threshold,
                                min(d.label_mass for d in decisions))

    def expected(self, gold: object) -> tuple[str, ...]:
        """gold: the labels that apply (a list, possibly empty)."""
        if not isinstance(gold, list):
            raise ValueError(f"the gold answer must be the list of labels that apply, got "
                             f"{gold!r}")
        chosen = {one_of(name, self.labels) for name in gold}
        return tuple(YES if lb.name in chosen else NO for lb in canonical(self.labels))

    def fields(self) -> dict:
        return {"labels": labels_to_json(self.labels), "threshold": self.threshold}

    @classmethod
    def from_fields(cls, question: str, fields: Mapping, at: Path,
                    bad: list[FieldViolation]) -> MultiLabel | None:
        labels = labels_from_json(at + ("labels",), fields.get("labels", []), bad)
        return None if labels is None else cls(question, labels, fields.get("threshold", 0.5))

    @classmethod
    def from_proto(cls, question: str, m) -> MultiLabel:
        return cls(question, labels_from_proto(m.labels),
                   m.threshold if m.HasField("threshold") else 0.5)
