"""llama.cpp's output rows, read so that a row the last decode did not write is caught:
before each decode the rows the previous one wrote are overwritten with a sentinel no
forward pass produces, and a row llama.cpp has no pointer for reads as the sentinel too.
The guard (decider/guard.py) refuses any sentinel it finds among the label logits."""

from __future__ import annotations

import llama_cpp as ll
import numpy as np

from .base import SENTINEL


class OutputRows:
    """The output rows of one llama.cpp context with a vocabulary of n_vocab tokens."""

    def __init__(self, ctx, n_vocab: int) -> None:
        self._ctx = ctx
        self._n_vocab = n_vocab
        self.written = 0  # rows the last decode wrote: poisoned before the next one

    def poison(self) -> None:
        """Write the sentinel over the rows the last decode produced, so a decode that
        leaves them alone is caught. (The buffer can move inside llama_decode; a fresh
        one holds zeros or old memory, which the guard's other tells cover.)"""
        base = ll.llama_get_logits(self._ctx) if self.written else None
        if base:
            rows = np.ctypeslib.as_array(base, shape=(self.written * self._n_vocab,))
            rows.fill(SENTINEL)

    def row(self, i: int) -> np.ndarray:
        """The logits of batch token i, as llama.cpp maps it to its output buffer."""
        ptr = ll.llama_get_logits_ith(self._ctx, i)
        if not ptr:  # llama.cpp has no output row i: report it as unwritten
            return np.full(self._n_vocab, SENTINEL, dtype=np.float32)
        return np.ctypeslib.as_array(ptr, shape=(self._n_vocab,))

    def previous(self, j: int) -> np.ndarray:
        """Output row j as the previous decode left it (the stale-logits fault)."""
        base = ll.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(base, shape=((j + 1) * self._n_vocab,))[j * self._n_vocab:]


def logsumexp(row: np.ndarray) -> float:
    """In float32 with a float64 sum (8x faster than all in float64 over 262,144 logits).
    A NaN anywhere gives NaN, a +inf gives inf: the guard refuses both."""
    m = row.max()  # NaN if any is; -inf only if all are
    if not np.isfinite(m):
        return float("inf") if m == np.inf else float("nan")
    return float(m) + float(np.log(np.exp(row - m).sum(dtype=np.float64)))
