"""The engine's pass layout against the definition of the attention bounds
(kernels/attention.py: tree_bounds over parent pointers)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from decider.engines import ScoreJob, label_trie
from decider.engines.passes import Pass, lay_out
from decider.kernels.attention import tree_bounds
from decider.kernels.columns import END, IDS, LO_FULL, LO_SLIDE, POS, columns
from helpers.trees import random_job


def meta(p: Pass, size: int = 0) -> np.ndarray:
    """The pass's columns as the model reads them: packed, then expanded (torch reference)."""
    return columns(torch.from_numpy(p.pack()), max(size, p.tokens), p.window).numpy()


def tree(job: ScoreJob, with_prefix: bool):
    """(ids, parents, positions, output rows) of the job's token tree(s) in pre-order."""
    ids, parents, pos, rows = [], [], [], []

    def add(tok, parent, p):
        ids.append(tok)
        parents.append(parent)
        pos.append(p)
        return len(ids) - 1

    last = -1
    if with_prefix:
        for i, t in enumerate(job.prefix):
            last = add(t, last, i)
    for b in job.branches:
        node = last
        for k, t in enumerate(b.suffix):
            node = add(t, node, len(job.prefix) + k)
        at = {(): node}
        trie = label_trie(b.candidates)
        for path in sorted(trie)[1:]:
            at[path] = add(path[-1], at[path[:-1]], pos[at[path[:-1]]] + 1)
        rows += [at[p] for p in sorted(trie, key=len)]
    return ids, parents, pos, rows


@pytest.mark.parametrize("budget, pack", [(10_000, None), (60, None), (25, None), (60, 30)])
def test_layout_is_the_trees_in_pre_order_with_their_bounds(budget, pack, rng):
    """Each job's columns, wherever the plan put them: packed side by side (bounds offset
    by where the job starts; several trees fill a pass up to `pack` tokens at most, one
    goes alone up to `budget`), or its prefix in cache-writing chunks and its branches in
    a pass of their own after them."""
    window = int(rng.integers(1, 20))
    jobs = [random_job(rng) for _ in range(12)]
    layout = lay_out(jobs, budget, window, pack)
    trees: dict[int, int] = {}  # packed pass -> the trees it holds
    passes = iter(layout.passes)
    p, at, row = None, 0, 0

    def check(ids, parents, pos, rows):
        nonlocal at, row
        n = len(ids)
        cols = meta(p)[:, at:at + n]
        lo_full, end = tree_bounds(parents, pos, None)
        lo_slide, _ = tree_bounds(parents, pos, window)
        assert cols[IDS].tolist() == ids and cols[POS].tolist() == pos
        assert (cols[END] - at).tolist() == end.tolist()
        assert (cols[LO_FULL] - at).tolist() == lo_full.tolist()
        assert (cols[LO_SLIDE] - at).tolist() == lo_slide.tolist()
        assert [r - at for r in p.rows[row:row + len(rows)]] == rows
        at, row = at + n, row + len(rows)

    for job in jobs:
        whole = tree(job, with_prefix=True)
        if len(whole[0]) <= budget:
            if p is None or p.cache or at + len(whole[0]) > p.tokens:
                p, at, row = next(passes), 0, 0
            trees[id(p)] = trees.get(id(p), 0) + 1
            check(*whole)
            continue
        chunks = [next(passes) for _ in range(0, len(job.prefix), budget)]
        got = np.concatenate([meta(c) for c in chunks], 1)
        assert all(c.cache == "write" for c in chunks)
        assert got[IDS].tolist() == list(job.prefix)
        assert got[POS].tolist() == list(range(len(job.prefix)))
        p = None
        for b in job.branches:  # each its own tree, in passes that read the cache
            one = tree(ScoreJob(job.prefix, (b,)), with_prefix=False)
            if p is None or at + len(one[0]) > p.tokens:
                p, at, row = next(passes), 0, 0
                assert p.cache == "read"
            check(*one)
    assert next(passes, None) is None
    assert all(p.tokens <= (pack or budget) for p in layout.passes if trees.get(id(p), 0) > 1)
    assert len(layout.outputs) == sum(len(label_trie(b.candidates)) for j in jobs
                                      for b in j.branches)


def test_a_pass_padded_to_a_graph_size_keeps_its_columns_and_pads_with_lone_tokens(rng):
    """Expanded to a larger size: the pass's own columns unchanged, then tokens that see
    only themselves (id 0 at position 0), so padding changes no real token's attention.
    A size below the pass's tokens is refused, never cut."""
    [p] = lay_out([random_job(rng) for _ in range(3)], 10_000, int(rng.integers(1, 20))).passes
    size = p.tokens + int(rng.integers(1, 50))
    padded = meta(p, size)
    assert padded.shape == (5, size) and padded.dtype == np.int32
    assert (padded[:, :p.tokens] == meta(p)).all()
    pad = np.arange(p.tokens, size)
    assert (padded[IDS, p.tokens:] == 0).all() and (padded[POS, p.tokens:] == 0).all()
    for row in (LO_FULL, LO_SLIDE):
        assert (padded[row, p.tokens:] == pad).all()
    assert (padded[END, p.tokens:] == pad + 1).all()
    with pytest.raises(ValueError, match="do not fit size"):
        columns(torch.from_numpy(p.pack()), p.tokens - 1, p.window)


def test_an_empty_pass_is_all_padding_and_pack_refuses_a_short_buffer():
    """A graph's warm-up pass: no tokens, no chains."""
    assert meta(Pass(4), 3).tolist() == [[0, 0, 0], [0, 0, 0], [0, 1, 2], [0, 1, 2], [1, 2, 3]]
    p = Pass(4)
    p.chain((5, 6, 7), 0, 0, 3, 0, True)
    with pytest.raises(ValueError, match=r"int32 \[>= 11\]"):
        p.pack(out=np.zeros(10, np.int32))
