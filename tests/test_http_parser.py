"""A property of the HTTP body parser (decider.systemone.mapping): on any bytes or JSON value it
either returns a request decider accepts or refuses with field errors, each naming its
place under "body", never anything else. The seed is printed; HYPOTHESIS_SEED=N replays."""

from __future__ import annotations

import json
import os
import random

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from decider.errors import InvalidRequest
from decider.questions import Limits
from decider.systemone.mapping import BadBody, parse_body, to_decider

SEED = int(os.environ.get("HYPOTHESIS_SEED", random.randrange(2**32)))
LIMITS = Limits()

scalars = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
           | st.sampled_from(["", " ", "\ud800", "yes", "a\nb", "x" * 300, "`state.a`"]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)
content = st.text(max_size=30) | st.dictionaries(st.text(max_size=6), values, max_size=3) \
    | st.lists(values, max_size=3)
criteria = (st.dictionaries(st.text(max_size=8), content | st.none(), max_size=6)
            | st.lists(content, max_size=12) | values)
names = st.text(st.characters(codec="utf-8", exclude_categories=["Cc", "Zl", "Zp"]),
                min_size=1, max_size=10)
words = st.text(st.characters(codec="utf-8"), min_size=1, max_size=30)
good_question = st.one_of(
    st.fixed_dictionaries({"type": st.just("noul"), "instructions": words | content},
                          optional={"criteria": st.fixed_dictionaries(
                              {}, optional={"true": words | st.none(), "false": words})}),
    st.fixed_dictionaries({"type": st.just("choice"), "criteria": st.dictionaries(
        names, words | st.none(), min_size=1, max_size=6)}, optional={"instructions": words}),
    st.fixed_dictionaries({"type": st.just("score"), "criteria": st.lists(
        words | content, min_size=1, max_size=10)}, optional={"instructions": content}),
    st.fixed_dictionaries({"type": st.sampled_from(["x_multi_label", "decider.multi_label"]),
                           "criteria": st.dictionaries(
        names, st.none(), min_size=1, max_size=4)}, optional={
        "threshold": st.floats(0, 1)}))
good_body = st.fixed_dictionaries({
    "model": st.just("m"), "state": words | st.dictionaries(names, values, min_size=1),
    "questions": st.dictionaries(names, good_question, min_size=1, max_size=3)})
question = st.fixed_dictionaries(
    {"type": st.sampled_from(["noul", "choice", "score", "x_multi_label",
                              "decider.multi_label", "box", "x"])},
    optional={"instructions": content | values, "criteria": criteria,
              "threshold": st.floats() | values, "thresholds": values, "other": values})
wild_body = st.fixed_dictionaries({}, optional={
    "model": st.just("m") | values, "state": content | values,
    "questions": st.dictionaries(st.text(max_size=8), question | values, max_size=4) | values,
    "assets": values})
body = good_body | wild_body | st.tuples(good_body, st.sampled_from(
    ["model", "state", "questions"]), values).map(lambda t: {**t[0], t[1]: t[2]})


def encodings(data: dict) -> st.SearchStrategy[bytes]:
    raw = json.dumps(data, allow_nan=True).encode("utf-8", "surrogatepass")
    flips = st.lists(st.tuples(st.integers(0, max(len(raw) - 1, 0)), st.integers(0, 255)),
                     max_size=3)
    return st.just(raw) | flips.map(lambda fs: bytes(
        b if i not in dict(fs) else dict(fs)[i] for i, b in enumerate(raw))) \
        | st.integers(0, len(raw)).map(lambda n: raw[:n])


def check(raw) -> None:
    try:
        parsed = parse_body(raw)
        asked = to_decider(parsed)
        try:
            asked.request.validate(LIMITS)  # where every request is: when it is planned
        except InvalidRequest as e:
            raise asked.bad_body(e) from None
    except BadBody as e:
        assert e.errors
        for err in e.errors:
            assert err["loc"] and err["loc"][0] == "body", err
            assert all(isinstance(p, (str, int)) for p in err["loc"]), err
            assert isinstance(err["msg"], str) and err["msg"] and err["type"], err
            json.dumps(err)  # goes out as JSON
        return
    assert [s.key for s in asked.slots] == list(parsed.questions)
    assert to_decider(parse_body(raw)).request == asked.request  # deterministic


@seed(SEED)
@settings(max_examples=400, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_body_is_a_request_or_field_errors_under_body(data):
    print(f"hypothesis seed: {SEED} (HYPOTHESIS_SEED={SEED} replays it)")
    value = data.draw(body)
    check(data.draw(encodings(value)))
    check(value)  # the Python API's path: data already parsed
    check(data.draw(st.binary(max_size=64)))
