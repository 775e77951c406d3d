"""The System One wire shape (POST /v1/systemone, GET /v1/models) as pydantic models.

Standard fields follow the published schema. decider's additions carry `x_` names (the
community convention: no clash the day TypeSafe adds a field) and say "decider:" in their
descriptions; clients ignore unknown fields and answer types. A request's unknown fields
are kept aside (pydantic's extra="allow"), counted and ignored, as the published API
ignores them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, WrapValidator, model_validator
from pydantic_core import PydanticCustomError


def _one_error(value, handler):
    """One error for a value that is none of the three, not one per member of the union."""
    try:
        return handler(value)
    except ValidationError:
        raise PydanticCustomError("content_type", "Input should be a string, an object or "
                                  "an array") from None


# A state, an instruction or a criterion: text, or JSON rendered into the prompt.
Content = Annotated[str | dict[str, Any] | list[Any], WrapValidator(_one_error)]

MAX_CHOICE_OPTIONS = 255  # published limits
MAX_SCORE_LEVELS = 10
MULTI_LABEL = "x_multi_label"
LEGACY_MULTI_LABEL = "decider.multi_label"  # deprecated: decider 0.1's name for it


class _Strict(BaseModel):
    """What a client sends: strict types; fields decider does not know are kept in
    `model_extra`, for the route to count and drop."""

    model_config = ConfigDict(extra="allow", strict=True)


class NoulCriteria(_Strict):
    true: Content | None = Field(None, description="What counts as a yes.")
    false: Content | None = Field(None, description="What counts as a no.")


_SHARE = {"ge": 0.0, "le": 1.0}


class _Asked(_Strict):
    """decider's extensions every question type takes (docs/calibration.md)."""

    x_abstain_below: float | None = Field(None, **_SHARE, description="decider: abstain when "
                                          "the answer's confidence is below this.")
    x_min_label_mass: float | None = Field(None, **_SHARE, description="decider: abstain "
                                           "when the label mass is below this.")


class NoulQuestion(_Asked):
    type: Literal["noul"]
    instructions: Content | None = Field(None, description="The yes/no question or statement.")
    criteria: NoulCriteria | None = None

    @model_validator(mode="after")
    def _asks_something(self) -> NoulQuestion:
        described = self.criteria and (self.criteria.true is not None
                                       or self.criteria.false is not None)
        if self.instructions is None and not described:
            raise ValueError("give instructions, or criteria describing true or false")
        return self


class ChoiceQuestion(_Asked):
    type: Literal["choice"]
    instructions: Content | None = None
    criteria: dict[str, Content | None] = Field(
        min_length=1, max_length=MAX_CHOICE_OPTIONS,
        description="Option names and what each means (null: the name alone).")


class ScoreQuestion(_Asked):
    type: Literal["score"]
    instructions: Content | None = None
    criteria: list[Content] = Field(
        min_length=1, max_length=MAX_SCORE_LEVELS,
        description="The levels, lowest first; a level's position is its score.")


class MultiLabelQuestion(_Asked):
    """decider: any of the options, each an independent yes/no."""

    type: Literal["x_multi_label", "decider.multi_label"]
    instructions: Content | None = None
    criteria: dict[str, Content | None] = Field(min_length=1, max_length=256)
    threshold: float = Field(0.5, ge=0, le=1, description="An option is chosen at p >= this.")
    thresholds: dict[str, Annotated[float, Field(ge=0, le=1)]] = Field(
        default_factory=dict, description="Per-option thresholds, over `threshold`.")

    @model_validator(mode="after")
    def _thresholds_name_options(self) -> MultiLabelQuestion:
        unknown = sorted(set(self.thresholds) - set(self.criteria))
        if unknown:
            raise ValueError(f"thresholds name options not in criteria: {unknown}")
        return self


Question = Annotated[NoulQuestion | ChoiceQuestion | ScoreQuestion | MultiLabelQuestion,
                     Field(discriminator="type")]


class SystemOneRequest(_Strict):
    model: str | None = Field(None, description="A name or alias from GET /v1/models, "
                              "TypeSafe's names (jev-latest, jev-*) or OpenRouter's forms of "
                              "them; none: the served model.")
    state: Content = Field(description="What every question is asked about.")
    questions: dict[str, Question] = Field(
        min_length=1, description="Questions under names you choose; answers come back under "
        "the same names.")
    assets: dict[str, Any] | None = Field(None, description="Images: refused, this server "
                                          "reads text (422 naming them).")


