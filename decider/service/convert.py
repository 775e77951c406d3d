"""Conversions between decider's types and the decider.v1 protobuf messages, and the one
mapping from DeciderError to a gRPC status with google.rpc details."""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from .. import __version__
from ..answers import (
    Answer,
    ChoiceAnswer,
    Decision,
    LabelDecision,
    MultiLabelAnswer,
    ScaleAnswer,
    Usage,
    YesNoAnswer,
)
from ..errors import DeciderError, FieldViolation, InvalidRequest
from ..prompts import TEMPLATE_VERSION
from ..questions import Choice, Label, MultiLabel, Question, Request, Scale, YesNo
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


# -- requests ----------------------------------------------------------------------------


def _labels(items) -> list[Label]:
    return [Label(x.name, x.description) for x in items]


def _threshold(msg) -> float:
    return msg.threshold if msg.HasField("threshold") else 0.5


def question_from_proto(q: pb.Question, at: str) -> Question:
    kind = q.WhichOneof("kind")
    if kind == "choice":
        return Choice(q.question, _labels(q.choice.labels))
    if kind == "multi_label":
        return MultiLabel(q.question, _labels(q.multi_label.labels), _threshold(q.multi_label))
    if kind == "scale":
        return Scale(q.question, _labels(q.scale.levels))
    if kind == "yes_no":
        return YesNo(q.question, _threshold(q.yes_no))
    raise InvalidRequest([FieldViolation(f"{at}.kind", "set one of yes_no, choice, "
                                                       "multi_label, scale")])


def request_from_proto(req: pb.DecideRequest) -> Request:
    questions = tuple(question_from_proto(q, f"questions[{i}]")
                      for i, q in enumerate(req.questions))
    return Request(req.text, questions, req.instructions)


def request_to_proto(request: Request, model: str = "") -> pb.DecideRequest:
    def labels(items):
        return [pb.Label(name=x.name, description=x.description) for x in items]

    out = pb.DecideRequest(model=model, text=request.text, instructions=request.instructions)
    for q in request.questions:
        msg = out.questions.add(question=q.question)
        if isinstance(q, YesNo):
            msg.yes_no.threshold = q.threshold
        elif isinstance(q, Choice):
            msg.choice.labels.extend(labels(q.labels))
        elif isinstance(q, MultiLabel):
            msg.multi_label.labels.extend(labels(q.labels))
            msg.multi_label.threshold = q.threshold
        else:
            msg.scale.levels.extend(labels(q.levels))
    return out


# -- answers -----------------------------------------------------------------------------


def _probs(d: dict[str, float]) -> list[pb.LabelProbability]:
    return [pb.LabelProbability(label=k, p=v) for k, v in d.items()]


def answer_to_proto(a: Answer) -> pb.Answer:
    out = pb.Answer(question=a.question, label_mass=a.label_mass)
    if isinstance(a, YesNoAnswer):
        out.yes_no.CopyFrom(pb.YesNoAnswer(p_yes=a.p_yes, decision=a.decision,
                                           threshold=a.threshold))
    elif isinstance(a, ChoiceAnswer):
        out.choice.CopyFrom(pb.ChoiceAnswer(label=a.label, confidence=a.confidence,
                                            probabilities=_probs(a.probabilities)))
    elif isinstance(a, MultiLabelAnswer):
        out.multi_label.CopyFrom(pb.MultiLabelAnswer(
            labels=[pb.LabelDecision(label=d.label, p=d.p, chosen=d.chosen,
                                     label_mass=d.label_mass) for d in a.labels],
            chosen=list(a.chosen), threshold=a.threshold))
    else:
        out.scale.CopyFrom(pb.ScaleAnswer(level=a.level, expected_index=a.expected_index,
                                          probabilities=_probs(a.probabilities)))
    return out


def answer_from_proto(a: pb.Answer) -> Answer:
    kind = a.WhichOneof("kind")
    if kind == "yes_no":
        m = a.yes_no
        return YesNoAnswer(a.question, m.p_yes, m.decision, m.threshold, a.label_mass)
    if kind == "choice":
        m = a.choice
        return ChoiceAnswer(a.question, m.label, m.confidence,
                            {p.label: p.p for p in m.probabilities}, a.label_mass)
    if kind == "multi_label":
        m = a.multi_label
        return MultiLabelAnswer(
            a.question,
            tuple(LabelDecision(d.label, d.p, d.chosen, d.label_mass) for d in m.labels),
            tuple(m.chosen), m.threshold, a.label_mass)
    m = a.scale
    return ScaleAnswer(a.question, m.level, m.expected_index,
                       {p.label: p.p for p in m.probabilities}, a.label_mass)


def response_to_proto(outcome) -> pb.DecideResponse:
    """A DecideResponse from a front end's Outcome: answers, usage, timings, provenance."""
    d = outcome.decision
    return pb.DecideResponse(
        answers=[answer_to_proto(a) for a in d.answers],
        usage=pb.Usage(prompt_tokens=d.usage.prompt_tokens, window_tokens=d.usage.window_tokens),
        timings=pb.Timings(queue_ms=outcome.queue_ms, compute_ms=outcome.compute_ms),
        provenance=pb.Provenance(decider_version=__version__, engine=d.engine, model=d.model,
                                 model_sha256=outcome.model_sha256,
                                 template_version=TEMPLATE_VERSION))


def decision_from_proto(r: pb.DecideResponse) -> Decision:
    return Decision(
        tuple(answer_from_proto(a) for a in r.answers),
        r.provenance.model,
        r.provenance.engine,
        Usage(r.usage.prompt_tokens, r.usage.window_tokens),
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

