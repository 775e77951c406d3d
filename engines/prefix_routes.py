"""Which jobs of a Triton engine call go through its KV cache for the prefix cache.

The engine reads a job's whole token tree in one pass, several jobs a pass, inside CUDA
graphs; a job that reuses or saves a prefix goes through the KV cache instead, in eager
passes of its own (passes.py's Route). That pays for a hit and costs a miss, so a prefix
is saved only when it is seen a second time: a stream of texts each asked about once
(a batch job) keeps the packed passes, a text asked about again is saved on its second
request and read from the cache from its third. Prefixes shorter than the stride never
go there (their packed pass costs about what a read from the cache does).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from .base import ScoreJob
from .passes import Route
from .prefix_cache import PrefixCache, saved_lengths

SEEN = 1 << 16  # prefixes remembered as read once (their hashes, least recent dropped)


class PrefixRouter:
    def __init__(self, cache: PrefixCache, stride: int) -> None:
        self.cache = cache
        self.stride = stride  # chunk size of a routed prefix, and where states are saved
        self._seen: OrderedDict[int, None] = OrderedDict()

    def routes(self, jobs: Sequence[ScoreJob]) -> dict[int, Route]:
        """The routes of a call's jobs, by index; a job not routed is read in packed passes."""
        routes = {}
        for i, job in enumerate(jobs):
            prefix = job.prefix
            if len(prefix) < self.stride:
                continue
            lengths = saved_lengths(prefix, self.stride)
            start, state = self.cache.longest(prefix, lengths)
            if state is None and self._first_sight(prefix, lengths):
                continue
            # saved: the last multiple of the stride below the end, and the end (as the
            # llama engine does), so that a longer prefix extending it starts from there
            last = (len(prefix) - 1) // self.stride * self.stride
            routes[i] = Route(start, state, self.stride,
                              tuple(n for n in (last, len(prefix)) if n > start))
        return routes

    def _first_sight(self, prefix, lengths: list[int]) -> bool:
        """Whether none of the prefix's saved lengths was seen before; it is remembered."""
        keys = [hash(prefix[:n]) for n in lengths]
        if any(k in self._seen for k in keys):
            return False
        for k in keys:
            self._seen[k] = None
        while len(self._seen) > SEEN:
            self._seen.popitem(last=False)
        return True
