"""The one guard between an engine's raw rows and an answer.

A failed pass can leave the output buffer as it was: the sentinel the engine poisoned it
with, zeros from allocation, or the previous pass's values. Softmax would turn any of
them into a plausible-looking answer, so each is refused here:
- a logit equal to the engine's sentinel;
- a non-finite logit or logsumexp;
- all selected logits exactly zero;
- an answer-position row whose full-vocabulary logsumexp is, to the bit, one of the
  previous pass's for a different prompt (the label logits alone would not do: a stale
  row read for other labels shows other values), and where that logsumexp has only
  float32's 24 bits, whose label logits are the previous row's too (_fingerprint).
  Identical prompts legitimately give identical rows, so only a different prompt makes
  it a tell.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from decider.engines.base import BranchResult, Engine, JobResult, NodeLogits, ScoreJob, Stop

from .errors import ActivationOverflow, EngineNoLogits


class LogitsGuard:
    def __init__(self, sentinel: float | None) -> None:
        self._sentinel = sentinel
        self._previous: dict[bytes, int] = {}  # answer-row fingerprint -> prompt hash

    def check(self, jobs: Sequence[ScoreJob],
              results: Sequence[Sequence[BranchResult] | Exception]) -> None:
        """Raise EngineNoLogits on the first row no forward pass can have written (a job
        stopped before its end has no rows)."""
        current: dict[bytes, int] = {}
        try:
            self._check_rows([node for branches in results
                              if not isinstance(branches, Exception)
                              for branch in branches for node in branch])
            for job, branches in zip(jobs, results, strict=True):
                if isinstance(branches, Exception):
                    continue
                for branch, nodes in zip(job.branches, branches, strict=True):
                    key = _fingerprint(nodes[0])
                    prompt = hash((job.prefix, branch.suffix))
                    if self._previous.get(key, prompt) != prompt:
                        raise EngineNoLogits("the row is the previous pass's, left unwritten")
                    current[key] = prompt
        finally:
            self._previous = current

    def _check_rows(self, nodes: Sequence[NodeLogits]) -> None:
        """Every row of a call at once: numpy's cost per call (~3 us) outweighs the
        checks on rows of a few labels, 9 us a request when asked row by row (a call of
        one job pays ~1 us more this way, docs/experiments.md)."""
        if not nodes:
            return
        lengths = [len(node.logits) for node in nodes]
        if min(lengths) == 0:
            raise EngineNoLogits("the row is all zeros across the label tokens")
        flat = np.concatenate([node.logits for node in nodes])
        if self._sentinel is not None and (flat == self._sentinel).any():
            raise EngineNoLogits("the row still holds the sentinel written before the pass")
        lses = [node.logsumexp for node in nodes if node.logsumexp is not None]
        if not np.isfinite(flat).all() or not all(map(math.isfinite, lses)):
            raise EngineNoLogits("the row holds a non-finite value")
        if not np.logical_or.reduceat(flat != 0, np.cumsum([0, *lengths[:-1]])).all():
            raise EngineNoLogits("the row is all zeros across the label tokens")


def _fingerprint(root: NodeLogits) -> bytes:
    """What identifies an answer row from one pass to the next. A logsumexp summed in
    float64 over the whole row (the llama engine's) is its row's alone, and tells a stale
    row read for other labels. One computed in float32 (the Triton and reference
    engines') has 24 bits: two prompts' collide about once in 10^6 pairs, and a call of
    128 rows after another makes 16,384 pairs (a daemon under load restarted its engine
    on such a match); there the label logits must match too, as a stale buffer's do."""
    lse = root.logsumexp
    if lse is None:
        return root.logits.tobytes()
    if float(np.float32(lse)) != lse:
        return np.float64(lse).tobytes()
    return np.float64(lse).tobytes() + root.logits.tobytes()


def guarded_score(engine: Engine, guard: LogitsGuard, jobs: Sequence[ScoreJob],
                  stop: Stop | None = None) -> list[JobResult | Exception]:
    """One engine call for the jobs, its rows checked by the guard; a job that `stop`
    ended has its error as its result. So does a job whose activations overflow: when a
    call of several overflows, its jobs are scored again one by one, so only the job at
    fault is refused."""
    try:
        results = engine.score(jobs, stop)
        guard.check(jobs, results)
        return results
    except ActivationOverflow as e:
        if len(jobs) == 1:
            return [e]
    return [guarded_score(engine, guard, [job], stop and (lambda _, i=i: stop(i)))[0]
            for i, job in enumerate(jobs)]
