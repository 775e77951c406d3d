"""Conversions between decider's types and the decider.v1 protobuf messages, and the one
mapping from DeciderError to a gRPC status with google.rpc details."""

from __future__ import annotations

from dataclasses import replace

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from .. import __version__
from ..answers import Decision, Outcome, Usage
from ..errors import DeciderError, FieldViolation, InvalidRequest
from ..questions import ANSWER_TYPES, QUESTION_TYPES, Answer, Question, Request
from ..questions.base import ABSTAIN_FIELDS
from ..v1 import decider_pb2 as pb

DOMAIN = "decider.v1"
CODES = {
    "invalid": grpc.StatusCode.INVALID_ARGUMENT,
    "not_found": grpc.StatusCode.NOT_FOUND,
    "out_of_range": grpc.StatusCode.OUT_OF_RANGE,
    "exhausted": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "unavailable": grpc.StatusCode.UNAVAILABLE,
    "deadline": grpc.StatusCode.DEADLINE_EXCEEDED,
    "cancelled": grpc.StatusCode.CANCELLED,
    "internal": grpc.StatusCode.INTERNAL,
}


# -- requests and answers: each type's message is the field named for it -----------------


def question_from_proto(q: pb.Question, at: tuple) -> Question:
    kind = q.WhichOneof("kind")
    if kind is None:
        raise InvalidRequest([FieldViolation(at + ("kind",), "set one of "
                                             f"{', '.join(QUESTION_TYPES)}")])
    question = QUESTION_TYPES[kind].from_proto(q.question, getattr(q, kind))
    return replace(question, **{name: getattr(q, name) for name in ABSTAIN_FIELDS
                                if q.HasField(name)})


def request_from_proto(req: pb.DecideRequest) -> Request:
    questions = tuple(question_from_proto(q, ("questions", i))
                      for i, q in enumerate(req.questions))
    return Request(req.text, questions, req.instructions)


def request_to_proto(request: Request, model: str = "") -> pb.DecideRequest:
    return pb.DecideRequest(model=model, text=request.text, instructions=request.instructions,
                            questions=[{"question": q.question, q.type: q.fields(),
                                        **_set(q, ABSTAIN_FIELDS)}
                                       for q in request.questions])


def _set(value, names: tuple[str, ...]) -> dict:
    return {name: getattr(value, name) for name in names if getattr(value, name) is not None}


def answer_to_proto(a: Answer) -> pb.Answer:
    return pb.Answer(question=a.question, label_mass=a.label_mass,
                     **{a.type: a.proto_fields()}, calibrated=a.calibrated,
                     raw=a.raw and answer_to_proto(a.raw), abstained=a.abstained,
                     abstain_reason=a.abstain_reason)


def answer_from_proto(a: pb.Answer) -> Answer:
    kind = a.WhichOneof("kind")
    answer = ANSWER_TYPES[kind].from_proto(a.question, a.label_mass, getattr(a, kind))
    return replace(answer, calibrated=a.calibrated,
                   raw=answer_from_proto(a.raw) if a.HasField("raw") else None,
                   abstained=a.abstained, abstain_reason=a.abstain_reason)


def response_to_proto(outcome: Outcome) -> pb.DecideResponse:
    """A DecideResponse from a front end's Outcome: answers, usage, timings, provenance."""
    d = outcome.decision
    return pb.DecideResponse(
        answers=[answer_to_proto(a) for a in d.answers],
        usage=pb.Usage(prompt_tokens=d.usage.prompt_tokens, window_tokens=d.usage.window_tokens,
                       cached_tokens=d.usage.cached_tokens),
        timings=pb.Timings(queue_ms=outcome.queue_ms, compute_ms=outcome.compute_ms),
        provenance=pb.Provenance(decider_version=__version__, engine=d.engine, model=d.model,
                                 model_sha256=outcome.model_sha256,
                                 template_version=outcome.template_version))


def decision_from_proto(r: pb.DecideResponse) -> Decision:
    return Decision(
        tuple(answer_from_proto(a) for a in r.answers),
        r.provenance.model,
        r.provenance.engine,
        Usage(r.usage.prompt_tokens, r.usage.window_tokens, r.usage.cached_tokens),
    )


# -- errors ------------------------------------------------------------------------------


def error_status(error: DeciderError) -> status_pb2.Status:
    """google.rpc.Status for an error: ErrorInfo always, BadRequest for bad fields."""
    code = CODES[error.kind]
    details = [error_details_pb2.ErrorInfo(reason=error.reason, domain=DOMAIN,
                                           metadata=error.metadata)]
    if isinstance(error, InvalidRequest):
        details.append(error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=v.field, description=v.description)
            for v in error.violations]))
    packed = []
    for d in details:
        a = any_pb2.Any()
        a.Pack(d)
        packed.append(a)
    return status_pb2.Status(code=code.value[0], message=error.message, details=packed)


def internal_status() -> status_pb2.Status:
    """What a client gets for a failure decider did not foresee: no details of it."""
    return error_status(DeciderError("internal error; the server logged it"))


def item_error(error: DeciderError) -> pb.ItemError:
    return pb.ItemError(code=CODES[error.kind].value[0], reason=error.reason,
                        message=error.message, metadata=error.metadata)

