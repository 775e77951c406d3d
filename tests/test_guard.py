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
    full-vocabulary logsumexp is still the previous pass's, to the bit."""
    guard = LogitsGuard(SENTINEL)
    guard.check([job((2, 10, 11))], row(fresh(rng), lse=13.25))
    other = ScoreJob((2, 10, 11), (Branch((20, 22), ((5,), (7,), (9,))),))
    stale = [[(NodeLogits((), (5, 7, 9), fresh(rng, 3), 13.25),)]]
    with pytest.raises(EngineNoLogits, match="previous pass"):
        guard.check([other], stale)


def test_a_job_stopped_before_its_end_has_no_rows_to_check(rng):
    stopped = TimeoutError("past its deadline")
    LogitsGuard(SENTINEL).check([job(), job((2, 12))], [stopped, row(fresh(rng))[0]])
    with pytest.raises(EngineNoLogits, match="sentinel"):
        LogitsGuard(SENTINEL).check([job(), job((2, 12))], [stopped, row([SENTINEL, 1.0])[0]])
