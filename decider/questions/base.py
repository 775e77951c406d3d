"""What every question type shares: labels, the limits a request is held to, the field
checks, and the two base classes. A type is one class (and its answer class) in a module
of its own that says everything that differs for it: its fields and their checks, the
branches it asks the model (prompt suffix, competing answers), how it reads its answer
from the branches' probabilities, and its JSON and protobuf fields. The rest of decider
asks a question, never which type it holds; `question_type` registers one by name."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, ClassVar

from ..errors import FieldViolation, Path

if TYPE_CHECKING:
    from ..prompts import BranchPlan, PromptFormat


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
    # the engine work one request may need (Engine.work_tokens), checked after
    # tokenizing: keeps one request from holding the engine for minutes
    max_work_tokens: int = 16384


@dataclass(frozen=True, slots=True)
class Label:
    name: str
    description: str = ""

    @classmethod
    def of(cls, value: Label | str) -> Label:
        return value if isinstance(value, Label) else cls(value)


@dataclass(frozen=True, slots=True)
class Scored:
    """One branch of a question, read: each competing answer's probability (they sum to
    1) and the label mass at its answer position."""

    probabilities: dict[str, float]
    label_mass: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    """A typed answer (its own fields: `question`, the verdict, `label_mass`). Every one
    reports label_mass: the share of the full-vocabulary probability at the answer position
    that fell on the label tokens (low: the model is not answering in label space, whatever
    the normalised probabilities say). The fields below are every type's: whether its
    probabilities passed through a calibration (then `raw` is the same answer from the
    model's own probabilities), and whether it abstained and why (decider/trust.py)."""

    type: ClassVar[str]
    calibrated: bool = False
    raw: Answer | None = None
    abstained: bool = False
    abstain_reason: str = ""

    def to_dict(self) -> dict:
        """Its own fields, then every type's: `raw` holds the uncalibrated answer's own."""
        own = _json_shaped(asdict(self))
        trust = {name: own.pop(name) for name in TRUST_FIELDS}
        trust["raw"] = self.raw and {k: v for k, v in self.raw.to_dict().items()
                                     if k not in ("type", "question", *TRUST_FIELDS)}
        return {"type": self.type, **own, **trust}

    def text(self) -> str:
        """The answer as the CLI prints it: the question, then the verdict."""
        said = f"{self.question}\n  {self.verdict()}"
        if self.calibrated:
            said += f"\n  uncalibrated: {self.raw.verdict()}"
        return said + (f"\n  abstains: {self.abstain_reason}" if self.abstained else "")

    def verdict(self) -> str:
        raise NotImplementedError

    def proto_fields(self) -> dict:
        """The fields of this type's message in decider.v1's Answer."""
        raise NotImplementedError

    @classmethod
    def from_proto(cls, question: str, label_mass: float, fields) -> Answer:
        raise NotImplementedError


@dataclass(frozen=True, slots=True, kw_only=True)
class Question:
    """A typed question: subclasses are frozen dataclasses with `question` first. Every one
    may set when its answer abstains: a confidence (the calibrated probability of the answer
    given) below `abstain_below`, or a label mass below `min_label_mass`; unset, a
    calibration's values hold (decider/trust.py)."""

    type: ClassVar[str]  # its name in JSON, and its field in decider.v1's Question
    answer_type: ClassVar[type[Answer]]
    abstain_below: float | None = None
    min_label_mass: float | None = None

    def violations(self, at: Path, limits: Limits) -> Iterator[FieldViolation]:
        """Every fault of its own fields (`at` is its path in the request)."""
        yield from check_chars(at + ("question",), self.question, limits.max_question_chars,
                               required=True)
        for name in ABSTAIN_FIELDS:
            if getattr(self, name) is not None:
                yield from check_threshold(at + (name,), getattr(self, name))

    def options(self) -> tuple[str, tuple[Label, ...]]:
        """The field of the labels it chooses among, and them (none for yes/no)."""
        return "labels", ()

    def branches(self, fmt: PromptFormat) -> list[BranchPlan]:
        """The continuations of the text's prefix it needs, each ending at an answer
        position, and the answers competing there."""
        raise NotImplementedError

    def answer(self, scored: Sequence[Scored]) -> Answer:
        """Its answer from its branches' probabilities, in the order of branches()."""
        raise NotImplementedError

    def expected(self, gold: object) -> tuple[str, ...]:
        """The answer each branch gives when `gold` (a labelled example's answer, as JSON
        gives it) is right; ValueError saying what `gold` should be."""
        raise NotImplementedError

    def fields(self) -> dict:
        """Its own fields, JSON-shaped: the request's JSON and decider.v1's message."""
        raise NotImplementedError

    @classmethod
    def from_fields(cls, question: str, fields: Mapping, at: Path,
                    bad: list[FieldViolation]) -> Question | None:
        """From JSON, with each malformed field added to `bad` (None if unusable)."""
        raise NotImplementedError

    @classmethod
    def from_proto(cls, question: str, fields) -> Question:
        """From its message in decider.v1's Question."""
        raise NotImplementedError


TRUST_FIELDS = ("calibrated", "raw", "abstained", "abstain_reason")  # every answer's
ABSTAIN_FIELDS = ("abstain_below", "min_label_mass")  # every type's, in JSON and protobuf
QUESTION_TYPES: dict[str, type[Question]] = {}
ANSWER_TYPES: dict[str, type[Answer]] = {}


def question_type(cls: type[Question]) -> type[Question]:
    """Register a question type (a class decorator): its name then reads from JSON and,
    where decider.v1 has a field of that name, from protobuf."""
    QUESTION_TYPES[cls.type] = cls
    ANSWER_TYPES[cls.type] = cls.answer_type
    return cls


def _json_shaped(value):
    if isinstance(value, (tuple, list)):
        return [_json_shaped(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_shaped(v) for k, v in value.items()}
    return value


# -- field checks -------------------------------------------------------------------------


def _utf8_ok(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: undecodable bytes from argv or a file
        return False
    return True


def check_text(at: Path, value: object, max_bytes: int) -> Iterator[FieldViolation]:
    """A required text, bounded in UTF-8 bytes."""
    if not isinstance(value, str):
        yield FieldViolation(at, "must be a string")
    elif not _utf8_ok(value):
        yield FieldViolation(at, "is not valid UTF-8")
    elif not value.strip():
        yield FieldViolation(at, "must not be empty")
    elif len(value.encode("utf-8")) > max_bytes:
        size = len(value.encode("utf-8"))
        yield FieldViolation(at, f"is {size} bytes, over the limit of {max_bytes}")


def check_chars(at: Path, value: object, max_chars: int, required: bool = False,
                one_line: bool = False) -> Iterator[FieldViolation]:
    if not isinstance(value, str):
        yield FieldViolation(at, "must be a string")
    elif not _utf8_ok(value):
        yield FieldViolation(at, "is not valid UTF-8")
    elif required and not value.strip():
        yield FieldViolation(at, "must not be empty")
    elif len(value) > max_chars:
        yield FieldViolation(at, f"is {len(value)} characters, over the limit of {max_chars}")
    elif one_line and ("\n" in value or "\r" in value):
        yield FieldViolation(at, "must be a single line")


def check_threshold(at: Path, value: object) -> Iterator[FieldViolation]:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool)
            and 0.0 <= value <= 1.0):
        yield FieldViolation(at, f"must be a number in [0, 1], got {value!r}")


def check_options(at: Path, labels: tuple[Label, ...], fewest: int,
                  limits: Limits) -> Iterator[FieldViolation]:
    """A list of labels: how many, each name and description, no name twice."""
    if len(labels) < fewest:
        yield FieldViolation(at, f"needs at least {fewest}, got {len(labels)}")
    if len(labels) > limits.max_labels:
        yield FieldViolation(at, f"{len(labels)} given, over the limit of {limits.max_labels}")
        return
    seen: dict[str, str] = {}
    for j, label in enumerate(labels):
        yield from check_chars(at + (j,), label.name, limits.max_label_chars, required=True,
                               one_line=True)
        yield from check_chars(at + (j, "description"), label.description,
                               limits.max_description_chars, one_line=True)
        if isinstance(label.name, str):
            key = label.name.strip().casefold()  # "Yes" and "yes" pool into one answer
            if key in seen:
                yield FieldViolation(at + (j,), f"duplicates {seen[key]!r} (names are "
                                                "compared without case)")
            seen.setdefault(key, label.name)


def labels_from_json(at: Path, raw: object, bad: list[FieldViolation]) -> list[Label] | None:
    """Labels given as names or {"name", "description"} objects."""
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
            bad.append(FieldViolation(at + (j,), 'must be a string or {"name", "description"}'))
            return None
    return out


def one_of(gold: object, labels: tuple[Label, ...]) -> str:
    """A gold answer naming one of the labels (compared without case, as answers pool)."""
    names = {label.name.strip().casefold(): label.name for label in labels}
    if not isinstance(gold, str) or gold.strip().casefold() not in names:
        raise ValueError(f"the gold answer must be one of {[x.name for x in labels]}, "
                         f"got {gold!r}")
    return names[gold.strip().casefold()]


def labels_to_json(labels: tuple[Label, ...]) -> list[dict]:
    return [{"name": x.name, "description": x.description} for x in labels]


def labels_from_proto(items) -> list[Label]:
    return [Label(x.name, x.description) for x in items]
