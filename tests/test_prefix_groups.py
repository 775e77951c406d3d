"""Requests of one engine call that share a prefix become one job, and each gets its own
branches' results back (decider/prefix_groups.py): generated calls, then the real model
in-process (the daemon's side: tests/test_engine_process.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from decider.engines import Branch, JobResult, NodeLogits, ScoreJob
from decider.prefix_groups import group_by_prefix
from decider.questions import Choice, Request, YesNo

PREFIXES = ((2, 10), (2, 10, 11), (2, 12))  # three prefixes, one extending another


@st.composite
def calls(draw) -> list[ScoreJob]:
    """Jobs of 1-3 branches over the three prefixes, with or without question counts."""
    jobs = []
    for _ in range(draw(st.integers(1, 12))):
        n = draw(st.integers(1, 3))
        branches = tuple(Branch((draw(st.integers(20, 99)),), ((5,), (6,))) for _ in range(n))
        questions = draw(st.sampled_from([(), (n,), (1,) * n]))
        jobs.append(ScoreJob(draw(st.sampled_from(PREFIXES)), branches, questions))
    return jobs


def answered(job: ScoreJob) -> JobResult:
    """A stand-in engine's result: each branch's one node carries its suffix token."""
    return JobResult([(NodeLogits((), (5, 6), b.suffix),) for b in job.branches], 7)


@given(calls())
def test_each_prefix_is_one_job_and_each_request_gets_its_own_branches(jobs):
    groups = group_by_prefix(jobs)
    assert [g.job.prefix for g in groups] == list(dict.fromkeys(j.prefix for j in jobs))
    assert sorted(i for g in groups for i in g.members) == list(range(len(jobs)))
    for g in groups:
        assert [len(u) for u in g.job.units()] == [
            len(u) for i in g.members for u in jobs[i].units()]  # questions kept apart
        for i, result in zip(g.members, g.split(answered(g.job)), strict=True):
            assert jobs[i].prefix == g.job.prefix
            assert [nodes[0].logits for nodes in result] == [b.suffix for b in jobs[i].branches]
            assert result.cached_tokens == 7


def test_a_prefix_alone_is_its_job_unchanged():
    job = ScoreJob((2, 10), (Branch((30,), ((5,), (6,))),))
    [group] = group_by_prefix([job])
    assert group.job is job and group.split(answered(job))[0] == answered(job)


def test_one_decide_many_reads_a_shared_text_once_and_answers_as_alone(decider, monkeypatch):
    """Three requests about one text and one about another, in one decide_many: the engine
    gets two jobs, and every answer is the one its request gets alone, bit for bit."""
    text = "I was charged twice for my order and nobody answers my emails."
    asked = [YesNo("Is a refund requested?"), YesNo("Is the customer angry?"),
             Choice("What is it about?", ["billing", "shipping", "login"])]
    requests = [Request(text, (q,)) for q in asked] + [
        Request("The parcel never arrived.", (asked[0],))]
    alone = [decider.decide_request(r) for r in requests]
    calls, score = [], decider.engine.score
    monkeypatch.setattr(decider.engine, "score",
                        lambda jobs, stop=None: calls.append(len(jobs)) or score(jobs, stop))
    together = decider.decide_many(requests)
    assert calls == [2]
    assert [d.answers for d in together] == [d.answers for d in alone]
