"""A calibration: what `decider calibrate` fitted on a user's labelled examples (or on
content-free texts), tied to one model file and one prompt template, and applied to each
question it knows.

Every adjustment is the same map on one branch's answer probabilities p:
softmax(log p / temperature + weights . log p + bias). A temperature alone rescales the
model's confidence without changing its choice; a bias per answer undoes the model's
prior over the options (small models carry a strong one). For yes/no the pair is Platt
scaling on the log-odds; for choices and scales it is vector scaling with one
temperature. Weights (the matrix form) let every answer's logit read every answer's
log-probability: beta calibration for yes/no, matrix scaling for options. A question is
known by its signature: the hash of what it asks (type, wording, options with their
descriptions); a question the file does not know takes its type's fallback for its
option count, a temperature fitted on every question of that shape, if there is one.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import CalibrationMismatch, ConfigError
from .prompts import FORMATS, prompt_text
from .questions import Question, Scored

FORMAT = "decider-calibration/1"
_TINY = 1e-300  # log of a probability that underflowed to zero stays finite


@dataclass(frozen=True, slots=True)
class Adjustment:
    """softmax(log p / temperature + sum_j weights[answer][j] log p[j] + bias[answer]) on
    one branch; a bias or weight not given is 0. `method` says what was fitted:
    temperature, bias (Platt for yes/no, vector scaling for options), matrix (beta
    calibration for yes/no, matrix scaling for options) or contextual (the bias from
    content-free texts)."""

    temperature: float = 1.0
    bias: Mapping[str, float] = field(default_factory=dict)
    method: str = "temperature"
    weights: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def apply(self, scored: Scored) -> Scored:
        logp = {name: math.log(max(p, _TINY)) for name, p in scored.probabilities.items()}
        z = {name: v / self.temperature + self.bias.get(name, 0.0) + math.fsum(
                 w * logp[of] for of, w in self.weights.get(name, {}).items())
             for name, v in logp.items()}
        top = max(z.values())
        total = math.fsum(math.exp(v - top) for v in z.values())
        return Scored({name: math.exp(v - top) / total for name, v in z.items()},
                      scored.label_mass)


@dataclass(frozen=True, slots=True)
class QuestionCalibration:
    """One question's adjustments, one per branch in the question's own branch order, and
    the abstention it was fitted with (None: not set)."""

    signature: str
    type: str
    question: str  # for a person reading the file
    branches: tuple[Adjustment, ...]
    abstain_below: float | None = None
    min_label_mass: float | None = None
    examples: int = 0  # how many labelled examples it was fitted on


@dataclass(frozen=True, slots=True)
class Calibration:
    model_sha256: str
    template_version: str
    questions: Mapping[str, QuestionCalibration] = field(default_factory=dict)
    fallbacks: Mapping[str, Adjustment] = field(default_factory=dict)  # by shape_key
    model: str = ""  # the model's name, for a person reading the file

    def check(self, model_sha256: str, template_version: str, origin: str = "") -> None:
        """Refuse to apply to another model or another prompt template: its numbers would
        be another model's biases."""
        if model_sha256 != self.model_sha256:
            raise CalibrationMismatch(origin, "model sha256", self.model_sha256, model_sha256)
        if template_version != self.template_version:
            raise CalibrationMismatch(origin, "template version", self.template_version,
                                      template_version)

    def lookup(self, question: Question) -> QuestionCalibration | None:
        """The question's own calibration, else one built from its shape's fallback."""
        known = self.questions.get(signature(question))
        if known is not None or not self.fallbacks:
            return known
        shapes = [shape_key(question.type, len(answers)) for answers in branch_answers(question)]
        if not all(key in self.fallbacks for key in shapes):
            return None
        return QuestionCalibration(signature(question), question.type, question.question,
                                   tuple(self.fallbacks[key] for key in shapes))

    def to_json(self) -> dict:
        return {"format": FORMAT, "model": self.model, "model_sha256": self.model_sha256,
                "template_version": self.template_version,
                "questions": [asdict(q) for q in self.questions.values()],
                "fallbacks": {key: asdict(a) for key, a in self.fallbacks.items()}}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def from_json(cls, data: dict, origin: str = "") -> Calibration:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"{origin or 'calibration'}: not a {FORMAT} file")
        questions = {}
        for q in data["questions"]:
            q = dict(q, branches=tuple(Adjustment(**a) for a in q["branches"]))
            questions[q["signature"]] = QuestionCalibration(**q)
        return cls(data["model_sha256"], data["template_version"], questions,
                   {k: Adjustment(**a) for k, a in data.get("fallbacks", {}).items()},
                   data.get("model", ""))

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        try:
            return cls.from_json(json.loads(Path(path).read_text()), str(path))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"cannot read the calibration {path}: {e}",
                              key="calibration") from e


def branch_answers(question: Question) -> list[tuple[str, ...]]:
    """The answers competing in each of the question's branches, in its branch order."""
    return [bp.answers for bp in question.branches(FORMATS["plain"])]


def signature(question: Question) -> str:
    """What the question asks, whatever the prompt format: its type and each branch's
    wording and answers (options in the order the prompt lists them: canonical)."""
    asked = [question.type, question.question.strip(),
             [[prompt_text(bp.suffix), list(bp.answers)]
              for bp in question.branches(FORMATS["plain"])]]
    return hashlib.sha256(json.dumps(asked).encode()).hexdigest()[:32]


def shape_key(question_type: str, n_answers: int) -> str:
    return f"{question_type}/{n_answers}"
