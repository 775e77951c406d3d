"""A request: a text and the typed questions asked about it, validated once against the
limits, every fault named at its path; and the same built from JSON (the CLI's --jsonl)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from ..errors import FieldViolation, InvalidRequest, Path
from .base import ABSTAIN_FIELDS, QUESTION_TYPES, Limits, Question, check_chars, check_text


@dataclass(frozen=True, slots=True)
class Request:
    text: str
    questions: tuple[Question, ...]
    instructions: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "questions", tuple(self.questions))

    def validate(self, limits: Limits = Limits()) -> Request:
        """Raise InvalidRequest listing every bad field; return self when all are good."""
        bad = [*check_text(("text",), self.text, limits.max_text_bytes),
               *check_chars(("instructions",), self.instructions,
                            limits.max_instructions_chars)]
        if not self.questions:
            bad.append(FieldViolation("questions", "at least one question is required"))
        elif len(self.questions) > limits.max_questions:
            bad.append(FieldViolation("questions", f"{len(self.questions)} questions, over "
                                                   f"the limit of {limits.max_questions}"))
        for i, q in enumerate(self.questions[: limits.max_questions]):
            if isinstance(q, Question):
                bad.extend(q.violations(("questions", i), limits))
            else:
                bad.append(FieldViolation(("questions", i),
                                          f"unknown question type {type(q).__name__}"))
        if bad:
            raise InvalidRequest(bad)
        return self


def request_from_dict(data: object, limits: Limits = Limits()) -> Request:
    """Build and validate a Request from JSON-shaped data: {"text", "instructions",
    "questions": [{"type", "question", ...the type's fields}]}."""
    if not isinstance(data, Mapping):
        raise InvalidRequest([FieldViolation("request", "must be a JSON object")])
    bad = [FieldViolation(key if key.strip() else repr(key), "unknown field")
           for key in sorted(set(data) - {"text", "questions", "instructions"})]
    raw_questions = data.get("questions")
    questions: list[Question] = []
    if not isinstance(raw_questions, list):
        bad.append(FieldViolation("questions", "must be a list of question objects"))
    else:
        for i, raw in enumerate(raw_questions):
            q = _question_from_dict(("questions", i), raw, bad)
            if q is not None:
                questions.append(q)
    request = Request(data.get("text", ""), tuple(questions), data.get("instructions", ""))
    if bad:  # the text's own faults too, not only the questions'
        raise InvalidRequest([*check_text(("text",), request.text, limits.max_text_bytes),
                              *check_chars(("instructions",), request.instructions,
                                           limits.max_instructions_chars), *bad])
    return request.validate(limits)


def _question_from_dict(at: Path, raw: object, bad: list[FieldViolation]) -> Question | None:
    if not isinstance(raw, Mapping):
        bad.append(FieldViolation(at, "must be a JSON object"))
        return None
    kind = raw.get("type", "yes_no")
    cls = QUESTION_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        bad.append(FieldViolation(at + ("type",), f"unknown type {kind!r}; one of "
                                                 f"{sorted(QUESTION_TYPES)}"))
        return None
    own = {f.name for f in fields(cls)} - {"question"}
    for key in sorted(set(raw) - own - {"type", "question"}):
        bad.append(FieldViolation(at + (key,), f"not a field of a {kind} question"))
    question = cls.from_fields(raw.get("question", ""), raw, at, bad)
    return question and replace(question, **{name: raw[name] for name in ABSTAIN_FIELDS
                                              if raw.get(name) is not None})
