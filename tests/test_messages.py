"""Every message between the daemon's processes comes out of its decoder as it went into
the encoder (decider/service/messages.py), on generated values: the label logits bit for
bit, NaN, infinities and the engines' sentinel included."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from decider.engines import EngineInfo, ScoreJob
from decider.engines.base import Branch, ChatTemplate, NodeLogits
from decider.errors import EngineFailure, FieldViolation, InvalidRequest, QueueFull
from decider.questions import Limits
from decider.service import messages
from decider.service.messages import (
    Answered,
    Cancel,
    Down,
    Failed,
    Listening,
    ModelFacts,
    Ping,
    Ready,
    Refused,
    Score,
    Serve,
    Stop,
    WireError,
)

text = st.text(max_size=20)
times = st.floats(allow_nan=False)
tokens = st.lists(st.integers(0, 2**31 - 1), max_size=6).map(tuple)
some_tokens = st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=6).map(tuple)
branches = st.lists(st.builds(Branch, some_tokens, st.lists(some_tokens, min_size=1,
                                                            max_size=3).map(tuple)),
                    min_size=1, max_size=4).map(tuple)
jobs = st.builds(lambda prefix, bs: ScoreJob(prefix, bs, (len(bs),)), some_tokens, branches)
logits = st.lists(st.floats(width=32), max_size=8).map(lambda v: np.array(v, np.float32))
nodes = st.builds(NodeLogits, tokens, tokens, logits, st.none() | times)
errors = st.one_of(
    st.builds(EngineFailure, text),
    st.builds(lambda m, n: QueueFull(m, max_queue=n), text, st.integers(0, 10**6)),
    st.builds(lambda p, d: InvalidRequest([FieldViolation(("questions", 0, p), d)]), text, text))
wire_errors = errors.map(WireError.of)
facts = st.builds(
    ModelFacts, text, text, text, text,
    st.builds(EngineInfo, text, text, st.integers(1, 2**20), st.integers(1, 2**20),
              st.integers(1, 2**20), st.integers(0, 2**20), text,
              st.dictionaries(text, st.integers(0, 2**40), max_size=3), st.none() | times,
              st.booleans(), st.none() | st.builds(ChatTemplate, text, text, text)),
    text, text, text, st.none() | st.dictionaries(text, st.integers(-2**63, 2**63 - 1), max_size=3))
limits = st.builds(Limits, *[st.integers(1, 2**30)] * 8)

engine_bound = st.lists(st.builds(Score, st.integers(0, 2**62), times, times, jobs)
                        | st.builds(Cancel, st.integers(0, 2**62)), min_size=1, max_size=4)
engine_sent = st.lists(
    st.builds(Answered, st.integers(0, 2**62), st.lists(st.lists(nodes, max_size=3).map(tuple),
                                                        max_size=3), times, times,
              st.integers(0, 2**31))
    | st.builds(Refused, st.integers(0, 2**62), wire_errors), min_size=1, max_size=4)


def plain(value):
    """A message as comparable values: arrays by their bytes, NaN included."""
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.tobytes())
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "__struct_fields__") or hasattr(value, "__dataclass_fields__"):
        names = getattr(value, "__struct_fields__", None)
        names = value.__dataclass_fields__ if names is None else names  # () for Stop
        return (type(value).__name__, [plain(getattr(value, n)) for n in names])
    return value


@settings(max_examples=60)
@given(engine_bound)
def test_the_front_ends_messages_to_the_engine_round_trip(sent):
    assert plain(messages.to_engine(messages.encode(sent))) == plain(sent)


@settings(max_examples=60)
@given(engine_sent)
def test_the_engines_answers_round_trip_bit_for_bit(sent):
    got = messages.from_engine(messages.encode(sent))
    assert plain(got) == plain(sent)


@settings(max_examples=60)
@given(st.builds(Ready, facts) | st.builds(Failed, wire_errors) | st.just(Ping())
       | st.just(Stop()))
def test_the_engine_process_pipe_round_trips(sent):
    assert plain(messages.control(messages.encode(sent))) == plain(sent)


@settings(max_examples=60)
@given(st.builds(Serve, facts, text, limits) | st.builds(Down, wire_errors) | st.just(Stop()))
def test_the_front_end_worker_pipe_round_trips(sent):
    assert plain(messages.to_worker(messages.encode(sent))) == plain(sent)


def test_a_front_end_worker_says_it_listens():
    assert messages.from_worker(messages.encode(Listening())) == Listening()


@settings(max_examples=60)
@given(errors)
def test_an_error_is_rebuilt_as_the_same_error(error):
    got = WireError.of(error).error()
    assert type(got) is type(error) and got.message == error.message
    assert got.metadata == error.metadata and got.violations == error.violations
