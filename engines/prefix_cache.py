"""The prefix cache: saved engine states of recent prompt prefixes, so that a later job
starting with one of them computes only the rest (docs/design.md, "The prefix cache").

An engine saves a state after given lengths of a job's prefix and asks, before the next
job, for the longest saved prefix of it. The states are opaque to the cache (llama.cpp's
bytes, the Triton engine's tensors); it holds at most `max_bytes` of them and drops the
least recently used first. Keys are the
token sequences themselves, so a hit is exact: same tokens, same positions. A cache lives
in one engine, which serves one model and one prompt template: nothing is ever shared
across models, and a reload (a new engine) starts empty.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from decider.errors import ConfigError

Tokens = tuple[int, ...]  # as engines/base.py's, which names this class in its protocol

HOST_SHARE = 8  # the default budget is this fraction of the host's memory: an eighth


def host_budget() -> int:
    """The default budget in bytes where states are kept in the host's memory: a share of
    its physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // HOST_SHARE


def saved_lengths(prefix: Tokens, stride: int) -> list[int]:
    """The prefix lengths a saved state of a job with this prefix may have: multiples of
    the stride below its length, and its length."""
    return [*range(stride, len(prefix), stride), len(prefix)]


@dataclass(slots=True)
class CacheStats:
    """Cumulative counts since the engine loaded, and the bytes held now."""

    hits: int = 0  # jobs that found a saved prefix
    misses: int = 0  # jobs that found none
    hit_tokens: int = 0  # prefix tokens read from saved states instead of computed
    saved: int = 0  # states kept
    evictions: int = 0  # states dropped to stay within the budget
    bytes: int = 0  # held now
    states: int = 0  # held now


class PrefixCache:
    def __init__(self, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ConfigError(f"prefix_cache_bytes must be positive (0: no cache), got "
                              f"{max_bytes}", prefix_cache_bytes=max_bytes)
        self.max_bytes = max_bytes
        self.stats = CacheStats()
        self._states: OrderedDict[Tokens, tuple[Any, int]] = OrderedDict()  # (state, bytes)

    def longest(self, prefix: Tokens, lengths: Iterable[int]) -> tuple[int, Any]:
        """The longest of prefix[:n], n in `lengths`, that is saved, with its state, made the
        most recently used; (0, None) when none is. Counted as one job's hit or miss."""
        for n in sorted(set(lengths), reverse=True):
            held = self._states.get(prefix[:n]) if n > 0 else None
            if held is not None:
                self._states.move_to_end(prefix[:n])
                self.stats.hits += 1
                self.stats.hit_tokens += n
                return n, held[0]
        self.stats.misses += 1
        return 0, None

    def wants(self, tokens: Tokens, size: int) -> bool:
        """Whether a state of `size` bytes for `tokens` would be kept: not saved yet and,
        alone, within the budget (the caller skips the copy otherwise)."""
        return size <= self.max_bytes and tokens not in self._states

    def put(self, tokens: Tokens, state: Any, size: int) -> None:
        """Keep `state`, of `size` bytes, as the newest, dropping the least recently used
        states until all fit the budget. A state larger than the whole budget is not kept."""
        if not self.wants(tokens, size):
            return
        self._states[tokens] = (state, size)
        self.stats.saved += 1
        self.stats.bytes += size
        while self.stats.bytes > self.max_bytes:
            _, (_, dropped) = self._states.popitem(last=False)
            self.stats.bytes -= dropped
            self.stats.evictions += 1
        self.stats.states = len(self._states)

    def order(self) -> list[Tokens]:
        """The saved prefixes, least recently used first."""
        return list(self._states)
