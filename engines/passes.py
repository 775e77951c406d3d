"""A score call's jobs laid out as passes through the model, on the host.

Each job is one token tree in pre-order: its prefix a chain, each branch's suffix a chain
off the prefix's last token, each branch's label-trie nodes below its suffix (lexical
order of the paths is pre-order). A pass packs whole trees up to `budget` tokens, with
the (lo, end) bounds of kernels/attention.py for full and sliding layers. A job larger
than the budget goes through the KV cache instead: its prefix in chunks that write the
cache, then its branches, in passes that read it (their trees rooted at the suffix). So
does a job routed there to reuse a saved prefix or to save one (the prefix cache).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import lru_cache
from itertools import chain

import numpy as np

from decider.kernels.columns import FIELDS, HEADER

from .base import ScoreJob, Tokens, label_trie


@dataclass(slots=True)  # not frozen: a call makes hundreds, and frozen ones cost 4x
class Output:
    """One trie node's logits: where its pass reads them and where they land."""

    job: int
    branch: int
    path: Tokens
    allowed: Tokens
    at: int  # offset of its logits in the call's label-row buffer
    lse_at: int  # offset of its logsumexp, -1 below the answer position


@dataclass(frozen=True, slots=True)
class Route:
    """A job sent through the KV cache for the prefix cache's sake: `state`, a saved cache
    of its prefix's first `start` tokens (None: start is 0), restored before its first
    pass; the rest of the prefix written in chunks that end at each multiple of `stride`
    (at most the budget), so that the chunks are the same whatever was restored; the
    cache after the chunks that end at `saves` kept."""

    start: int
    state: object
    stride: int
    saves: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Layout:
    passes: list[Pass]
    outputs: list[Output]  # in the order the passes read them
    n_logits: int
    n_lse: int


class Pass:
    """One pass's tokens as chains (each token the parent of the next): described in
    Python while planning, packed by `pack()` when it runs (the engine packs one pass
    while the GPU runs the one before), expanded into per-token columns on the device
    (kernels/columns.py)."""

    def __init__(self, window: int, cache: str = "") -> None:
        self.window = window
        self.cache = cache  # "" packed trees; "write" a prefix chunk; "read" branches after
        self.restore: object = None  # a saved cache to restore before this pass
        self.save: Tokens | None = None  # the prefix whose cache to save after it
        self.rows: list[int] = []  # the token read by each output, in output order
        self.tokens = 0
        self._ids: list[Tokens] = []
        self._chains: list[tuple[int, int, int, int, int, int]] = []  # columns.py's FIELDS

    def chain(self, ids: Tokens, pos0: int, lo_full: int, end: int, before: int,
              follow: bool) -> None:
        """Tokens at positions pos0.. A token whose window reaches back past pos0 sees from
        in-pass index `before` + (its oldest visible position, if follow: the prefix chain
        laid out from index `before`; else `before` itself)."""
        self._ids.append(ids)
        self._chains.append((pos0, lo_full, end, before, int(follow), self.tokens))
        self.tokens += len(ids)

    @property
    def starts_sequence(self) -> bool:
        """Whether its first token is at position 0 (a prefix chunk: the cache starts anew)."""
        return bool(self._chains) and self._chains[0][0] == 0

    @property
    def packed_size(self) -> int:
        return HEADER + self.tokens + FIELDS * len(self._chains)

    def pack(self, out: np.ndarray | None = None) -> np.ndarray:
        """int32 [packed_size]: the pass as kernels/columns.py reads it (T, C, the ids, each
        chain's fields), into the head of `out` when given."""
        n = self.packed_size
        if out is None:
            out = np.empty(n, np.int32)
        elif out.dtype != np.int32 or out.ndim != 1 or len(out) < n \
                or not out.flags.c_contiguous:
            raise ValueError(f"out must be contiguous int32 [>= {n}], got {out.dtype} "
                             f"{out.shape}")
        # struct writes Python ints twice as fast as numpy converts them; a call a chain
        # of ids, since unpacking them all into one call's arguments costs a quarter more
        struct.pack_into("2i", out, 0, self.tokens, len(self._chains))
        at = 4 * HEADER
        for ids in self._ids:
            struct.pack_into(f"{len(ids)}i", out, at, *ids)
            at += 4 * len(ids)
        struct.pack_into(f"{FIELDS * len(self._chains)}i", out, at,
                         *chain.from_iterable(self._chains))
        return out[:n]


@dataclass(frozen=True, slots=True)
class _Trie:
    """A label trie in pre-order: node 0 the root (the answer position)."""

    nodes: list[Tokens]  # paths, lexical order (pre-order)
    allowed: dict[Tokens, Tokens]
    below: list[int]  # descendants of each node
    reported: list[Tokens]  # paths root first, the order every engine reports them in


