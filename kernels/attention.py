"""Prefill attention with an explicit mask: torch reference (fp32 softmax).

Queries attend to the keys their mask allows. The masks cover what the engine needs:
several sequences packed in one batch (varlen), causal order by position, a sliding
window, and token trees (a branch's label paths each see only their own ancestors).
GQA: query head h reads key/value head h // (Hq // Hkv). A Triton kernel of the same
contract goes beside this one.
"""

from __future__ import annotations

import torch

BLOCK_Q = 256  # queries per block: bounds the [heads, block, keys] score matrix


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
              scale: float) -> torch.Tensor:
    """q [T, Hq, D], k and v [S, Hkv, D], mask [T, S] bool (True: attend) -> [T, Hq, D].
    Every query must be allowed at least one key."""
    t, hq, d = q.shape
    hkv = k.shape[1]
    qg = q.view(t, hkv, hq // hkv, d).permute(1, 2, 0, 3)  # [Hkv, G, T, D]
    kt, vt = k.permute(1, 2, 0), v.permute(1, 0, 2)  # [Hkv, D, S], [Hkv, S, D]
    out = torch.empty_like(qg)
    for i in range(0, t, BLOCK_Q):
        s = torch.matmul(qg[:, :, i:i + BLOCK_Q], kt[:, None]).float() * scale
        s = s.masked_fill(~mask[i:i + BLOCK_Q], float("-inf"))
        p = torch.softmax(s, dim=-1).to(v.dtype)
        out[:, :, i:i + BLOCK_Q] = torch.matmul(p, vt[:, None])
    return out.permute(2, 0, 1, 3).reshape(t, hq, d)


def position_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, visible: torch.Tensor,
                  window: int | None) -> torch.Tensor:
    """visible [T, S] narrowed to keys at or before the query's position and, with a
    sliding window, fewer than `window` positions back (the query itself included)."""
    diff = q_pos[:, None] - k_pos[None, :]
    mask = visible & (diff >= 0)
    return mask & (diff < window) if window else mask


def varlen_visible(seq_ids: torch.Tensor) -> torch.Tensor:
    """[T, T]: tokens packed from several sequences see only their own sequence."""
    return seq_ids[:, None] == seq_ids[None, :]


def tree_visible(parents: list[int]) -> torch.Tensor:
    """[T, T]: token i sees itself and its ancestors (parents[i] < i, or -1 for a root)."""
    t = len(parents)
    vis = torch.eye(t, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            vis[i] |= vis[p]
    return vis
