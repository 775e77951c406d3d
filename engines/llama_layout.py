"""How one job becomes llama.cpp work: decodes of token entries, and sequence operations
between them. Pure planning, no llama.cpp calls, so the layouts are tested on their own.

llama.cpp reuses a cell of its bounded sliding-window cache only when exactly one
sequence holds it and the window has moved past it for that sequence; a cell that
several sequences share is kept until all but one let go. Two layouts follow from that:

- shared: each branch (each label-trie leaf) is a sequence of its own, sharing the prefix
  cells; up to `n_parallel` of them ride in one decode as a token tree. The prefix cells
  are shared, so none is ever reused: the layout is valid while the prefix plus one
  group's tokens fit the cells of every cache (`room`).
- alone: one sequence. The prefix is decoded once; each branch is appended to it, read,
  and rolled back; each label path below a branch likewise, from the branch's end. The
  last window of the prefix is also held by a guard sequence, so no decode can reuse
  those cells, and before each branch the prefix sequence takes them back from the
  guard (a decode that reuses an older cell drops the sequence from every cell before
  it). It needs `2 * window + n_batch` sliding cells whatever the prompt's length, which
  every context with two sequences has. Every branch is then decoded exactly as a plain
  one-sequence decode of the prefix followed by the branch would be.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .base import ScoreJob, Tokens

PREFIX_SEQ = 0
GUARD_SEQ = 1  # the alone layout's guard; the shared layout's first branch sequence


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


Step = Decode | Copy | Remove


def leaves(trie: dict[Tokens, Tokens]) -> list[Tokens]:
    """Trie nodes with no child node: the paths a branch's sequences end on."""
    return [p for p in trie if not any(len(q) > len(p) and q[: len(p)] == p for q in trie)]


def shared_groups(job: ScoreJob, tries: list[dict[Tokens, Tokens]], n_parallel: int,
                  room: int) -> list[list[tuple[int, Tokens]]] | None:
    """(branch, leaf) pairs packed into decodes of at most n_parallel sequences whose
    tokens fit the cells the prefix leaves free; None when one leaf alone does not fit."""
    free = room - len(job.prefix)
    groups: list[list[tuple[int, Tokens]]] = [[]]
    placed: set[tuple[int, Tokens]] = set()  # (branch, node) already fed in the group
    used = 0
    for bi, branch in enumerate(job.branches):
        for leaf in leaves(tries[bi]):
            alone = len(branch.suffix) + len(leaf)
            if alone > free:
                return None
            cost = len(branch.suffix) * ((bi, ()) not in placed) + sum(
                (bi, leaf[:k]) not in placed for k in range(1, len(leaf) + 1))
            if groups[-1] and (len(groups[-1]) == n_parallel or used + cost > free):
                groups.append([])
                placed.clear()
                used, cost = 0, alone
            groups[-1].append((bi, leaf))
            placed.update((bi, leaf[:k]) for k in range(len(leaf) + 1))
            used += cost
    return groups


def shared_steps(job: ScoreJob, groups: list[list[tuple[int, Tokens]]]) -> Iterator[Step]:
    """The shared layout: the first group rides with the prefix (one decode for one
    question), later groups start as copies of the prefix sequence (no data copied)."""
    for i, group in enumerate(groups):
        seqs = tuple(range(1, 1 + len(group)))
        entries = _tree(job, group)
        if i == 0:
            entries = [Entry(t, p, (PREFIX_SEQ, *seqs), None)
                       for p, t in enumerate(job.prefix)] + entries
        else:
            yield from (Copy(PREFIX_SEQ, seq) for seq in seqs)
        yield Decode(tuple(entries))
        yield from (Remove(seq) for seq in seqs)


def _tree(job: ScoreJob, group: list[tuple[int, Tokens]]) -> list[Entry]:
    """The token tree of one group: each token carries the sequences of the leaves below
    it; parents come before children, so every sequence stays consecutive."""
    entries: list[Entry] = []
    base = len(job.prefix)
    for bi in dict.fromkeys(bi for bi, _ in group):
        suffix = job.branches[bi].suffix
        ends = {leaf: 1 + i for i, (b, leaf) in enumerate(group) if b == bi}
        every = tuple(ends.values())
        for k, tok in enumerate(suffix):
            entries.append(Entry(tok, base + k, every, (bi, ()) if k == len(suffix) - 1 else None))
        paths = sorted({leaf[:k] for leaf in ends for k in range(1, len(leaf) + 1)}, key=len)
        for path in paths:
            seqs = tuple(s for leaf, s in ends.items() if leaf[: len(path)] == path)
            entries.append(Entry(path[-1], base + len(suffix) + len(path) - 1, seqs, (bi, path)))
    return entries


def alone_steps(job: ScoreJob, tries: list[dict[Tokens, Tokens]], window: int
                ) -> Iterator[Step]:
    """The alone layout. (A sequence may not join a decode beside another whose cells
    differ, so the guard is made by a copy after the prefix, not decoded with it.)"""
    n = len(job.prefix)
    guarded = max(0, n - window) if window else n  # no sliding layers: nothing to guard
    yield Decode(tuple(Entry(t, p, (PREFIX_SEQ,), None) for p, t in enumerate(job.prefix)))
    yield Copy(PREFIX_SEQ, GUARD_SEQ, guarded, n)
    for bi, branch in enumerate(job.branches):
        yield Remove(PREFIX_SEQ, guarded, n)  # take the window back whole from the guard
        yield Copy(GUARD_SEQ, PREFIX_SEQ, guarded, n)
        last = len(branch.suffix) - 1
        yield Decode(tuple(Entry(t, n + k, (PREFIX_SEQ,), (bi, ()) if k == last else None)
                           for k, t in enumerate(branch.suffix)))
        end = n + len(branch.suffix)
        for leaf in leaves(tries[bi]):
            if leaf:
                yield Decode(tuple(Entry(t, end + k, (PREFIX_SEQ,), (bi, leaf[: k + 1]))
                                   for k, t in enumerate(leaf)))
                yield Remove(PREFIX_SEQ, end)
        yield Remove(PREFIX_SEQ, n)
