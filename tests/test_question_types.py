"""A question type is one class in one module: a fifth one, written here, is validated,
asked, read and answered end to end through the Python API, the real gemma-3-270m, and
none of decider's modules changes for it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pytest

from decider import Choice, Request
from decider.errors import FieldViolation, InvalidRequest
from decider.prompts import BranchPlan, PromptFormat, listing
from decider.questions import (
    Answer,
    Label,
    Limits,
    Question,
    Scored,
    question_type,
    request_from_dict,
)

MOODS = ("negative", "neutral", "positive")
TEXT = "I was charged twice for my order and nobody answers. Terrible service."


@dataclass(frozen=True, slots=True)
class PolarityAnswer(Answer):
    question: str
    mood: str  # the most probable of MOODS
    polarity: float  # p(positive) - p(negative), in [-1, 1]
    probabilities: dict[str, float]
    label_mass: float
    type = "polarity"

    def verdict(self) -> str:
        return f"{self.mood} ({self.polarity:+.2f})"


@question_type
@dataclass(frozen=True, slots=True)
class Polarity(Question):
    """How the writer feels: negative, neutral or positive, and a polarity score."""

    question: str
    type = "polarity"
    answer_type = PolarityAnswer

    def violations(self, at, limits: Limits) -> Iterator[FieldViolation]:
        yield from Question.violations(self, at, limits)
        if "?" not in self.question:
            yield FieldViolation(at + ("question",), "must be a question")

    def branches(self, fmt: PromptFormat) -> list[BranchPlan]:
        labels = tuple(Label(m) for m in MOODS)
        body = f"Question: {self.question.strip()}\nOptions:{listing(labels)}"
        return [BranchPlan(fmt.render_suffix(body), MOODS)]

    def answer(self, scored: Sequence[Scored]) -> PolarityAnswer:
        [branch] = scored
        p = branch.probabilities
        mood = max(MOODS, key=p.get)
        return PolarityAnswer(self.question, mood, p["positive"] - p["negative"], dict(p),
                              branch.label_mass)

    def fields(self) -> dict:
        return {}

    @classmethod
    def from_fields(cls, question: str, fields: Mapping, at, bad) -> Polarity:
        return cls(question)


def test_a_fifth_type_is_answered_through_the_python_api(decider):
    """Its answer is the model's: the same prompt as a three-label choice gives the same
    probabilities to the bit (the labels are listed in the same canonical order)."""
    ask = "How does the writer feel?"
    decision = decider.decide(TEXT, [Polarity(ask), Choice(ask, list(MOODS))])
    polarity, choice = decision.answers
    assert isinstance(polarity, PolarityAnswer)
    assert polarity.probabilities == choice.probabilities
    assert polarity.mood == choice.label
    p = choice.probabilities
    assert polarity.polarity == pytest.approx(p["positive"] - p["negative"])
    assert sum(p.values()) == pytest.approx(1.0)
    as_json = decision.to_dict()["answers"][0]
    assert (as_json["type"], as_json["mood"]) == ("polarity", polarity.mood)
    assert polarity.text().splitlines() == [ask, f"  {polarity.verdict()}"]


def test_a_fifth_type_is_read_from_json_and_validated_like_the_others(decider):
    request = request_from_dict({"text": TEXT, "questions": [
        {"type": "polarity", "question": "How does the writer feel?"}]})
    assert request.questions == (Polarity("How does the writer feel?"),)
    with pytest.raises(InvalidRequest) as info:
        decider.decide_request(Request(TEXT, (Polarity("Tell me the mood"),)))
    assert [v.field for v in info.value.violations] == ["questions[0].question"]
    with pytest.raises(InvalidRequest) as info:
        request_from_dict({"text": TEXT, "questions": [
            {"type": "polarity", "question": "Mood?", "labels": ["a"]}]})
    assert info.value.violations[0].field == "questions[0].labels"
