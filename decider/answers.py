"""Typed answers. Every answer reports label_mass: the share of the full-vocabulary
probability at the answer position that fell on the label tokens. A low mass says the
model is not answering in label space, whatever the normalised probabilities say."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar


def _json_shaped(value):
    if isinstance(value, (tuple, list)):
        return [_json_shaped(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_shaped(v) for k, v in value.items()}
    return value


class _Answer:
    __slots__ = ()
    type: ClassVar[str]

    def to_dict(self) -> dict:
        return {"type": self.type, **_json_shaped(asdict(self))}


@dataclass(frozen=True, slots=True)
class YesNoAnswer(_Answer):
    question: str
    p_yes: float
    decision: bool  # p_yes >= threshold
    threshold: float
    label_mass: float
    type: ClassVar[str] = "yes_no"


@dataclass(frozen=True, slots=True)
class ChoiceAnswer(_Answer):
    question: str
    label: str  # the most probable label
    confidence: float  # its probability
    probabilities: dict[str, float]  # every label, in the order given; they sum to 1
    label_mass: float
    type: ClassVar[str] = "choice"


@dataclass(frozen=True, slots=True)
class LabelDecision:
    label: str
    p: float  # probability that the label applies (its own yes/no)
    chosen: bool  # p >= threshold
    label_mass: float


@dataclass(frozen=True, slots=True)
class MultiLabelAnswer(_Answer):
    question: str
    labels: tuple[LabelDecision, ...]  # in the order given
    chosen: tuple[str, ...]
    threshold: float
    label_mass: float  # the lowest over the labels' branches
    type: ClassVar[str] = "multi_label"


@dataclass(frozen=True, slots=True)
class ScaleAnswer(_Answer):
    question: str
    level: str  # the most probable level
    expected_index: float  # probability-weighted level position, 0 = lowest
    probabilities: dict[str, float]  # every level, lowest first; they sum to 1
    label_mass: float
    type: ClassVar[str] = "scale"


Answer = YesNoAnswer | ChoiceAnswer | MultiLabelAnswer | ScaleAnswer


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int  # the prefix plus every branch's suffix and label tokens
    window_tokens: int  # the longest single sequence, the one checked against n_ctx


@dataclass(frozen=True, slots=True)
class Decision:
    answers: tuple[Answer, ...]
    model: str
    engine: str
    usage: Usage

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "engine": self.engine,
            "answers": [a.to_dict() for a in self.answers],
            "usage": asdict(self.usage),
        }


@dataclass(frozen=True, slots=True)
class Outcome:
    """A decision as a service answers it: with its timings and the model's provenance."""

    decision: Decision
    queue_ms: float
    compute_ms: float
    model_sha256: str  # of the model that computed it