@lru_cache(maxsize=1024)  # jobs of one request type share their tries
def _trie(candidates: tuple[Tokens, ...]) -> _Trie:
    allowed = label_trie(candidates)
    nodes = sorted(allowed)
    below = [sum(1 for q in nodes[i + 1:] if q[:len(p)] == p) for i, p in enumerate(nodes)]
    return _Trie(nodes, allowed, below, sorted(allowed, key=len))


def _branch_size(branch) -> int:
    """Tokens a branch places: its suffix and its trie nodes below the root."""
    return len(branch.suffix) + len(_trie(branch.candidates).nodes) - 1


def tree_size(job: ScoreJob) -> int:
    """Tokens a job places as one token tree: its prefix, suffixes and trie nodes."""
    return len(job.prefix) + sum(map(_branch_size, job.branches))


def _place_branch(pb: Pass, branch, trie: _Trie, n_prefix: int, prefix_at: int | None
                  ) -> dict:
    """Append one branch (suffix chain, then its trie nodes) to the pass; returns each trie
    node's row. prefix_at: the in-pass index of the prefix's position 0, or None when the
    prefix is in the cache (then the branch's own root is the oldest token it sees here)."""
    base = pb.tokens
    n_suffix = len(branch.suffix)
    last = n_prefix + n_suffix - 1  # position of the answer
    root_lo = base if prefix_at is None else prefix_at
    end = base + n_suffix + len(trie.nodes) - 1
    pb.chain(branch.suffix, n_prefix, root_lo, end, root_lo, prefix_at is not None)
    at: dict[Tokens, int] = {(): base + n_suffix - 1}
    for i, path in enumerate(trie.nodes[1:], 1):
        at[path] = base + n_suffix + i - 1
        p = last + len(path)
        oldest = p - pb.window + 1  # the ancestor there: in the trie, suffix or prefix
        if oldest > last:
            lo = at[path[:oldest - last]]
        elif oldest >= n_prefix:
            lo = base + oldest - n_prefix
        else:
            lo = root_lo if prefix_at is None else prefix_at + max(oldest, 0)
        pb.chain((path[-1],), p, root_lo, at[path] + 1 + trie.below[i], lo, False)
    return at


def _place_prefix(pb: Pass, prefix: Tokens, start: int, tree_end: int) -> None:
    """A chain of prefix tokens at positions start.. into the pass; earlier positions, if
    any, are in the cache."""
    base = pb.tokens
    pb.chain(prefix, start, base, tree_end, base, start == 0)


def lay_out(jobs: list[ScoreJob], budget: int, window: int, pack: int | None = None,
            routes: dict[int, Route] | None = None) -> Layout:
    """budget: the most tokens a pass holds (a larger job goes through the cache); pack:
    where a pass of several trees closes (budget unless given), so that passes fit the
    engine's captured graphs while one tree of up to `budget` still goes whole; routes:
    the jobs, by index, that go through the cache for the prefix cache."""
    pack = min(pack or budget, budget)
    passes: list[Pass] = []
    outputs: list[Output] = []
    n_logits = n_lse = 0
    packed = Pass(window)

    def read(pb: Pass, ji: int, bi: int, at: dict[Tokens, int], trie: _Trie) -> None:
        nonlocal n_logits, n_lse
        allowed = trie.allowed
        for path in trie.reported:
            outputs.append(Output(ji, bi, path, allowed[path], n_logits, -1 if path else n_lse))
            pb.rows.append(at[path])
            n_logits += len(allowed[path])
            n_lse += not path

    routes = routes or {}
    for ji, job in enumerate(jobs):
        size = tree_size(job)
        n_prefix = len(job.prefix)
        route = routes.get(ji)
        if size <= budget and route is None:
            if packed.tokens and packed.tokens + size > pack:
                passes.append(packed)
                packed = Pass(window)
            o = packed.tokens
            _place_prefix(packed, job.prefix, 0, o + size)
            for bi, branch in enumerate(job.branches):
                trie = _trie(branch.candidates)
                read(packed, ji, bi, _place_branch(packed, branch, trie, n_prefix, o), trie)
            continue
        if packed.tokens:  # passes run, and outputs are read, in order
            passes.append(packed)
            packed = Pass(window)
        route = route or Route(0, None, budget, ())
        first = len(passes)
        for s in range(route.start, n_prefix, route.stride):  # through the cache
            chunk, ids = Pass(window, "write"), job.prefix[s:s + route.stride]
            _place_prefix(chunk, ids, s, len(ids))
            if s + len(ids) in route.saves:
                chunk.save = job.prefix[:s + len(ids)]
            passes.append(chunk)
        group = Pass(window, "read")
        for bi, branch in enumerate(job.branches):
            if group.tokens and group.tokens + _branch_size(branch) > budget:
                passes.append(group)
                group = Pass(window, "read")
            trie = _trie(branch.candidates)
            read(group, ji, bi, _place_branch(group, branch, trie, n_prefix, None), trie)
        passes.append(group)
        passes[first].restore = route.state  # before the job's first chunk or read
    if packed.tokens:
        passes.append(packed)
    return Layout(passes, outputs, n_logits, n_lse)
