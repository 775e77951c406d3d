"""OpenAI's Decisions API wire shape (POST /v1/decisions) as pydantic models, as
openai-python 3.63 states it (decision_create_params.py, decision.py). Fields decider does
not use (prompt caching, safety_identifier) are accepted and ignored; decider's additions
carry `x_` names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..questions import Answer as DeciderAnswer
from ..questions import Choice, Label, Scale, YesNo
from ..questions import Question as DeciderQuestion

# decider's answer -> this API's; each question class says how it is asked (`ask`)
Reader = Callable[[DeciderAnswer], BaseModel]


class _Sent(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class TextPart(_Sent):
    type: Literal["input_text", "output_text"]
    text: str


class JsonPart(_Sent):
    type: Literal["input_json"]
    data: dict[str, Any] | list[Any]


class ImagePart(_Sent):
    """Refused: this server reads text."""

    type: Literal["input_image"]


Part = Annotated[TextPart | JsonPart | ImagePart, Field(discriminator="type")]


class DecisionMessage(_Sent):
    role: Literal["user", "developer", "system", "assistant"]
    type: Literal["message"] = "message"
    content: str | list[Part]


class DecisionPredicate(_Sent):
    type: Literal["predicate"]
    instructions: str | list[Part] = Field(description="The statement to judge true or "
                                           "false.")
    name: str | None = None

    def ask(self, text: str) -> tuple[DeciderQuestion, Reader]:
        """A yes/no on the statement; its probability of yes."""
        return YesNo(text), lambda a: DecisionPredicateAnswer(
            type="predicate", name=self.name, probability=a.p_yes, x_label_mass=a.label_mass)


class DecisionChoiceOption(_Sent):
    value: str | bool = Field(description="A string, or a boolean (distinct from its text).")
    description: str | None = None


class DecisionChoice(_Sent):
    type: Literal["choice"]
    instructions: str | list[Part]
    choices: list[DecisionChoiceOption] = Field(min_length=2, max_length=255)
    name: str | None = None

    def ask(self, text: str) -> tuple[DeciderQuestion, Reader]:
        """A choice over the values (a boolean as "true" or "false"); the value comes back
        typed."""
        typed = {_key(c.value): c.value for c in self.choices}
        labels = [Label(_key(c.value), c.description or "") for c in self.choices]
        return Choice(text, labels), lambda a: DecisionChoiceAnswer(
            type="choice", name=self.name, choice=typed[a.label], confidence=a.confidence,
            probabilities=[DecisionChoiceProbability(value=typed[k], probability=p)
                           for k, p in a.probabilities.items()],
            x_label_mass=a.label_mass)


class DecisionLevel(_Sent):
    label: str
    description: str | None = None


class DecisionScore(_Sent):
    type: Literal["score"]
    instructions: str | list[Part]
    levels: list[DecisionLevel] = Field(min_length=2, max_length=10,
                                description="The levels, lowest first.")
    name: str | None = None

    def ask(self, text: str) -> tuple[DeciderQuestion, Reader]:
        """A scale over the level indices, each described by its label (and description),
        as System One's score is asked; the probability-weighted index comes back."""
        levels = [Label(str(i), f"{lv.label}: {lv.description}" if lv.description
                        else lv.label) for i, lv in enumerate(self.levels)]
        return Scale(text, levels), lambda a: DecisionScoreAnswer(
            type="score", name=self.name, score=a.expected_index, confidence=a.confidence,
            probabilities=[DecisionScoreProbability(value=i, label=lv.label,
                                            probability=a.probabilities[str(i)])
                           for i, lv in enumerate(self.levels)],
            x_label_mass=a.label_mass)


def _key(value: str | bool) -> str:
    return str(value).lower() if isinstance(value, bool) else value


DecisionQuestion = Annotated[DecisionPredicate | DecisionChoice | DecisionScore,
                             Field(discriminator="type")]


class DecisionRequest(_Sent):
    model: str | None = Field(None, description="The served model, an alias, or "
                              "gpt-6-luna; none: the served model.")
    input: str | list[DecisionMessage] = Field(description="Text, or messages whose text and JSON "
                                       "parts are read in order.")
    questions: list[DecisionQuestion] = Field(min_length=1)


class DecisionPredicateAnswer(BaseModel):
    type: Literal["predicate"]
    name: str | None
    probability: float = Field(description="The probability that the statement is true.")
    x_label_mass: float


class DecisionChoiceProbability(BaseModel):
    value: str | bool
    probability: float


class DecisionChoiceAnswer(BaseModel):
    type: Literal["choice"]
    name: str | None
    choice: str | bool
    confidence: float
    probabilities: list[DecisionChoiceProbability]
    x_label_mass: float


class DecisionScoreProbability(BaseModel):
    value: int = Field(description="The level's index, 0 the lowest.")
    label: str
    probability: float


class DecisionScoreAnswer(BaseModel):
    type: Literal["score"]
    name: str | None
    score: float = Field(description="The probability-weighted level index.")
    confidence: float
    probabilities: list[DecisionScoreProbability]
    x_label_mass: float


class InputDetails(BaseModel):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputDetails(BaseModel):
    reasoning_tokens: int = 0


class DecisionUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputDetails = InputDetails()
    output_tokens: int = 0
    output_tokens_details: OutputDetails = OutputDetails()
    total_tokens: int


class DecisionResponse(BaseModel):
    model: str
    answers: list[Annotated[DecisionPredicateAnswer | DecisionChoiceAnswer | DecisionScoreAnswer,
                            Field(discriminator="type")]]
    usage: DecisionUsage
    x_decider: dict[str, Any] = Field(description="decider: what answered, and how long it "
                                      "took (as System One's x_decider).")


class OpenAIError(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error, authentication_error, "
                      "not_found_error, rate_limit_error, server_error")
    param: str | None = None
    code: str | None = Field(None, description="decider's reason, as over gRPC.")


class OpenAIErrorBody(BaseModel):
    error: OpenAIError
