"""The work bound: a request's engine work (Engine.work_tokens: the loaded engine's
layout, in tokens of a long decode) is known before any compute and refused past
Limits.max_work_tokens, naming the limit; the real gemma-3-270m on the llama.cpp
engine."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decider import Choice, Limits, MultiLabel, Request
from decider.engines import Branch, ScoreJob, label_trie, load_engine
from decider.engines.base import DECODE_TOKENS, OUTPUT_TOKENS
from decider.engines.passes import tree_size
from decider.errors import WorkTooLarge
from decider.plan import check_work

TEXT = "I was charged twice for my order, please refund me."


@pytest.mark.parametrize("questions", [
    [Choice(f"Topic {q}?", [f"topic {i}" for i in range(256)]) for q in range(32)],
    [MultiLabel(f"Which {q}?", [f"label {i}" for i in range(256)]) for q in range(32)],
])
def test_a_request_that_would_hold_the_engine_for_minutes_is_refused_before_any_pass(
        decider, fault_file, questions):
    fault_file.write_text("oom")  # a pass that began would fail with OOM instead
    with pytest.raises(WorkTooLarge) as info:
        decider.decide(TEXT, questions)
    e = info.value
    assert int(e.metadata["work_tokens"]) > int(e.metadata["max_work_tokens"]) == 16384
    assert "max_work_tokens" in e.message and "--max-work-tokens" in e.message
    assert e.kind == "out_of_range"
    assert fault_file.exists()  # no engine pass began
    fault_file.unlink()


def test_the_bound_is_the_callers_to_set(decider):
    request = Request(TEXT, (Choice("Topic?", ["billing", "shipping", "other"]),))
    work = decider.engine.work_tokens(decider.plan(request).job)
    tight = Limits(max_work_tokens=work - 1)
    saved = decider.limits
    try:
        decider.limits = tight
        with pytest.raises(WorkTooLarge, match=f"needs {work} tokens .* limit of {work - 1}"):
            decider.decide_request(request)
        decider.limits = Limits(max_work_tokens=work)
        assert decider.decide_request(request).answers[0].label in ("billing", "shipping",
                                                                     "other")
    finally:
        decider.limits = saved


def test_llama_places_each_suffix_once_and_counts_each_decode(model_path):
    """The prefix is decoded alone; then each question's decodes hold at most n_parallel
    (4) label paths: 9 two-token labels take three groups, the later two starting from a
    copy of the sequence that holds the suffix. The measure: tokens, rows of logits (the
    answer position and the 9 first label tokens) and the fixed cost of each decode."""
    engine = load_engine("llama", model_path, 2048, n_parallel=4)
    try:
        suffix = tuple(range(10, 30))
        job = ScoreJob((2, 5, 6), (Branch(suffix, tuple((100 + i, 7) for i in range(9))),))
        assert len(label_trie(job.branches[0].candidates)) == 10  # the answer position + 9
        rows = 1 + 9
        assert engine.work_tokens(job) == (3 + len(suffix) + 9 + rows * OUTPUT_TOKENS
                                           + 4 * DECODE_TOKENS)
        two = ScoreJob((2, 5, 6), (Branch(suffix, ((7, 8), (7, 9))),
                                   Branch(suffix[:5], ((4,),))))
        tokens = 3 + len(suffix) + 1 + 5 + 3 * OUTPUT_TOKENS
        assert engine.work_tokens(two) == tokens + 3 * DECODE_TOKENS  # a decode a branch
        one = ScoreJob(two.prefix, two.branches, questions=(2,))
        assert engine.work_tokens(one) == tokens + 2 * DECODE_TOKENS  # one question, one group
    finally:
        engine.close()


def test_the_cli_flag_sets_the_bound(run_cli):
    out = run_cli("run", "gemma-3-270m", TEXT, "-q", "Refund?", "--max-work-tokens", "10")
    assert out.returncode == 1 and out.stdout == b""
    assert "WORK_TOO_LARGE" in out.stderr.decode() and "limit of 10" in out.stderr.decode()


def _tokens(lo: int, hi: int):
    return st.lists(st.integers(1000, 1004), min_size=lo, max_size=hi).map(tuple)


@st.composite
def _jobs(draw) -> ScoreJob:
    """Jobs of shared label prefixes (few token values), so the tries branch and llama.cpp's
    decodes split into groups."""
    branches = []
    for _ in range(draw(st.integers(1, 4))):
        labels = draw(st.lists(_tokens(1, 4), min_size=1, max_size=12, unique=True))
        labels = [c for c in labels if not any(o != c and o[:len(c)] == c for o in labels)]
        branches.append(Branch(draw(_tokens(1, 20)), tuple(labels)))
    return ScoreJob((2, *draw(_tokens(0, 60))), tuple(branches))


@settings(max_examples=300, deadline=None)
@given(job=_jobs(), limit=st.integers(1, 600), alone=st.booleans())
def test_the_work_ceiling_lets_no_job_over_the_bound_through(decider, job, limit, alone):
    """check_work skips the layout when the job's work ceiling is within the bound: the
    ceiling is above what llama.cpp's layouts (shared, and alone where no prefix fits
    the room) and the torch engine's token tree count, so the outcome is the exact
    count's either way."""
    engine = decider.engine
    room = engine.room
    engine.room = 0 if alone else room
    try:
        work = engine.work_tokens(job)
        assert max(work, tree_size(job)) <= job.work_ceiling()
        if work > limit:
            with pytest.raises(WorkTooLarge, match=f"needs {work} tokens .* limit of {limit}"):
                check_work(engine, job, Limits(max_work_tokens=limit))
        else:
            check_work(engine, job, Limits(max_work_tokens=limit))
    finally:
        engine.room = room
