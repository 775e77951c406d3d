"""scale: one level of an ordinal scale, levels lowest first (their order is their meaning,
so it is kept in the prompt). It reports the most probable level and the expected index."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from ..errors import FieldViolation, Path
from ..prompts import BranchPlan, PromptFormat, listing
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
from .confidence import concentration


@dataclass(frozen=True, slots=True)
class ScaleAnswer(Answer):
    question: str
    level: str  # the most probable level
    expected_index: float  # probability-weighted level position, 0 = lowest
    probabilities: dict[str, float]  # every level, lowest first; they sum to 1
    confidence: float  # confidence.concentration: 0 uniform, 1 all on one level
    label_mass: float
    type = "scale"

    def verdict(self) -> str:
        dist = ", ".join(f"{k} {v:.3f}" for k, v in self.probabilities.items())
        return (f"{self.level}  ({dist}, expected index {self.expected_index:.2f}; "
                f"label mass {self.label_mass:.2f})")

    def proto_fields(self) -> dict:
        return {"level": self.level, "expected_index": self.expected_index,
                "probabilities": [{"label": k, "p": p} for k, p in self.probabilities.items()],
                "confidence": self.confidence}

    @classmethod
    def from_proto(cls, question: str, label_mass: float, m) -> ScaleAnswer:
        return cls(question, m.level, m.expected_index,
                   {p.label: p.p for p in m.probabilities}, m.confidence, label_mass)


@question_type
@dataclass(frozen=True, slots=True)
class Scale(Question):
    question: str
    levels: tuple[Label, ...]
    type = "scale"
    answer_type = ScaleAnswer

    def __post_init__(self) -> None:
        object.__setattr__(self, "levels", tuple(Label.of(v) for v in self.levels))

    def violations(self, at: Path, limits: Limits) -> Iterator[FieldViolation]:
        yield from Question.violations(self, at, limits)
        yield from check_options(at + ("levels",), self.levels, 2, limits)

    def options(self) -> tuple[str, tuple[Label, ...]]:
        return "levels", self.levels

    def branches(self, fmt: PromptFormat) -> list[BranchPlan]:
        body = (f"Question: {self.question.strip()}\nScale, lowest to highest:"
                f"{listing(self.levels)}")
        return [BranchPlan(fmt.render_suffix(body), tuple(lv.name for lv in self.levels))]

    def answer(self, scored: Sequence[Scored]) -> ScaleAnswer:
        [branch] = scored
        ordered = {lv.name: branch.probabilities[lv.name] for lv in self.levels}
        best = max(ordered, key=ordered.get)
        expected = float(sum(i * p for i, p in enumerate(ordered.values())))
        return ScaleAnswer(self.question, best, expected, ordered,
                           concentration(list(ordered.values())), branch.label_mass)

    def expected(self, gold: object) -> tuple[str, ...]:
        return (one_of(gold, self.levels),)

    def fields(self) -> dict:
        return {"levels": labels_to_json(self.levels)}

    @classmethod
    def from_fields(cls, question: str, fields: Mapping, at: Path,
                    bad: list[FieldViolation]) -> Scale | None:
        levels = labels_from_json(at + ("levels",), fields.get("levels", []), bad)
        return None if levels is None else cls(question, levels)

    @classmethod
    def from_proto(cls, question: str, m) -> Scale:
        return cls(question, labels_from_proto(m.levels))
