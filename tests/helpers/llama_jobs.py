"""Random llama.cpp jobs over a tiny model's vocabulary, for the layout and cache tests."""

from __future__ import annotations

from decider.engines import Branch, ScoreJob


def random_job(rng, prefix_len: int, questions: int, window_tokens: int | None = None,
               suffix: tuple[int, int] = (3, 12), vocab: int = 600) -> ScoreJob:
    """A prefix of prefix_len tokens and `questions` branches of suffix[0] to suffix[1]
    tokens; the last two branches' labels are multi-token and share first tokens.
    window_tokens: cut the prefix so the longest branch ends exactly at that many. Token
    ids are drawn from [4, vocab)."""
    def ids(n):
        return tuple(int(t) for t in rng.integers(4, vocab, n))

    branches = []
    for q in range(questions):
        if q < max(1, questions - 2):
            labels = ((5,), (6,))
        else:
            a, b = ids(2)
            labels = ((a, b, 7), (a, 8), (b,), (9, 10, 11))
        branches.append(Branch(ids(int(rng.integers(*suffix))), labels))
    branches = tuple(branches)
    if window_tokens is not None:
        prefix_len = window_tokens - max(b.positions() + 1 for b in branches)
    return ScoreJob((2, *ids(prefix_len - 1)), branches)
