"""A score call's jobs laid out as passes through the model. Host-side numpy only.

Each job is one token tree in pre-order: its prefix a chain, each branch's suffix a chain
off the prefix's last token, each branch's label-trie nodes below its suffix (lexical
order of the paths is pre-order). A pass packs whole trees up to `budget` tokens, with
the (lo, end) bounds of kernels/attention.py for full and sliding layers. A job larger
than the budget goes through the KV cache instead: its prefix in chunks that write the
cache, then its branches, in passes that read it (their trees rooted at the suffix).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from .base import ScoreJob, Tokens, label_trie

IDS, POS, LO_FULL, LO_SLIDE, END = range(5)  # the rows of Pass.meta


@dataclass(frozen=True, slots=True)
class Output:
    """One trie node's logits: where its pass reads them and where they land."""

    job: int
    branch: int
    path: Tokens
    allowed: Tokens
    at: int  # offset of its logits in the call's label-row buffer
    lse_at: int  # offset of its logsumexp, -1 below the answer position


@dataclass(slots=True)
class Pass:
    meta: np.ndarray  # int32 [5, T]: ids, pos, lo_full, lo_slide, end
    rows: list[int] = field(default_factory=list)  # token read per output, in output order
    cache: str = ""  # "" packed trees; "write" a prefix chunk; "read" branches after one

    @property
    def tokens(self) -> int:
        return self.meta.shape[1]


@dataclass(frozen=True, slots=True)
class Plan:
    passes: list[Pass]
    outputs: list[Output]  # in the order the passes read them
    n_logits: int
    n_lse: int


class _Builder:
    """Collects one pass's token columns."""

    def __init__(self, cache: str = "") -> None:
        self.cols: list[list] = [[], [], [], [], []]  # per meta row, its pieces
        self.rows: list[int] = []
        self.size = 0
        self.cache = cache

    def add(self, n: int, *columns) -> None:
        """n tokens; each column an array of n or a scalar for all of them."""
        for row, c in zip(self.cols, columns, strict=True):
            row.append(np.full(n, c, np.int32) if np.ndim(c) == 0 else c)
        self.size += n

    def build(self) -> Pass:
        meta = np.empty((5, self.size), np.int32)
        for out, pieces in zip(meta, self.cols, strict=True):
            np.concatenate(pieces, out=out, casting="unsafe")
        return Pass(meta, self.rows, self.cache)


@dataclass(frozen=True, slots=True)
class _Trie:
    """A label trie in pre-order: node 0 the root (the answer position)."""

    nodes: list[Tokens]  # paths, lexical order (pre-order)
    allowed: dict[Tokens, Tokens]
    below: list[int]  # descendants of each node


@lru_cache(maxsize=1024)  # jobs of one request type share their tries
def _trie(candidates: tuple[Tokens, ...]) -> _Trie:
    allowed = label_trie(candidates)
    nodes = sorted(allowed)
    below = [sum(1 for q in nodes[i + 1:] if q[:len(p)] == p) for i, p in enumerate(nodes)]
    return _Trie(nodes, allowed, below)


def _tree_size(job: ScoreJob) -> int:
    return len(job.prefix) + sum(len(b.suffix) + len(_trie(b.candidates).nodes) - 1
                                 for b in job.branches)


def _place_branch(pb: _Builder, branch, n_prefix: int, window: int,
                  prefix_at: int | None) -> dict[Tokens, int]:
    """Append one branch (suffix chain, then its trie nodes) to the pass; returns each trie
    node's row. prefix_at: the in-pass index of the prefix's position 0, or None when the
    prefix is in the cache (then the branch's own root is the oldest token it sees here)."""
    base = pb.size
    trie = _trie(branch.candidates)
    n_suffix = len(branch.suffix)
    last = n_prefix + n_suffix - 1  # position of the answer
    root_lo = base if prefix_at is None else prefix_at
    at: dict[Tokens, int] = {(): base + n_suffix - 1}

    def lo_at(p, path: Tokens = ()):
        """In-pass index of the ancestor at position p (array or int) on the way to path."""
        if np.isscalar(p) and p > last:
            return at[path[: p - last]]
        in_prefix = root_lo if prefix_at is None else prefix_at + np.maximum(p, 0)
        return np.where(p >= n_prefix, base + p - n_prefix, in_prefix)

    pos = np.arange(n_prefix, n_prefix + n_suffix)
    end = base + n_suffix + len(trie.nodes) - 1
    pb.add(n_suffix, np.fromiter(branch.suffix, np.int32, n_suffix), pos, root_lo,
           lo_at(pos - window + 1), end)
    for i, path in enumerate(trie.nodes[1:], 1):
        at[path] = base + n_suffix + i - 1
        p = last + len(path)
        pb.add(1, path[-1], p, root_lo, int(lo_at(p - window + 1, path)),
               at[path] + 1 + trie.below[i])
    return at


def _place_prefix(pb: _Builder, prefix: Tokens, start: int, window: int, tree_end: int) -> None:
    """A chain of prefix tokens at positions start.. into the pass; earlier positions, if
    any, are in the cache."""
    base = pb.size
    k = np.arange(len(prefix))
    pb.add(len(prefix), np.fromiter(prefix, np.int32, len(prefix)), start + k, base,
           base + np.maximum(k - window + 1, 0), tree_end)


def plan(jobs: list[ScoreJob], budget: int, window: int) -> Plan:
    passes: list[Pass] = []
    outputs: list[Output] = []
    n_logits = n_lse = 0
    packed = _Builder()

    def read(pb: _Builder, ji: int, bi: int, at: dict[Tokens, int], branch) -> None:
        nonlocal n_logits, n_lse
        allowed = _trie(branch.candidates).allowed
        for path in sorted(allowed, key=len):  # root first, as every engine reports them
            outputs.append(Output(ji, bi, path, allowed[path], n_logits, -1 if path else n_lse))
            pb.rows.append(at[path])
            n_logits += len(allowed[path])
            n_lse += not path

    for ji, job in enumerate(jobs):
        size = _tree_size(job)
        n_prefix = len(job.prefix)
        if size <= budget:
            if packed.size + size > budget:
                passes.append(packed.build())
                packed = _Builder()
            o = packed.size
            _place_prefix(packed, job.prefix, 0, window, o + size)
            for bi, branch in enumerate(job.branches):
                at = _place_branch(packed, branch, n_prefix, window, o)
                read(packed, ji, bi, at, branch)
            continue
        if packed.size:  # passes run, and outputs are read, in order
            passes.append(packed.build())
            packed = _Builder()
        for s in range(0, n_prefix, budget):  # through the cache
            chunk = _Builder("write")
            _place_prefix(chunk, job.prefix[s:s + budget], s, window,
                          len(job.prefix[s:s + budget]))
            passes.append(chunk.build())
        group = _Builder("read")
        for bi, branch in enumerate(job.branches):
            cost = len(branch.suffix) + len(_trie(branch.candidates).nodes) - 1
            if group.size and group.size + cost > budget:
                passes.append(group.build())
                group = _Builder("read")
            at = _place_branch(group, branch, n_prefix, window, None)
            read(group, ji, bi, at, branch)
        passes.append(group.build())
    if packed.size:
        passes.append(packed.build())
    return Plan(passes, outputs, n_logits, n_lse)
