"""The fixed prompt set on which an engine's p_yes is held against another's on the real
gemma-3-270m (the CPU path in test_triton_engine_real.py, the GPU in tests/gpu), and the
issue's bounds for it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from decider import Decider, Request, YesNo

# The bounds for p_yes, Triton against llama.cpp over a fixed set of prompts
# (llama.cpp's Q4_K_M arithmetic against fp32 was measured at median 0.017, p95 0.049,
# max 0.067 over 60 prompts of 65-599 tokens); decisions must agree this far from 0.5
P95_TOL, MAX_TOL, CLEAR = 0.06, 0.1, 0.1
POOL = ("the a customer order parcel refund late broken screen price paid twice delivery "
        "support email account password login error charge card bank").split()


def words(rng: np.random.Generator, n: int) -> str:
    return " ".join(rng.choice(POOL, n))


def fixed_requests() -> list[Request]:
    """36 requests of about 65 to 600 tokens: a seeded text and one of six questions each,
    the same every run."""
    rng = np.random.default_rng(20261130)
    questions = ["Is the customer unhappy?", "Is a refund requested?", "Was the parcel late?",
                 "Is the screen broken?", "Was the card charged twice?",
                 "Is this about a login problem?"]
    return [Request(words(rng, int(n)), (YesNo(questions[i % 6]),))
            for i, n in enumerate(np.linspace(45, 560, 36))]


def p_yes(decider: Decider, requests: list[Request], alone: bool) -> list[float]:
    """Each request's p_yes: one engine call each, or all in one."""
    decisions = ([decider.decide_request(r) for r in requests] if alone
                 else decider.decide_many(requests))
    return [d.answers[0].p_yes for d in decisions]


def p_yes_gaps(ours: Sequence[float], theirs: Sequence[float]) -> np.ndarray:
    """|p_yes gap| per request, after checking that the two agree on every decision that
    is at least CLEAR from 0.5 in ours."""
    for p, q in zip(ours, theirs, strict=True):
        if abs(p - 0.5) >= CLEAR:
            assert (p >= 0.5) == (q >= 0.5), (p, q)
    return np.abs(np.array(ours) - np.array(theirs))


def assert_within_llama_bounds(gaps: np.ndarray) -> None:
    """The issue's bounds on |p_yes gap| against llama.cpp over the fixed prompt set."""
    assert np.percentile(gaps, 95) <= P95_TOL and gaps.max() <= MAX_TOL, gaps
