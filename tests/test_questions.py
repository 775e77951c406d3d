"""Request validation: every bad field is named with its limit."""

import pytest

from decider.errors import InvalidRequest
from decider.questions import (
    Choice,
    Label,
    MultiLabel,
    Request,
    Scale,
    YesNo,
    request_from_dict,
)


def violations(request: Request) -> dict[str, str]:
    with pytest.raises(InvalidRequest) as info:
        request.validate()
    return {v.field: v.description for v in info.value.violations}


def test_a_good_request_validates_to_itself():
    r = Request("some text", (YesNo("ok?"), Choice("which?", ["a", Label("b", "the b")])))
    assert r.validate() is r
    assert r.questions[1].labels == (Label("a"), Label("b", "the b"))


@pytest.mark.parametrize(
    "request_, field, words",
    [
        (Request(" \n", (YesNo("q?"),)), "text", "must not be empty"),
        (Request("t", ()), "questions", "at least one question"),
        (Request("t", (YesNo(""),)), "questions[0].question", "must not be empty"),
        (Request("t", (Choice("q", ["a", "A"]),)), "questions[0].labels[1]", "duplicates"),
        (Request("t", (Choice("q", ["a", " "]),)), "questions[0].labels[1]", "must not be empty"),
        (Request("t", (Choice("q", ["a"]),)), "questions[0].labels", "at least 2, got 1"),
        (Request("t", (Scale("q", ["low"]),)), "questions[0].levels", "at least 2, got 1"),
        (Request("t", (MultiLabel("q", []),)), "questions[0].labels", "at least 1, got 0"),
        (Request("t", (Choice("q", [f"l{i}" for i in range(257)]),)), "questions[0].labels",
         "257 given, over the limit of 256"),
        (Request("t", (MultiLabel("q", ["a"], threshold=1.5),)), "questions[0].threshold",
         "in [0, 1], got 1.5"),
        (Request("t", (YesNo("q", threshold=-0.1),)), "questions[0].threshold", "in [0, 1]"),
        (Request("x" * 262145, (YesNo("q"),)), "text", "262145 bytes, over the limit of 262144"),
        (Request("t", (YesNo("q"),) * 33), "questions", "33 questions, over the limit of 32"),
        (Request("bad \udcff", (YesNo("q"),)), "text", "not valid UTF-8"),
        (Request("t", (Choice("q", ["a\nb", "c"]),)), "questions[0].labels[0]", "single line"),
        (Request("t", (YesNo("q"),), instructions="i" * 8001), "instructions",
         "8001 characters, over the limit of 8000"),
    ],
)
def test_each_bad_field_is_named_with_its_limit(request_, field, words):
    found = violations(request_)
    assert field in found, found
    assert words in found[field]


def test_all_violations_are_reported_at_once():
    found = violations(Request("", (YesNo(""), Choice("q", ["a"]))))
    assert set(found) == {"text", "questions[0].question", "questions[1].labels"}


def test_request_from_dict_builds_every_type():
    r = request_from_dict({
        "text": "t",
        "instructions": "be brief",
        "questions": [
            {"question": "yes?"},
            {"type": "choice", "question": "which?",
             "labels": ["a", {"name": "b", "description": "B"}]},
            {"type": "multi_label", "question": "any?", "labels": ["x"], "threshold": 0.3},
            {"type": "scale", "question": "how much?", "levels": ["low", "high"]},
        ],
    })
    assert [q.type for q in r.questions] == ["yes_no", "choice", "multi_label", "scale"]
    assert r.questions[1].labels[1] == Label("b", "B")
    assert r.questions[2].threshold == 0.3


@pytest.mark.parametrize(
    "data, field",
    [
        ([], "request"),
        ({"text": "t", "questions": "no"}, "questions"),
        ({"text": "t", "questions": [{"type": "poll", "question": "q"}]}, "questions[0].type"),
        ({"text": "t", "questions": [{"question": "q", "labels": ["a"]}]}, "questions[0].labels"),
        ({"text": "t", "questions": [{"type": "choice", "question": "q", "labels": [3, "b"]}]},
         "questions[0].labels[0]"),
        ({"text": "t", "questions": [{"question": "q"}], "colour": "red"}, "colour"),
        ({"text": 5, "questions": [{"question": "q"}]}, "text"),
    ],
)
def test_request_from_dict_names_the_bad_field(data, field):
    with pytest.raises(InvalidRequest) as info:
        request_from_dict(data)
    assert field in {v.field for v in info.value.violations}


def test_every_bad_field_is_named_at_once_the_text_beside_the_questions():
    with pytest.raises(InvalidRequest) as info:
        request_from_dict({"text": 5, "questions": "x"})
    assert [v.field for v in info.value.violations] == ["text", "questions"]
