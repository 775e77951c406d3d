"""System One requests to decider's, and decider's answers back (docs/systemone.md): the
body parsed against the schema, the model asked for resolved, the fields decider does not
know set aside, each question asked as one of decider's (questions.py), and every field
decider refuses reported at its System One place, FastAPI style.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import ValidationError

from ..answers import Outcome
from ..errors import FieldViolation, InvalidRequest, ModelNotFound
from ..questions import Request
from .questions import Slot, ask
from .render import JSON_ERROR, content_text, is_empty, non_finite
from .schema import NoulCriteria, Provenance, SystemOneRequest, SystemOneResponse, Usage

IMAGES_REFUSED = ("images are not supported: this server reads text; send the state as "
                  "text or JSON, without assets")


class BadBody(InvalidRequest):
    """The body is not a valid System One request; `errors` are FastAPI-style field errors
    (the violations name the same fields, dotted, for the CLI and the Python API)."""

    def __init__(self, errors: list[dict]) -> None:
        self.errors = errors
        super().__init__([FieldViolation(".".join(map(str, e["loc"])), e["msg"]) for e in errors])


def field_error(loc: tuple, msg: str, kind: str = "value_error", **ctx) -> dict:
    return {"loc": ["body", *loc], "msg": msg, "type": kind, **({"ctx": ctx} if ctx else {})}


def parse_body(raw: bytes | str | Mapping) -> SystemOneRequest:
    """Validate a request body (JSON text, or data already parsed) against the schema."""
    try:
        if isinstance(raw, Mapping):
            return SystemOneRequest.model_validate(raw)
        return SystemOneRequest.model_validate_json(raw)
    except ValidationError as e:
        raise BadBody([field_error(tuple(x["loc"]), x["msg"], x["type"], **_plain(x.get("ctx")))
                       for x in e.errors(include_url=False, include_input=False)]) from None


def _plain(ctx: dict | None) -> dict:
    ok = (str, int, float, bool, type(None))
    return {k: v if isinstance(v, ok) else str(v) for k, v in (ctx or {}).items()}


VENDOR_MODELS = ("jev-", "gpt-6-luna")  # TypeSafe's and OpenAI's decision models


def model_asked(name: str | None, vendor_names: bool = True) -> str:
    """The model a request names, for the front end to check ("": the served one, when
    none is named or, with vendor_names, the vendors' own: jev-latest, jev-*,
    gpt-6-luna). OpenRouter's forms name the same model: `provider/name`,
    `~provider/name`."""
    if name is None:
        return ""
    bare = name.removeprefix("~").rpartition("/")[2]
    return "" if vendor_names and bare.startswith(VENDOR_MODELS) else bare


def ignored_fields(body: SystemOneRequest) -> list[str]:
    """The places of the fields decider does not know (ignored, as the published API
    ignores them): "x_trace_id", "questions.topic.seed", ..."""
    places = [("", body)] + [(f"questions.{k}", q) for k, q in body.questions.items()]
    places += [(f"questions.{k}.criteria", q.criteria) for k, q in body.questions.items()
               if isinstance(q.criteria, NoulCriteria)]
    return [f"{where}.{field}" if where else field for where, model in places
            for field in (model.model_extra or ())]


def legacy_names(doc: dict) -> dict:
    """A response's JSON with decider 0.1's names beside the x_ ones (deprecated, [http]
    legacy_names): label_mass in each answer, decider at the top."""
    answers = {k: {**a, "label_mass": a["x_label_mass"]} for k, a in doc["answers"].items()}
    return {**doc, "answers": answers, "decider": doc["x_decider"]}


@dataclass(frozen=True, slots=True)
class Asked:
    """A System One request as decider's Request, and how to read its answers back."""

    request: Request
    slots: tuple[Slot, ...]

    def response(self, outcome: Outcome) -> SystemOneResponse:
        d = outcome.decision
        return SystemOneResponse(
            model=d.model,
            answers={s.key: s.read(a) for s, a in zip(self.slots, d.answers, strict=True)},
            usage=Usage(input_tokens=d.usage.prompt_tokens, output_tokens=0),
            x_decider=Provenance(**outcome.provenance()))

    def bad_body(self, error: InvalidRequest) -> BadBody:
        return BadBody([self._locate(v) for v in error.violations])

    def _locate(self, v: FieldViolation) -> dict:
        """decider's path of a field as System One's place: the text is the state, a
        question's labels its criteria, named as the request names them."""
        path, msg = v.path, v.description
        if path[:1] == ("text",):
            return field_error(("state",), msg)
        if path[:1] != ("questions",) or len(path) < 2:
            return field_error(("questions",), msg)
        slot, rest = self.slots[path[1]], path[2:]
        if not rest:
            return field_error(slot.loc, msg)
        if rest[0] in ("question", "threshold"):
            return field_error((*slot.loc, "instructions" if rest[0] == "question"
                                else "threshold"), msg)
        if len(rest) == 1:  # the labels as a whole
            return field_error((*slot.loc, "criteria"), msg)
        what = "the description " if rest[2:] == ("description",) else "the name "
        return field_error((*slot.loc, "criteria", slot.option_locs[rest[1]]), what + msg)


def to_decider(body: SystemOneRequest) -> Asked:
    """decider's request for a System One request; BadBody for what JSON allows and System
    One does not (an empty state, NaN). The request itself is validated where every
    request is, when it is planned: `Asked.bad_body` names its faults at their places."""
    bad = []
    if body.assets:
        bad.append(field_error(("assets",), IMAGES_REFUSED, "images_unsupported"))
    if is_empty(body.state) or non_finite(body.state):
        bad.append(field_error(("state",), JSON_ERROR if non_finite(body.state)
                               else "must not be empty"))
    questions, slots = [], []
    for key, q in body.questions.items():
        c = q.criteria
        if non_finite((q.instructions, (c.true, c.false) if isinstance(c, NoulCriteria) else c)):
            bad.append(field_error(("questions", key, q.type), JSON_ERROR))
        question, slot = ask(key, q)
        questions.append(question)
        slots.append(slot)
    if bad:
        raise BadBody(bad)
    return Asked(Request(content_text(body.state), tuple(questions)), tuple(slots))


def answer_here(decider, raw: bytes | str | Mapping) -> SystemOneResponse:
    """A System One request answered by an in-process Decider (the Python API and the CLI):
    the same validation, prompts and answers as over HTTP, with no queue."""
    body = parse_body(raw)
    if model_asked(body.model) not in ("", decider.entry.name):
        raise ModelNotFound(f"model {body.model!r} is not loaded here; this is "
                            f"{decider.entry.name!r}", model=body.model)
    asked = to_decider(body)
    t0 = time.perf_counter()
    try:
        decision = decider.decide_request(asked.request)
    except InvalidRequest as e:
        raise asked.bad_body(e) from None
    return asked.response(Outcome(decision, 0.0, 1000 * (time.perf_counter() - t0),
                                  decider.model_sha256, decider.template_version))
