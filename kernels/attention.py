"""Prefill attention over a pass of token trees: torch reference (fp32 softmax).

A pass packs several sequences, each a tree of tokens laid out in pre-order (the shared
prefix a chain, each question's suffix a chain off its end, label-trie nodes off that),
so token j is an ancestor-or-self of token i exactly when j <= i < end[j]. Query i sees
pass key j when lo[i] <= j <= i < end[j]: lo[i] is its sequence's first token (full
attention) or its oldest ancestor inside the sliding window (ancestors' positions rise
one by one along the path, so every ancestor from lo[i] on is inside it). A pass may
also read a cached prefix of its one sequence: slots with positions (-1: empty), in any
order (a ring), all before every query; a sliding layer sees those less than `window`
positions back. GQA: query head h reads key/value head h // (Hq // Hkv).
A Triton kernel of the same contract goes beside this one.
"""

from __future__ import annotations

import numpy as np
import torch

from . import dispatch

BLOCK_Q = 256  # queries per block: bounds the [heads, block, keys] score matrix


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
              scale: float) -> torch.Tensor:
    """q [T, Hq, D], k and v [S, Hkv, D], mask [T, S] bool (True: attend) -> [T, Hq, D].
    Every query must be allowed at least one key."""
    t, hq, d = q.shape
    hkv = k.shape[1]
    qg = q.reshape(t, hkv, hq // hkv, d).permute(1, 2, 0, 3)  # [Hkv, G, T, D]
    kt, vt = k.permute(1, 2, 0), v.permute(1, 0, 2)  # [Hkv, D, S], [Hkv, S, D]
    out = torch.empty_like(qg)
    for i in range(0, t, BLOCK_Q):
        s = torch.matmul(qg[:, :, i:i + BLOCK_Q], kt[:, None]).float() * scale
        s = s.masked_fill(~mask[i:i + BLOCK_Q], float("-inf"))
        p = torch.softmax(s, dim=-1).to(v.dtype)
        out[:, :, i:i + BLOCK_Q] = torch.matmul(p, vt[:, None])
    return out.permute(2, 0, 1, 3).reshape(t, hq, d)


def pass_mask(lo: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """[T, T] bool: query i sees key j when lo[i] <= j <= i < end[j]."""
    j = torch.arange(len(lo), device=lo.device)
    return (j[None, :] >= lo[:, None]) & (j[None, :] <= j[:, None]) & (j[:, None] < end[None, :])


def cache_mask(q_pos: torch.Tensor, cache_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """[T, S] bool: filled cache slots, within the window when there is one."""
    mask = (cache_pos >= 0)[None, :].expand(len(q_pos), -1)
    return mask & (q_pos[:, None] - cache_pos[None, :] < window) if window else mask


def tree_bounds(parents: list[int], pos: list[int], window: int | None) -> tuple[np.ndarray,
                                                                                  np.ndarray]:
    """(lo, end) int32 of one tree in pre-order (parents[i] < i, -1 at the root; a child
    one position after its parent): the definition the engine's fast layout must equal."""
    t = len(parents)
    end = np.arange(1, t + 1)
    for i in reversed(range(t)):
        if parents[i] >= 0:
            end[parents[i]] = max(end[parents[i]], end[i])
    lo = np.zeros(t, dtype=np.int64)
    for i in range(t):
        a = i  # walk up to the oldest ancestor inside the window
        while parents[a] >= 0 and (window is None or pos[i] - pos[parents[a]] < window):
            a = parents[a]
        lo[i] = a
    return lo.astype(np.int32), end.astype(np.int32)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lo: torch.Tensor,
           end: torch.Tensor, scale: float, *, cache: tuple | None = None,
           q_pos: torch.Tensor | None = None, window: int | None = None,
           rows: torch.Tensor | None = None) -> torch.Tensor:
    """The pass contract above; cache: (k [S, Hkv, D], v, pos [S]) with q_pos [T].
    rows: the pass tokens q's queries are (int32, best ascending), when not every token
    in order (lo, end, q_pos stay per token). On CUDA the Triton kernel, elsewhere this
    reference."""
    if dispatch.triton(q):
        from .attention_triton import attention_triton  # Triton only where it compiles

        return attention_triton(q, k, v, lo, end, scale, cache=cache, q_pos=q_pos,
                                window=window, rows=rows)
    mask = pass_mask(lo, end)
    if rows is not None:
        rows = rows.long()
        mask = mask[rows]
    if cache is not None:
        ck, cv, cpos = cache
        k, v = torch.cat([ck, k]), torch.cat([cv, v])
        mask = torch.cat([cache_mask(q_pos if rows is None else q_pos[rows], cpos, window),
                          mask], 1)
    return attention(q, k, v, mask, scale)
