"""From raw trie logits to label probabilities.

Rule (docs/design.md, "Scoring"):
- Each answer is spelled in a few surface forms (" yes", " Yes"); every form is a
  token sequence, a candidate.
- A candidate's log-probability is the sum, along its tokens, of the log-softmax over
  the tokens the label set allows at that step (the label trie). Only label rows of the
  output head are needed, and long labels are not penalised against short ones.
- A candidate that is a token-prefix of another gets the answer terminator appended, so
  stopping and continuing compete at that step.
- An answer's probability is the sum over its surface forms (pooling). The candidates'
  probabilities sum to 1, so the answers' do too.
- Label mass: the full-vocabulary probability at the answer position that fell on the
  allowed first tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from decider.engines.base import BranchResult, Tokens


@dataclass(frozen=True, slots=True)
class Candidates:
    sequences: tuple[Tokens, ...]
    owner: tuple[int, ...]  # answer index of each sequence


def build_candidates(
    forms: Sequence[Sequence[str]], tokenize: Callable[[str], list[int]], end: Tokens
) -> Candidates:
    """Token sequences for each answer's surface forms; none a prefix of another."""
    seqs: dict[Tokens, int] = {}
    for owner, answer_forms in enumerate(forms):
        for form in answer_forms:
            toks = tuple(tokenize(form))
            if toks and toks not in seqs:  # a form shared by two answers stays the first's
                seqs[toks] = owner
    keys = list(seqs)
    ended: dict[Tokens, int] = {}
    for toks in keys:
        is_prefix = any(len(o) > len(toks) and o[: len(toks)] == toks for o in keys)
        ended[toks + end if is_prefix else toks] = seqs[toks]
    return Candidates(tuple(ended), tuple(ended.values()))


def logsumexp(values: Sequence[float]) -> float:
    m = max(values)
    return m if m == -math.inf else m + math.log(math.fsum(math.exp(v - m) for v in values))


# The rows are a few label tokens long: numpy's cost per call outweighs the math on them.
def _log_softmax(x: np.ndarray) -> list[float]:
    v = x.tolist()  # float32 -> float64
    lse = logsumexp(v)
    return [a - lse for a in v]


def answer_log_probs(cands: Candidates, result: BranchResult, n_answers: int) -> list[float]:
    """log P(answer) for each answer of one branch, pooled over its surface forms."""
    steps = {node.path: dict(zip(node.token_ids, _log_softmax(node.logits)))
             for node in result}
    per_answer: list[list[float]] = [[] for _ in range(n_answers)]
    for seq, owner in zip(cands.sequences, cands.owner):
        per_answer[owner].append(math.fsum(steps[seq[:k]][seq[k]] for k in range(len(seq))))
    return [logsumexp(lps) if lps else -math.inf for lps in per_answer]


def label_mass(result: BranchResult) -> float:
    root = next(node for node in result if node.path == ())
    if root.logsumexp is None:
        return 0.0
    return math.fsum(math.exp(v - root.logsumexp) for v in root.logits.tolist())