_MASS = Field(description="decider: the share of the model's whole next-token probability "
                          "on the answer tokens (low: the model is not answering in label "
                          "space).")


class _Answered(BaseModel):
    """decider's extensions every answer carries (docs/calibration.md)."""

    x_calibrated: bool = Field(False, description="decider: the probabilities passed "
                               "through the loaded calibration.")
    x_abstained: bool = Field(False, description="decider: below the question's abstention "
                              "settings; the answer's fields still hold the model's answer.")
    x_abstain_reason: str = Field("", description="decider: which setting it fell below.")


class NoulAnswer(_Answered):
    type: Literal["noul"]
    noul: float = Field(description="The probability of yes.")
    x_label_mass: float = _MASS


class ChoiceAnswer(_Answered):
    type: Literal["choice"]
    choice: str = Field(description="The most probable option.")
    confidence: float = Field(description="(n*m - 1)/(n - 1), m the chosen option's "
                              "probability, n the options: 0 uniform, 1 certain (1 for one).")
    probabilities: dict[str, float] = Field(description="Every option; they sum to 1.")
    x_label_mass: float = _MASS


class ScoreAnswer(_Answered):
    type: Literal["score"]
    score: float = Field(description="The probability-weighted level, 0-based.")
    confidence: float = Field(description="1 - spread/D: the probability's mean distance "
                              "from the modal level against a uniform distribution's (1 for "
                              "one level).")
    legend: dict[str, Content] = Field(description="Level index -> its criterion.")
    probabilities: dict[str, float] = Field(description="Level index -> probability.")
    x_label_mass: float = _MASS


class LabelVerdict(BaseModel):
    p: float = Field(description="The probability that the option applies.")
    threshold: float
    chosen: bool = Field(description="p >= threshold.")


class MultiLabelAnswer(_Answered):
    """decider: each option's own yes/no."""

    type: Literal["x_multi_label", "decider.multi_label"] = Field(
        description="As the question was asked.")
    labels: dict[str, LabelVerdict]
    chosen: list[str] = Field(description="The chosen options, in the order given.")
    x_label_mass: float = Field(description="decider: the lowest over the options' branches.")


Answer = Annotated[NoulAnswer | ChoiceAnswer | ScoreAnswer | MultiLabelAnswer,
                   Field(discriminator="type")]


class Usage(BaseModel):
    input_tokens: int = Field(description="Tokens the engine read: the shared prefix and "
                              "every question's suffix and answer tokens.")
    output_tokens: int = Field(description="Always 0: decider generates no tokens.")


class Provenance(BaseModel):
    """decider: what answered, and how long it took."""

    version: str
    engine: str
    model_sha256: str
    template_version: str
    window_tokens: int = Field(description="The longest sequence, checked against n_ctx.")
    cached_tokens: int = Field(description="Tokens of the text's prefix read from the "
                               "engine's prefix cache instead of computed.")
    queue_ms: float
    compute_ms: float


class SystemOneResponse(BaseModel):
    model: str = Field(description="The served model's name, whatever name was asked for.")
    answers: dict[str, Answer]
    usage: Usage
    x_decider: Provenance


class ModelCard(BaseModel):
    name: str
    description: str
    release_date: str = Field(description="YYYY-MM-DD: the served file's date (decider "
                              "knows no release dates).")
    x_n_ctx: int = Field(description="decider: the loaded window, in tokens.")
    x_engine: str = Field(description="decider: the engine that serves it.")
    x_sha256: str = Field(description="decider: the model file's sha256.")


class ModelList(BaseModel):
    models: list[ModelCard]


class FieldError(BaseModel):
    loc: list[str | int] = Field(description='"body", then field names and indices.')
    msg: str
    type: str
    ctx: dict[str, Any] | None = None


class ValidationFailed(BaseModel):
    detail: list[FieldError]


class Problem(BaseModel):
    error_type: str = Field(description="TypeSafe's error type: api_usage_error, "
                            "authentication_error, max_tokens_exceeded, not_found, "
                            "rate_limit_error, overloaded_error, internal_error.")
    message: str
    reason: str = Field(description="decider: its UPPER_SNAKE reason, as over gRPC.")
    model_config = ConfigDict(extra="allow")  # the reason's numbers: prompt_tokens, n_ctx, ...


class Refusal(BaseModel):
    detail: Problem
