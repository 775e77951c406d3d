"""How one job becomes llama.cpp work: decodes of token entries, and sequence operations
between them. Pure planning, no llama.cpp calls, so the layouts are tested on their own.

No answer may depend on the other questions of its job, and llama.cpp's arithmetic moves
with what shares a decode (its CPU kernels by batch shape, flash attention's sums by the
order of the cells a token sees). So the prefix is decoded alone, then each question's
branches (ScoreJob.units) in decodes of their own, laid out by the question alone, and
each question leaves the cache as it found it (its cells removed once read), so that the
next one finds the same cells free: its decodes are those of the question asked alone.

llama.cpp reuses a cell of its bounded sliding-window cache only when exactly one
sequence holds it and the window has moved past it for that sequence; a cell that
several sequences share is kept until all but one let go. Two layouts follow from that:

- shared: each label-trie leaf of a branch is a sequence of its own, sharing the prefix
  cells; up to `n_parallel` of them ride in one decode as a token tree. A branch's suffix
  is decoded once, with its first group of leaves; where its leaves go on into later
  groups, sequence 0 takes over the suffix's cells and those groups start from copies of
  it, decoding only their label tokens. Every cell a decode finds is held by sequence 0
  and by the copies of the group, so none is ever reused: the layout is valid while the
  prefix, the suffix carried over and one group's tokens fit the cells of every cache
  (`room`).
- alone: one sequence. Each branch is appended to the prefix, read, and rolled back;
  each label path below a branch likewise, from the branch's end. The last window of the
  prefix is also held by a guard sequence, so no decode can reuse those cells, and before
  each branch the prefix sequence takes them back from the guard (a decode that reuses an
  older cell drops the sequence from every cell before it). It needs `2 * window +
  n_batch` sliding cells whatever the prompt's length, which every context with two
  sequences has. Every branch sees the cells a plain one-sequence decode of the prefix
  followed by the branch would see.

A question takes the shared layout where it fits the room, else the alone one. The
shared ones go first: each leaves the cells as the prefix left them. Before the alone
ones the sliding cache is repacked (`Repack`): it keeps only the prefix's last window,
in one block from its first cell, the rest free. A branch decoded alone would otherwise
reuse older prefix cells wherever llama.cpp's search for free cells happens to start,
which moves with every earlier branch; from the repacked cache each branch takes the
same free cells, and frees them again.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .base import ScoreJob, Tokens, trie_leaves

PREFIX_SEQ = 0
GUARD_SEQ = 1  # the alone layout's guard; the shared layout's first leaf sequence


@dataclass(frozen=True, slots=True)
class Entry:
    """One token of a decode."""

    token: int
    pos: int
    seqs: tuple[int, ...]
    out: tuple[int, Tokens] | None  # (branch index, trie path) read from this token's output


@dataclass(frozen=True, slots=True)
class Decode:
    entries: tuple[Entry, ...]


@dataclass(frozen=True, slots=True)
class Copy:
    """Add `dst` to the cells `src` holds at positions [p0, p1) (-1: open end)."""

    src: int
    dst: int
    p0: int = -1
    p1: int = -1


@dataclass(frozen=True, slots=True)
class Remove:
    """Drop `seq` from its cells at positions [p0, p1) (-1: open end)."""

    seq: int
    p0: int = -1
    p1: int = -1


@dataclass(frozen=True, slots=True)
class Repack:
    """The sliding-window cache of `dst` replaced by copies of the cells `src` holds there,
    in one block from the cache's first cell; `src` let go. The full-attention cache is
    left as it is. Runs where sequence 0 alone holds cells."""

    src: int
    dst: int


@dataclass(frozen=True, slots=True)
class Save:
    """Keep the state of sequence 0, which holds exactly the prefix's first `n` tokens."""

    n: int


Step = Decode | Copy | Remove | Repack | Save


def job_steps(job: ScoreJob, tries: list[dict[Tokens, Tokens]], n_parallel: int, room: int,
              window: int, start: int = 0, stride: int = 0) -> Iterator[Step]:
    """The prefix decoded alone from `start` (the tokens restored from a saved state),
    then each question (unit) in a layout of its own: the shared ones first, then the
    alone ones. With a stride, the prefix's state is saved at its end and at its last
    multiple of the stride."""
    yield from prefix_steps(job.prefix, start, stride)
    alone = []
    for unit in job.units():
        groups = shared_groups(job, tries, unit, n_parallel, room)
        if groups is None:
            alone.append(unit)
        else:
            yield from shared_steps(job, groups)
    if alone and window:
        yield Copy(PREFIX_SEQ, GUARD_SEQ, _guarded(job, window), len(job.prefix))
        yield Repack(GUARD_SEQ, PREFIX_SEQ)
    for unit in alone:
        yield from alone_steps(job, tries, unit, window)


