"""The engine's pass layout against the definition of the attention bounds
(kernels/attention.py: tree_bounds over parent pointers)."""

from __future__ import annotations

import numpy as np
import pytest

from decider.engines import Branch, ScoreJob, label_trie
from decider.engines.passes import END, IDS, LO_FULL, LO_SLIDE, POS, plan
from decider.kernels.attention import tree_bounds


def random_job(rng) -> ScoreJob:
    def toks(n):
        return tuple(int(t) for t in rng.integers(3, 500, n))

    branches = []
    for _ in range(int(rng.integers(1, 4))):
        cands = {toks(int(rng.integers(1, 4))) for _ in range(int(rng.integers(2, 6)))}
        # no candidate a prefix of another
        cands = [c for c in cands if not any(d != c and d[:len(c)] == c for d in cands)]
        branches.append(Branch(toks(int(rng.integers(1, 6))), tuple(cands)))
    return ScoreJob((2, *toks(int(rng.integers(0, 40)))), tuple(branches))


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


@pytest.mark.parametrize("budget", [10_000, 60, 25])
def test_layout_is_the_trees_in_pre_order_with_their_bounds(budget):
    """Each job's columns, wherever the plan put them: packed side by side (bounds offset
    by where the job starts), or its prefix in cache-writing chunks and its branches in a
    pass of their own after them."""
    rng = np.random.default_rng()
    window = int(rng.integers(1, 20))
    jobs = [random_job(rng) for _ in range(12)]
    layout = plan(jobs, budget, window)
    passes = iter(layout.passes)
    p, at, row = None, 0, 0

    def check(ids, parents, pos, rows):
        nonlocal at, row
        n = len(ids)
        meta = p.meta()[:, at:at + n]
        lo_full, end = tree_bounds(parents, pos, None)
        lo_slide, _ = tree_bounds(parents, pos, window)
        assert meta[IDS].tolist() == ids and meta[POS].tolist() == pos
        assert (meta[END] - at).tolist() == end.tolist()
        assert (meta[LO_FULL] - at).tolist() == lo_full.tolist()
        assert (meta[LO_SLIDE] - at).tolist() == lo_slide.tolist()
        assert [r - at for r in p.rows[row:row + len(rows)]] == rows
        at, row = at + n, row + len(rows)

    for job in jobs:
        whole = tree(job, with_prefix=True)
        if len(whole[0]) <= budget:
            if p is None or p.cache or at + len(whole[0]) > p.tokens:
                p, at, row = next(passes), 0, 0
            check(*whole)
            continue
        chunks = [next(passes) for _ in range(0, len(job.prefix), budget)]
        got = np.concatenate([c.meta() for c in chunks], 1)
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
    assert len(layout.outputs) == sum(len(label_trie(b.candidates)) for j in jobs
                                      for b in j.branches)


def test_a_pass_padded_to_a_graph_size_keeps_its_columns_and_pads_with_lone_tokens():
    """meta(size): the pass's own columns unchanged, then tokens that see only themselves
    (id 0 at position 0), so padding changes no real token's attention."""
    rng = np.random.default_rng()
    [p] = plan([random_job(rng) for _ in range(3)], 10_000, int(rng.integers(1, 20))).passes
    size = p.tokens + int(rng.integers(1, 50))
    padded = p.meta(size)
    assert padded.shape == (5, size) and padded.dtype == np.int32
    assert (padded[:, :p.tokens] == p.meta()).all()
    pad = np.arange(p.tokens, size)
    assert (padded[IDS, p.tokens:] == 0).all() and (padded[POS, p.tokens:] == 0).all()
    for row in (LO_FULL, LO_SLIDE):
        assert (padded[row, p.tokens:] == pad).all()
    assert (padded[END, p.tokens:] == pad + 1).all()
    assert (p.meta(p.tokens - 1) == p.meta()).all()  # never cut
