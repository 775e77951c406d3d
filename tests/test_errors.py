"""Every error decider raises has one gRPC code and one HTTP status, and crosses from the
engine process to a front end (typed messages, or pickled) as it was raised."""

from __future__ import annotations

import pickle

import pytest

from decider import errors
from decider.http.errors import STATUS
from decider.service.convert import CODES


def every_error() -> list[type[errors.DeciderError]]:
    found, todo = [], [errors.DeciderError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


@pytest.mark.parametrize("cls", every_error(), ids=lambda c: c.__name__)
def test_each_error_kind_has_a_grpc_code_and_an_http_status(cls):
    assert cls.kind in CODES and cls.kind in STATUS


def test_an_error_pickled_across_processes_keeps_its_type_reason_and_details():
    raised = [errors.WorkTooLarge(20000, 16384), errors.EngineDied(-9),
              errors.Cancelled("the caller went away"), errors.ServerStopping(30),
              errors.InvalidRequest([errors.FieldViolation("text", "must not be empty")])]
    for error in raised:
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is type(error)
        assert (again.reason, again.message, again.metadata) == (
            error.reason, error.message, error.metadata)
    assert again.violations == raised[-1].violations


def test_an_error_sent_to_a_front_end_keeps_its_type_reason_and_details():
    """As the engine loop refuses a request: through the typed messages."""
    from decider.service import messages

    raised = [errors.WorkTooLarge(20000, 16384), errors.PromptTooLong(9000, 8192),
              errors.InvalidRequest([errors.FieldViolation(("questions", 0, "labels", 1),
                                                           "must not be empty")])]
    sent = messages.encode([messages.Refused(i, messages.WireError.of(e))
                            for i, e in enumerate(raised)])
    for error, refused in zip(raised, messages.from_engine(sent), strict=True):
        again = refused.error.error()
        assert type(again) is type(error)
        assert (again.reason, again.message, again.metadata, again.violations) == (
            error.reason, error.message, error.metadata, error.violations)
    assert again.violations[0].field == "questions[0].labels[1]"
    assert (again.kind, raised[1].prompt_tokens) == ("invalid", 9000)
