"""Random token forests in pre-order, as the engine lays out passes, and random score jobs:
test inputs."""

from __future__ import annotations

import torch

from decider.engines import Branch, ScoreJob


def random_forest(sizes: list[int], branchy: bool) -> tuple[list[int], list[int]]:
    """Trees of the given sizes side by side in pre-order: (parents, positions).
    branchy: random parents (a forest of token trees), else chains."""
    parents, pos = [], []
    for n in sizes:
        base = len(parents)
        order = [-1]
        for i in range(1, n):  # a random pre-order tree: a parent on the path to i - 1
            path = [i - 1]
            while order[path[-1]] >= 0:
                path.append(order[path[-1]])
            order.append(path[draw(0, len(path) - 1)] if branchy else i - 1)
        for p in order:
            parents.append(base + p if p >= 0 else -1)
            pos.append(pos[base + p] + 1 if p >= 0 else 0)
    return parents, pos


def draw(lo: int, hi: int) -> int:
    """A random integer in [lo, hi]."""
    return int(torch.randint(lo, hi + 1, ()))


def ancestors(parents: list[int], i: int) -> set[int]:
    """i and every token above it."""
    out = {i}
    while parents[i] >= 0:
        i = parents[i]
        out.add(i)
    return out


def forest_inputs(sizes: list[int], branchy: bool, hq: int, hkv: int, d: int,
                  window: int | None, n_cached: int = 0, device: str = "cpu",
                  dtype: torch.dtype = torch.float32) -> tuple[tuple, dict]:
    """(q, k, v, lo, end) of a random forest pass and the keyword arguments of attend():
    a cached prefix of n_cached positions in ring order (rotated, two slots empty)."""
    from decider.kernels.attention import tree_bounds

    parents, pos = random_forest(sizes, branchy)
    pos = [p + n_cached for p in pos]
    lo, end = (torch.from_numpy(a).to(device) for a in tree_bounds(parents, pos, window))
    t = len(parents)
    q, k, v = (torch.randn(t, h, d, device=device, dtype=dtype) for h in (hq, hkv, hkv))
    kwargs = {"window": window}
    if n_cached:
        cpos = torch.cat([torch.arange(n_cached).roll(draw(0, n_cached - 1)),
                          torch.tensor([-1, -1])]).int().to(device)
        ck, cv = (torch.randn(n_cached + 2, hkv, d, device=device, dtype=dtype)
                  for _ in range(2))
        kwargs |= {"cache": (ck, cv, cpos), "q_pos": torch.tensor(pos, device=device)}
    return (q, k, v, lo, end), kwargs


def random_job(rng) -> ScoreJob:
    """A job of 1-40 prefix tokens and 1-3 branches, each with 2-5 candidate labels of 1-3
    tokens (none a prefix of another), from the numpy generator rng."""

    def toks(n):
        return tuple(int(t) for t in rng.integers(3, 500, n))

    branches = []
    for _ in range(int(rng.integers(1, 4))):
        cands = {toks(int(rng.integers(1, 4))) for _ in range(int(rng.integers(2, 6)))}
        # no candidate a prefix of another
        cands = [c for c in cands if not any(d != c and d[:len(c)] == c for d in cands)]
        branches.append(Branch(toks(int(rng.integers(1, 6))), tuple(cands)))
    return ScoreJob((2, *toks(int(rng.integers(0, 40)))), tuple(branches))
