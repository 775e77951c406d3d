"""Plain-text tokenization of a SentencePiece vocabulary, piece by piece, with the pieces
cached: llama.cpp's tokenizer on a whole text costs a front end more than the rest of
planning a request (docs/experiments.md), and texts are mostly words seen before.

Why it is exact: SentencePiece merges adjacent symbols into tokens of the vocabulary, and
llama.cpp spells a space as `▁` before merging. A text cut just before a run of spaces
can only tokenize differently from its two halves if some token spans the cut, that is,
holds a character other than a space followed by a space. Such tokens are rare (Gemma 3
has one of 262,144, `>▁</`): no text is cut after any character that one of them holds
there. The merges on either side of a cut then never meet, and llama.cpp picks each
side's merges in the same order (best score, then leftmost) whether the other side is
there or not. tests/test_tokens.py holds generated texts to this on the real vocabulary.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

SPACES = " \u2581"  # a space, and the character llama.cpp spells it with
MAX_PIECE = 48  # characters: longer pieces (rare) are tokenized but not kept
MAX_ENTRIES = 1 << 16  # the cache starts over when full: a few MiB at most


def crossing_chars(tokens: Iterable[str]) -> set[str]:
    """The characters some token holds just before a space (`>` in `>▁</`): a text is
    never cut after one of them."""
    found = set()
    for text in tokens:
        for i in range(1, len(text)):
            if text[i] in SPACES and text[i - 1] not in SPACES:
                found.add(text[i - 1])
    return found


class PieceTokenizer:
    """tokenize(text) as `whole(text)` gives it, from the pieces' cached tokens."""

    def __init__(self, whole: Callable[[str], list[int]], tokens: Iterable[str]) -> None:
        self._whole = whole
        kept = "".join(sorted(crossing_chars(tokens)))
        # a cut: before a run of spaces, after a character that no token carries across
        self._cuts = re.compile(f"(?<=[^{re.escape(SPACES + kept)}])(?=[{SPACES}])")
        self._cache: dict[str, tuple[int, ...]] = {}

    def __call__(self, text: str) -> list[int]:
        cache, ids = self._cache, []
        for piece in self._cuts.split(text):
            got = cache.get(piece)
            if got is None:
                got = tuple(self._whole(piece))
                if len(piece) <= MAX_PIECE:
                    if len(cache) >= MAX_ENTRIES:
                        cache.clear()
                    cache[piece] = got
            ids += got
        return ids
