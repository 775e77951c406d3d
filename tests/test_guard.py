"""The guard refuses every kind of row no forward pass wrote, and only those."""

import numpy as np
import pytest

from decider.engines.base import Branch, NodeLogits, ScoreJob
from decider.errors import EngineNoLogits
from decider.guard import LogitsGuard

SENTINEL = float(np.finfo(np.float32).min)


def job(prefix=(2, 10, 11)):
    return ScoreJob(prefix, (Branch((20, 21), ((5,), (7,))),))


def row(values, lse=12.5):
    return [[(NodeLogits((), (5, 7), np.asarray(values, np.float32), lse),)]]


def fresh(rng, n=2):
    return rng.normal(0, 4, n).astype(np.float32)


def test_a_written_row_passes(rng):
    LogitsGuard(SENTINEL).check([job()], row(fresh(rng)))


@pytest.mark.parametrize(
    "values, lse, tell",
    [
        ([SENTINEL, 1.0], 12.5, "sentinel"),
        ([0.0, 0.0], 12.5, "all zeros"),
        ([np.nan, 1.0], 12.5, "non-finite"),
        ([np.inf, 1.0], 12.5, "non-finite"),
        ([1.0, 2.0], float("nan"), "non-finite"),
    ],
)
def test_unwritten_rows_are_refused(values, lse, tell):
    with pytest.raises(EngineNoLogits, match=tell) as info:
        LogitsGuard(SENTINEL).check([job()], row(values, lse))
    assert info.value.reason == "ENGINE_RETURNED_NO_LOGITS"
    assert "the engine returned no logits" in str(info.value)


@pytest.mark.parametrize("values, tell", [
    ([SENTINEL], "sentinel"), ([0.0], "all zeros"), ([np.inf], "non-finite"), ([], "all zeros")])
def test_one_unwritten_row_among_a_calls_many_is_refused(rng, values, tell):
    """A call's rows are checked together: rows of 1 to 5 labels for 6 jobs, one of them
    (drawn) unwritten; every other row passes, and so does the call without it."""
    jobs = [job((2, 30 + i)) for i in range(6)]
    rows = [[tuple(NodeLogits((k,), (5, 7), fresh(rng, int(rng.integers(1, 6))), 12.5 + i)
                   for k in range(3))] for i in range(6)]
    LogitsGuard(SENTINEL).check(jobs, rows)
    i, k = rng.integers(6), rng.integers(3)
    node = rows[i][0][k]
    logits = node.logits.copy()
    logits[:len(values)] = values
    if not values:
        logits = logits[:0]
    if values == [0.0]:
        logits[:] = 0
    rows[i][0] = (*rows[i][0][:k], NodeLogits(node.path, node.token_ids, logits, 12.5),
                  *rows[i][0][k + 1:])
    with pytest.raises(EngineNoLogits, match=tell):
        LogitsGuard(SENTINEL).check(jobs, rows)


def test_the_previous_pass_row_for_another_prompt_is_stale(rng):
    guard = LogitsGuard(SENTINEL)
    values = fresh(rng)
    guard.check([job((2, 10, 11))], row(values))
    with pytest.raises(EngineNoLogits, match="previous pass"):
        guard.check([job((2, 10, 12))], row(values))


def test_the_same_prompt_may_give_the_same_row_again(rng):
    guard = LogitsGuard(SENTINEL)
    values = fresh(rng)
    guard.check([job()], row(values))
    guard.check([job()], row(values))


def test_the_previous_pass_row_read_for_other_labels_is_stale(rng):
    """A stale buffer read for another question's labels shows other label logits; its
    full-vocabulary logsumexp, summed in float64 (the llama engine's), is still the
    previous pass's, to the bit."""
    lse = 13.25 + 1e-9  # no float32 holds it
    guard = LogitsGuard(SENTINEL)
    guard.check([job((2, 10, 11))], row(fresh(rng), lse=lse))
    other = ScoreJob((2, 10, 11), (Branch((20, 22), ((5,), (7,), (9,))),))
    stale = [[(NodeLogits((), (5, 7, 9), fresh(rng, 3), lse),)]]
    with pytest.raises(EngineNoLogits, match="previous pass"):
        guard.check([other], stale)


def test_float32_logsumexps_of_two_prompts_may_meet_by_chance(rng):
    """A float32 logsumexp (the Triton and reference engines') has 24 bits: in a daemon
    under load, calls of 128 rows after calls of 128 met one another's by chance and the
    engine was restarted. Two calls of 128 rows whose logsumexps come from 8 values
    pass while their label logits differ; the same rows again, with the same logits
    and other prompts, are stale."""
    def call(prefix0: int, logits: list) -> tuple[list, list]:
        jobs = [job((2, prefix0 + i)) for i in range(128)]
        rows = [[(NodeLogits((), (5, 7), values, float(np.float32(20 + i % 8 / 1024))),)]
                for i, values in enumerate(logits)]
        return jobs, rows

    guard = LogitsGuard(SENTINEL)
    first = [fresh(rng) for _ in range(128)]
    guard.check(*call(1000, first))
    guard.check(*call(2000, [fresh(rng) for _ in range(128)]))
    guard.check(*call(3000, first))  # the first call's rows, after another: not stale
    with pytest.raises(EngineNoLogits, match="previous pass"):
        guard.check(*call(4000, first))


def test_a_job_stopped_before_its_end_has_no_rows_to_check(rng):
    stopped = TimeoutError("past its deadline")
    LogitsGuard(SENTINEL).check([job(), job((2, 12))], [stopped, row(fresh(rng))[0]])
    with pytest.raises(EngineNoLogits, match="sentinel"):
        LogitsGuard(SENTINEL).check([job(), job((2, 12))], [stopped, row([SENTINEL, 1.0])[0]])
