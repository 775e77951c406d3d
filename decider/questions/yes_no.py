"""yes_no: is the answer yes? It reports p_yes and decides yes at p_yes >= threshold."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from ..errors import FieldViolation, Path
from ..prompts import NO, YES, BranchPlan, PromptFormat
from .base import Answer, Limits, Question, Scored, check_threshold, question_type


@dataclass(frozen=True, slots=True)
class YesNoAnswer(Answer):
    question: str
    p_yes: float
    decision: bool  # p_yes >= threshold
    threshold: float
    label_mass: float
    type = "yes_no"

    def verdict(self) -> str:
        return (f"{'yes' if self.decision else 'no'}  (p_yes {self.p_yes:.3f}, "
                f"label mass {self.label_mass:.2f})")

    def proto_fields(self) -> dict:
        return {"p_yes": self.p_yes, "decision": self.decision, "threshold": self.threshold}

    @classmethod
    def from_proto(cls, question: str, label_mass: float, m) -> YesNoAnswer:
        return cls(question, m.p_yes, m.decision, m.threshold, label_mass)


@question_type
@dataclass(frozen=True, slots=True)
class YesNo(Question):
    question: str
    threshold: float = 0.5
    type = "yes_no"
    answer_type = YesNoAnswer

    def violations(self, at: Path, limits: Limits) -> Iterator[FieldViolation]:
        yield from Question.violations(self, at, limits)
        yield from check_threshold(at + ("threshold",), self.threshold)

    def branches(self, fmt: PromptFormat) -> list[BranchPlan]:
        body = f"Question: {self.question.strip()} (yes or no)"
        return [BranchPlan(fmt.render_suffix(body), (YES, NO))]

    def answer(self, scored: Sequence[Scored]) -> YesNoAnswer:
        [branch] = scored
        p_yes = branch.probabilities[YES]
        return YesNoAnswer(self.question, p_yes, p_yes >= self.threshold, self.threshold,
                           branch.label_mass)

    def expected(self, gold: object) -> tuple[str, ...]:
        if isinstance(gold, bool):
            return (YES if gold else NO,)
        if isinstance(gold, str) and gold.strip().lower() in (YES, NO):
            return (gold.strip().lower(),)
        raise ValueError(f'the gold answer must be "yes", "no" or a boolean, got {gold!r}')

    def fields(self) -> dict:
        return {"threshold": self.threshold}

    @classmethod
    def from_fields(cls, question: str, fields: Mapping, at: Path,
                    bad: list[FieldViolation]) -> YesNo:
        return cls(question, fields.get("threshold", 0.5))

    @classmethod
    def from_proto(cls, question: str, m) -> YesNo:
        return cls(question, m.threshold if m.HasField("threshold") else 0.5)
