"""Request types: a text and the typed questions asked about it, validated against limits."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from .errors import FieldViolation, InvalidRequest


@dataclass(frozen=True, slots=True)
class Limits:
    """What one request may ask; the [limits] section of the config file."""

    max_text_bytes: int = 256 * 1024
    max_questions: int = 32
    max_labels: int = 256
    max_question_chars: int = 2000
    max_label_chars: int = 200
    max_description_chars: int = 1000
    max_instructions_chars: int = 8000
    # tokens the engine call places (Engine.placed_tokens), checked after tokenizing:
    # keeps one request from holding the engine for minutes (docs/design.md)
    max_work_tokens: int = 16384


@dataclass(frozen=True, slots=True)
class Label:
    name: str
    description: str = ""

    @classmethod
    def of(cls, value: Label | str) -> Label:
        return value if isinstance(value, Label) else cls(value)


class _WithOptions:
    """Accepts labels as plain strings or Label, in any sequence; stores a tuple."""

    __slots__ = ()

    def __post_init__(self) -> None:
        name = "levels" if isinstance(self, Scale) else "labels"
        object.__setattr__(self, name, tuple(Label.of(v) for v in getattr(self, name)))


@dataclass(frozen=True, slots=True)
class YesNo:
    """Is the answer yes? Reports p_yes; decides yes when p_yes >= threshold."""

    question: str
    threshold: float = 0.5
    type: ClassVar[str] = "yes_no"


@dataclass(frozen=True, slots=True)
class Choice(_WithOptions):
    """Exactly one of the labels."""

    question: str
    labels: tuple[Label, ...]
    type: ClassVar[str] = "choice"


@dataclass(frozen=True, slots=True)
class MultiLabel(_WithOptions):
    """Any of the labels: each is an independent yes/no, chosen when p >= threshold."""

    question: str
    labels: tuple[Label, ...]
    threshold: float = 0.5
    type: ClassVar[str] = "multi_label"


@dataclass(frozen=True, slots=True)
class Scale(_WithOptions):
    """One level of an ordinal scale, levels ordered lowest first."""

    question: str
    levels: tuple[Label, ...]
    type: ClassVar[str] = "scale"


Question = YesNo | Choice | MultiLabel | Scale
QUESTION_TYPES: dict[str, type] = {t.type: t for t in (YesNo, Choice, MultiLabel, Scale)}


def options_of(q: Question) -> tuple[Label, ...]:
    """The labels a question chooses among (levels for a scale, none for yes/no)."""
    if isinstance(q, Scale):
        return q.levels
    if isinstance(q, (Choice, MultiLabel)):
        return q.labels
    return ()


@dataclass(frozen=True, slots=True)
class Request:
    text: str
    questions: tuple[Question, ...]
    instructions: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "questions", tuple(self.questions))

    def validate(self, limits: Limits = Limits()) -> Request:
        """Raise InvalidRequest listing every bad field; return self when all are good."""
        bad: list[FieldViolation] = []
        _check_text(bad, "text", self.text, limits.max_text_bytes, required=True)
        _check_chars(bad, "instructions", self.instructions, limits.max_instructions_chars)
        if not self.questions:
            bad.append(FieldViolation("questions", "at least one question is required"))
        elif len(self.questions) > limits.max_questions:
            bad.append(
                FieldViolation(
                    "questions",
                    f"{len(self.questions)} questions, over the limit of {limits.max_questions}",
                )
            )
        for i, q in enumerate(self.questions[: limits.max_questions]):
            _check_question(bad, f"questions[{i}]", q, limits)
        if bad:
            raise InvalidRequest(bad)
        return self


def _utf8_ok(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: undecodable bytes from argv or a file
        return False
    return True


def _check_text(bad: list, name: str, value: object, max_bytes: int, required: bool) -> None:
    if not isinstance(value, str):
        bad.append(FieldViolation(name, "must be a string"))
    elif not _utf8_ok(value):
        bad.append(FieldViolation(name, "is not valid UTF-8"))
    elif required and not value.strip():
        bad.append(FieldViolation(name, "must not be empty"))
    elif len(value.encode("utf-8")) > max_bytes:
        size = len(value.encode("utf-8"))
        bad.append(FieldViolation(name, f"is {size} bytes, over the limit of {max_bytes}"))


def _check_chars(
    bad: list, name: str, value: object, max_chars: int, required: bool = False, one_line=False
) -> None:
    if not isinstance(value, str):
        bad.append(FieldViolation(name, "must be a string"))
    elif not _utf8_ok(value):
        bad.append(FieldViolation(name, "is not valid UTF-8"))
    elif required and not value.strip():
        bad.append(FieldViolation(name, "must not be empty"))
    elif len(value) > max_chars:
        bad.append(
            FieldViolation(name, f"is {len(value)} characters, over the limit of {max_chars}")
        )
    elif one_line and ("\n" in value or "\r" in value):
        bad.append(FieldViolation(name, "must be a single line"))


def _check_threshold(bad: list, name: str, value: object) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0
    if not ok:
        bad.append(FieldViolation(name, f"must be a number in [0, 1], got {value!r}"))


def _check_question(bad: list, at: str, q: object, limits: Limits) -> None:
    if not isinstance(q, (YesNo, Choice, MultiLabel, Scale)):
        bad.append(FieldViolation(at, f"unknown question type {type(q).__name__}"))
        return
    _check_chars(bad, f"{at}.question", q.question, limits.max_question_chars, required=True)
    if isinstance(q, (YesNo, MultiLabel)):
        _check_threshold(bad, f"{at}.threshold", q.threshold)
    if isinstance(q, YesNo):
        return
    name = "levels" if isinstance(q, Scale) else "labels"
    labels = options_of(q)
    fewest = 1 if isinstance(q, MultiLabel) else 2
    if len(labels) < fewest:
        bad.append(
            FieldViolation(f"{at}.{name}", f"needs at least {fewest}, got {len(labels)}")
        )
    if len(labels) > limits.max_labels:
        bad.append(
            FieldViolation(
                f"{at}.{name}", f"{len(labels)} given, over the limit of {limits.max_labels}"
            )
        )
        return
    seen: dict[str, int] = {}
    for j, label in enumerate(labels):
        where = f"{at}.{name}[{j}]"
        _check_chars(bad, where, label.name, limits.max_label_chars, required=True, one_line=True)
        _check_chars(bad, f"{where}.description", label.description,
                     limits.max_description_chars, one_line=True)
        if isinstance(label.name, str):
            key = label.name.strip().casefold()  # "Yes" and "yes" pool into one answer
            if key in seen:
                bad.append(FieldViolation(where, f"duplicates {name}[{seen[key]}] {label.name!r}"))
            seen.setdefault(key, j)


def request_from_dict(data: object, limits: Limits = Limits()) -> Request:
    """Build and validate a Request from JSON-shaped data (CLI --jsonl, service)."""
    if not isinstance(data, Mapping):
        raise InvalidRequest([FieldViolation("request", "must be a JSON object")])
    bad: list[FieldViolation] = []
    unknown = set(data) - {"text", "questions", "instructions"}
    for key in sorted(unknown):
        bad.append(FieldViolation(key if key.strip() else repr(key), "unknown field"))
    raw_questions = data.get("questions")
    questions: list[Question] = []
    if not isinstance(raw_questions, list):
        bad.append(FieldViolation("questions", "must be a list of question objects"))
    else:
        for i, raw in enumerate(raw_questions):
            q = _question_from_dict(bad, f"questions[{i}]", raw)
            if q is not None:
                questions.append(q)
    if bad:  # the text's own faults too, not only the questions'
        first: list[FieldViolation] = []
        _check_text(first, "text", data.get("text", ""), limits.max_text_bytes, required=True)
        _check_chars(first, "instructions", data.get("instructions", ""),
                     limits.max_instructions_chars)
        raise InvalidRequest(first + bad)
    return Request(
        text=data.get("text", ""),
        questions=tuple(questions),
        instructions=data.get("instructions", ""),
    ).validate(limits)


def _question_from_dict(bad: list, at: str, raw: object) -> Question | None:
    if not isinstance(raw, Mapping):
        bad.append(FieldViolation(at, "must be a JSON object"))
        return None
    kind = raw.get("type", "yes_no")
    cls = QUESTION_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        bad.append(FieldViolation(f"{at}.type", f"unknown type {kind!r}; one of {sorted(QUESTION_TYPES)}"))
        return None
    allowed = {"type", "question"} | {
        YesNo: {"threshold"},
        Choice: {"labels"},
        MultiLabel: {"labels", "threshold"},
        Scale: {"levels"},
    }[cls]
    for key in sorted(set(raw) - allowed):
        bad.append(FieldViolation(f"{at}.{key}", f"not a field of a {kind} question"))
    kwargs = {k: raw[k] for k in allowed - {"type"} if k in raw}
    kwargs.setdefault("question", "")
    for key in ("labels", "levels"):
        if key in allowed:
            labels = _labels_from_json(bad, f"{at}.{key}", raw.get(key, []))
            if labels is None:
                return None
            kwargs[key] = labels
    return cls(**kwargs)


def _labels_from_json(bad: list, at: str, raw: object) -> list[Label] | None:
    if not isinstance(raw, list):
        bad.append(FieldViolation(at, "must be a list of labels"))
        return None
    out = []
    for j, item in enumerate(raw):
        if isinstance(item, str):
            out.append(Label(item))
        elif isinstance(item, Mapping) and set(item) <= {"name", "description"}:
            out.append(Label(item.get("name", ""), item.get("description", "")))
        else:
            bad.append(FieldViolation(f"{at}[{j}]", 'must be a string or {"name", "description"}'))
            return None
    return out
