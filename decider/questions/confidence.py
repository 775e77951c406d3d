"""How sure an answer over several options is, as the System One clients compute it
(TypeSafe's reference adapter, `system-one-adapter`, confidence_metrics.py; its
documentation: "all of it on one option gives 1.0; the more evenly it spreads, the lower
the confidence"). One meaning of confidence across decider: these two, on choices and on
scales; a yes/no answer has none (its p_yes says it all).
"""

from __future__ import annotations

from collections.abc import Sequence


def peak(ps: Sequence[float]) -> float:
    """A choice's: the top probability m scaled from uniform (0) to certain (1),
    (n*m - 1) / (n - 1) over n options; 1 for one option."""
    n, total = len(ps), sum(ps)
    if n < 2:
        return 1.0
    m = max(ps) / total if total > 0 else 1 / n
    return min(1.0, max(0.0, (n * m - 1) / (n - 1)))


def concentration(ps: Sequence[float]) -> float:
    """A scale's: how close the probability sits to the modal level, 1 - spread / D, the
    spread sum(p_i * |i - mode|) and D the same spread of a uniform distribution; 1 for
    one level."""
    n, total = len(ps), sum(ps)
    if n < 2:
        return 1.0
    p = [x / total for x in ps] if total > 0 else [1 / n] * n
    mode = max(range(n), key=p.__getitem__)
    spread = sum(pi * abs(i - mode) for i, pi in enumerate(p))
    uniform = sum(abs(i - (n - 1) / 2) for i in range(n)) / n
    return max(0.0, 1.0 - spread / uniform)
