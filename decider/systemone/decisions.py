"""OpenAI's Decisions API (POST /v1/decisions) to decider's requests, and decider's answers
back (docs/systemone.md, "The Decisions API"): the input is the state (text as it is;
messages one after another, each part's text, JSON as System One renders it); each
question is asked as its class says (decisions_schema.py: predicate a yes/no, choice a
choice over its values, score a scale over its level indices, as System One's score);
answers come back in question order. A refusal is OpenAI's 400 naming the parameter."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import ValidationError

from ..answers import Outcome
from ..errors import DeciderError, FieldViolation, InvalidRequest
from ..questions import Request
from .decisions_schema import (
    DecisionRequest,
    DecisionResponse,
    DecisionUsage,
    ImagePart,
    InputDetails,
    JsonPart,
    Reader,
)
from .render import content_text

IMAGES = "images are not supported: this server reads text"


class BadDecision(InvalidRequest):
    """A refused Decisions request: OpenAI's param is the first violation's place."""

    def __init__(self, violations: list[FieldViolation]) -> None:
        super().__init__(violations)
        self.param = violations[0].field if violations else None


def parse(raw: bytes | str | Mapping) -> DecisionRequest:
    try:
        if isinstance(raw, Mapping):
            return DecisionRequest.model_validate(raw)
        return DecisionRequest.model_validate_json(raw)
    except ValidationError as e:
        raise BadDecision([FieldViolation(tuple(x["loc"]) or ("body",), x["msg"])
                           for x in e.errors(include_url=False, include_input=False)]
                          ) from None


def _text(content, at: tuple) -> str:
    """A message's content or a question's instructions as prompt text."""
    if isinstance(content, str):
        return content
    out = []
    for j, part in enumerate(content):
        if isinstance(part, ImagePart):
            raise BadDecision([FieldViolation((*at, j), IMAGES)])
        out.append(content_text(part.data) if isinstance(part, JsonPart) else part.text)
    return "\n".join(out)


def state_text(body: DecisionRequest) -> str:
    """Text as it is; messages one after another, each after its role when roles differ."""
    if isinstance(body.input, str):
        return body.input
    texts = [(m.role, _text(m.content, ("input", i, "content")))
             for i, m in enumerate(body.input)]
    if len({role for role, _ in texts}) == 1:
        return "\n\n".join(text for _, text in texts)
    return "\n\n".join(f"{role}: {text}" for role, text in texts)


@dataclass(frozen=True, slots=True)
class Decided:
    """A Decisions request as decider's Request, and how to read its answers back."""

    request: Request
    readers: tuple[Reader, ...]

    def response(self, outcome: Outcome) -> DecisionResponse:
        d = outcome.decision
        tokens = d.usage.prompt_tokens
        return DecisionResponse(
            model=d.model,
            answers=[read(a) for read, a in zip(self.readers, d.answers, strict=True)],
            usage=DecisionUsage(input_tokens=tokens, total_tokens=tokens,
                                input_tokens_details=InputDetails(
                                    cached_tokens=d.usage.cached_tokens)),
            x_decider=outcome.provenance())


def to_decider(body: DecisionRequest) -> Decided:
    asked = [q.ask(_text(q.instructions, ("questions", i, "instructions")))
             for i, q in enumerate(body.questions)]
    return Decided(Request(state_text(body), tuple(q for q, _ in asked)),
                   tuple(read for _, read in asked))


# decider's fields of a question, by this API's names
_FIELDS = {"question": "instructions", "labels": "choices", "levels": "levels"}


def refused(error: DeciderError) -> DeciderError:
    """decider's refusal of a request, its fields named as this API names them."""
    if not error.violations:
        return error
    named = []
    for v in error.violations:
        path = v.path
        if path[:1] == ("text",):
            path = ("input",)
        elif path[:1] == ("questions",) and len(path) > 2:
            path = (*path[:2], _FIELDS.get(path[2], path[2]), *path[3:])
        named.append(FieldViolation(path, v.description))
    return BadDecision(named)
