"""Random yes/no score jobs on the tiny models, and p_yes of one engine held against
another's (the GPU tests)."""

from __future__ import annotations

import numpy as np

from decider.engines import Branch, ScoreJob

from .tiny import VOCAB, WINDOW

P_TOL = 0.02  # the GPU bound on p_yes: fp16 activations (the default), fp32 head
NEAR_TIE = 0.1


def jobs(rng, n: int) -> list[ScoreJob]:
    out = []
    for _ in range(n):
        length = int(rng.integers(4, 3 * WINDOW + 5))
        ids = [int(t) for t in rng.integers(3, VOCAB, length + 6)]
        yes, no = (int(t) for t in rng.choice(np.arange(3, VOCAB), 2, replace=False))
        out.append(ScoreJob((2, *ids[:length]), (Branch(tuple(ids[length:]), ((yes,), (no,))),)))
    return out


def p_yes(job: ScoreJob, result) -> float:
    """Softmax over the two labels at the answer position; the first label is yes."""
    [[root]] = result
    p = np.exp(root.logits.astype(np.float64) - root.logits.max())
    return float(p[root.token_ids.index(job.branches[0].candidates[0][0])] / p.sum())


def assert_p_yes_close(engine, reference, rng, tol: float = P_TOL, n: int = 30) -> None:
    """n fresh prompts in one call: p_yes within tol, the same decision away from a tie."""
    batch = jobs(rng, n)
    worst = 0.0
    for j, g, r in zip(batch, engine.score(batch), reference.score(batch), strict=True):
        pg, pr = p_yes(j, g), p_yes(j, r)
        worst = max(worst, abs(pg - pr))
        if abs(pr - 0.5) >= NEAR_TIE:
            assert (pg >= 0.5) == (pr >= 0.5)
    assert worst <= tol, worst