def prefix_steps(prefix: Tokens, start: int, stride: int) -> Iterator[Decode | Save]:
    """prefix[start:] decoded, saved (stride > 0) at the last multiple of the stride before
    its end and at its end. A decode of more than n_batch tokens runs as n_batch chunks
    from its first token: with `stride` n_batch and `start` 0, a multiple of the stride
    or the end, the chunks are those of a decode of the whole prefix, so a prefix read
    from a saved state is computed as a fresh read computes it."""
    n = len(prefix)
    breaks = [b for b in ((n - 1) // stride * stride if stride else 0, n) if start < b]
    for b in breaks:
        yield Decode(tuple(Entry(prefix[p], p, (PREFIX_SEQ,), None) for p in range(start, b)))
        if stride:
            yield Save(b)
        start = b


def _guarded(job: ScoreJob, window: int) -> int:
    """The first position of the prefix a token after it sees in a sliding layer; with no
    sliding layers, none (nothing to guard)."""
    n = len(job.prefix)
    return max(0, n - window + 1) if window else n


def shared_groups(job: ScoreJob, tries: list[dict[Tokens, Tokens]], unit: range,
                  n_parallel: int, room: int) -> list[list[tuple[int, Tokens]]] | None:
    """(branch, leaf) pairs of the unit's branches, each branch's leaves in token order
    (siblings together), packed into decodes of at most n_parallel sequences. A group's
    cells are the prefix, the suffix of a branch carried over from the group before, and
    its own tokens: all within `room`. None when one leaf alone does not fit."""
    free = room - len(job.prefix)
    groups: list[list[tuple[int, Tokens]]] = []
    placed: set[tuple[int, Tokens]] = set()  # (branch, node) the group holds
    used = 0  # cells the group holds past the prefix
    for bi in unit:
        suffix = len(job.branches[bi].suffix)
        for leaf in sorted(trie_leaves(tries[bi])):
            if suffix + len(leaf) > free:
                return None
            nodes = [(bi, leaf[:k]) for k in range(len(leaf) + 1)]
            cost = suffix * (nodes[0] not in placed) + sum(n not in placed for n in nodes[1:])
            if not groups or len(groups[-1]) == n_parallel or used + cost > free:
                carried = bool(groups) and groups[-1][-1][0] == bi
                groups.append([])
                placed = {nodes[0]} if carried else set()
                used = suffix if carried else 0
                cost = len(leaf) + (0 if carried else suffix)
            groups[-1].append((bi, leaf))
            placed.update(nodes)
            used += cost
    return groups


def shared_steps(job: ScoreJob, groups: list[list[tuple[int, Tokens]]]) -> Iterator[Step]:
    """The shared layout of one unit, after the prefix: each group starts as copies of
    sequence 0 (no data copied). A branch whose leaves go on into the next group leaves
    its suffix to sequence 0, whose copies then start past it: each suffix is decoded
    once. Every cell the unit placed is removed after it."""
    n = len(job.prefix)
    held = None  # the branch whose suffix sequence 0 holds past the prefix
    for i, group in enumerate(groups):
        seqs = {pair: 1 + k for k, pair in enumerate(group)}
        yield from (Copy(PREFIX_SEQ, s, -1, -1 if bi == held else n)
                    for (bi, _), s in seqs.items())
        yield Decode(tuple(_tree(job, seqs, held)))
        last = group[-1][0]
        keep = last if i + 1 < len(groups) and groups[i + 1][0][0] == last else None
        if held is not None and held != keep:
            yield Remove(PREFIX_SEQ, n)
            held = None
        if keep is not None and held is None:
            yield Copy(seqs[group[-1]], PREFIX_SEQ, n, n + len(job.branches[keep].suffix))
            held = keep
        yield from (Remove(s) for s in seqs.values())


def _tree(job: ScoreJob, seqs: dict[tuple[int, Tokens], int], held: int | None
          ) -> list[Entry]:
    """The token tree of one group: each token carries the sequences of the leaves below
    it; parents come before children, so every sequence stays consecutive. The suffix of
    the branch sequence 0 holds (`held`) is in the copies already."""
    entries: list[Entry] = []
    base = len(job.prefix)
    for bi in dict.fromkeys(bi for bi, _ in seqs):
        suffix = job.branches[bi].suffix
        ends = {leaf: s for (b, leaf), s in seqs.items() if b == bi}
        if bi != held:
            every = tuple(ends.values())
            entries += [Entry(tok, base + k, every, (bi, ()) if k == len(suffix) - 1 else None)
                        for k, tok in enumerate(suffix)]
        paths = sorted({leaf[:k] for leaf in ends for k in range(1, len(leaf) + 1)}, key=len)
        for path in paths:
            below = tuple(s for leaf, s in ends.items() if leaf[: len(path)] == path)
            entries.append(Entry(path[-1], base + len(suffix) + len(path) - 1, below, (bi, path)))
    return entries


def alone_steps(job: ScoreJob, tries: list[dict[Tokens, Tokens]], unit: range, window: int
                ) -> Iterator[Step]:
    """The alone layout of one unit, after the prefix; the guard is let go after it, once
    sequence 0 holds the prefix's last window again. (A sequence may not join a decode
    beside another whose cells differ, so the guard is made by a copy, not decoded.)"""
    n, guarded = len(job.prefix), _guarded(job, window)
    yield Copy(PREFIX_SEQ, GUARD_SEQ, guarded, n)
    for bi in unit:
        branch = job.branches[bi]
        yield Remove(PREFIX_SEQ, guarded, n)  # take the window back whole from the guard
        yield Copy(GUARD_SEQ, PREFIX_SEQ, guarded, n)
        last = len(branch.suffix) - 1
        yield Decode(tuple(Entry(t, n + k, (PREFIX_SEQ,), (bi, ()) if k == last else None)
                           for k, t in enumerate(branch.suffix)))
        end = n + len(branch.suffix)
        for leaf in trie_leaves(tries[bi]):
            if leaf:
                yield Decode(tuple(Entry(t, end + k, (PREFIX_SEQ,), (bi, leaf[: k + 1]))
                                   for k, t in enumerate(leaf)))
                yield Remove(PREFIX_SEQ, end)
        yield Remove(PREFIX_SEQ, n)
    yield Remove(PREFIX_SEQ, guarded, n)
    yield Copy(GUARD_SEQ, PREFIX_SEQ, guarded, n)
    yield Remove(GUARD_SEQ)
