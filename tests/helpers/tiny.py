"""Tiny random Gemma 3 models' shapes, random token ids and branches for them, and the
comparison of two engines' results on them."""

from __future__ import annotations

import numpy as np

from decider.engines import Branch

VOCAB, WINDOW = 384, 16  # the tiny models' vocabulary and sliding window
# fp32 in both engines, different summation orders (packed dequant + matmul, cached
# prefix, token trees) against transformers' full forwards: up to 6e-6 measured on
# logits up to ~11, so 1e-3 leaves a wide margin while a real bug (a wrong mask, rope or
# norm) moves logits by 1e-1 or more.
TOL = 1e-3


def rand_ids(rng, n):
    return tuple(int(t) for t in rng.integers(3, VOCAB, n))


def rand_branch(rng, suffix_len):
    """A suffix and labels that share first tokens (a trie several levels deep)."""
    a, b, c = rand_ids(rng, 3)
    return Branch(rand_ids(rng, suffix_len), ((a,), (b, c), (b, a, c), (c, b)))


def max_diff(got, want) -> float:
    """Largest difference of logits and logsumexps; the tries must be identical."""
    worst = 0.0
    for gb, wb in zip(got, want, strict=True):
        for gn, wn in zip(gb, wb, strict=True):
            assert (gn.path, gn.token_ids) == (wn.path, wn.token_ids)
            assert gn.logits.dtype == np.float32 and np.all(np.isfinite(gn.logits))
            worst = max(worst, float(np.abs(gn.logits - wn.logits).max()))
            if gn.path == ():
                worst = max(worst, abs(gn.logsumexp - wn.logsumexp))
            else:
                assert gn.logsumexp is None
            assert np.argmax(gn.logits) == np.argmax(wn.logits) or np.sort(wn.logits)[-1] - \
                np.sort(wn.logits)[-2] < TOL  # same decision at every node, barring ties
    return worst
