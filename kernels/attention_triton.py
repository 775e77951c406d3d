"""Prefill attention: Triton kernel (online softmax, fp32 accumulation).

The masks it covers are those of attention.py built by `position_mask` over
`varlen_visible`: several sequences packed in one batch (cu_seqlens), each query seeing
the keys of its own sequence at or before its position and, with a sliding window, fewer
than `window` positions back. Keys carry explicit positions, so a sequence's keys may be
a cached prefix (ring slots in any order) followed by the new tokens. Token trees
(tree_visible): an optional [T, T] mask narrows what the new tokens see of each other,
as the engine's branch passes need. GQA: query head h reads key/value head
h // (Hq // Hkv).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, q_pos_ptr, k_pos_ptr, cu_q_ptr, cu_k_ptr, tree_ptr,
    qk_scale, window,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    stride_tree,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HAS_WINDOW: tl.constexpr,
    HAS_TREE: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid_m, seq, head = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_start = tl.load(cu_q_ptr + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_start
    if pid_m * BLOCK_M >= q_len:  # the grid covers the longest sequence
        return
    k_start = tl.load(cu_k_ptr + seq)
    k_len = tl.load(cu_k_ptr + seq + 1) - k_start
    kv_head = head // GROUP

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rd = tl.arange(0, BLOCK_D)
    m_ok = rm < q_len
    d_ok = rd < HEAD_DIM
    q = tl.load(q_ptr + (q_start + rm)[:, None] * stride_qt + head * stride_qh + rd[None, :],
                mask=m_ok[:, None] & d_ok[None, :], other=0.0)  # [BM, BD]
    q_pos = tl.load(q_pos_ptr + q_start + rm, mask=m_ok, other=0)
    q_hi = tl.max(tl.where(m_ok, q_pos, -2147483647), 0)
    q_lo = tl.min(tl.where(m_ok, q_pos, 2147483647), 0)

    # a finite floor: rows that see no key of a block stay at exp2(-inf - floor) = 0
    m_i = tl.full((BLOCK_M,), -1.0e30, tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    for n0 in range(0, k_len, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        n_ok = rn < k_len
        k_pos = tl.load(k_pos_ptr + k_start + rn, mask=n_ok, other=0)
        k_lo = tl.min(tl.where(n_ok, k_pos, 2147483647), 0)
        k_hi = tl.max(tl.where(n_ok, k_pos, -2147483647), 0)
        # skip blocks wholly in the future or wholly out of the window of every query
        live = k_lo <= q_hi
        if HAS_WINDOW:
            live = live & (k_hi > q_lo - window)
        if live:
            kv_mask = n_ok[:, None] & d_ok[None, :]
            k = tl.load(k_ptr + (k_start + rn)[:, None] * stride_kt + kv_head * stride_kh
                        + rd[None, :], mask=kv_mask, other=0.0)  # [BN, BD]
            v = tl.load(v_ptr + (k_start + rn)[:, None] * stride_vt + kv_head * stride_vh
                        + rd[None, :], mask=kv_mask, other=0.0)
            if IEEE:  # fp32 operands: no TF32 rounding on the GPU
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            diff = q_pos[:, None] - k_pos[None, :]
            ok = n_ok[None, :] & (diff >= 0)
            if HAS_WINDOW:
                ok = ok & (diff < window)
            if HAS_TREE:  # the last q_len keys are the new tokens, in query order
                j = rn - (k_len - q_len)
                new = n_ok & (j >= 0)
                seen = tl.load(tree_ptr + (q_start + rm)[:, None] * stride_tree
                               + (q_start + j)[None, :], mask=m_ok[:, None] & new[None, :],
                               other=0)
                ok = ok & ((seen != 0) | ~new[None, :])
            s = tl.where(ok, s * qk_scale, float("-inf"))  # log2 units
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp2(s - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            if IEEE:
                acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision="ieee")
            else:
                acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
            m_i = m_new
    # a query that sees no key: 0 / 0, NaN as in the reference; padding rows divide by 1
    out = acc / tl.where(m_ok, l_i, 1.0)[:, None]
    tl.store(o_ptr + (q_start + rm)[:, None] * stride_ot + head * stride_oh + rd[None, :],
             out.to(o_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


def attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                     q_pos: torch.Tensor, k_pos: torch.Tensor, scale: float,
                     window: int | None = None, tree: torch.Tensor | None = None,
                     max_seqlen_q: int | None = None) -> torch.Tensor:
    """q [T, Hq, D], k and v [S, Hkv, D] (unit stride along D), cu_seqlens_q [B+1] and
    cu_seqlens_k [B+1] int32 (sequence b: queries cu_q[b]:cu_q[b+1], keys
    cu_k[b]:cu_k[b+1]), q_pos [T] and k_pos [S] integer positions -> [T, Hq, D] in q.dtype.
    Key j is visible to query i of its sequence when 0 <= q_pos[i] - k_pos[j] (< window).
    tree [T, T] bool: each sequence's last q_len keys are its queries' own tokens, and query
    i sees new token j only where tree[i, j] (cached keys: positions alone).
    max_seqlen_q: the longest query run (computed, with a host sync, when not given)."""
    if q.dim() != 3 or k.dim() != 3 or k.shape != v.shape or k.shape[2] != q.shape[2]:
        raise ValueError(f"q must be [T, Hq, D] and k, v [S, Hkv, D]; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    t, hq, d = q.shape
    s, hkv, _ = k.shape
    if hkv == 0 or hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hkv})")
    if d > 256:
        raise ValueError(f"head dim {d} > 256")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float16, torch.bfloat16,
                                                              torch.float32):
        raise ValueError(f"q, k, v must share one of fp16, bf16, fp32; got {q.dtype}, "
                         f"{k.dtype}, {v.dtype}")
    b = cu_seqlens_q.numel() - 1
    if b < 0 or cu_seqlens_k.numel() != b + 1:
        raise ValueError("cu_seqlens_q and cu_seqlens_k must both be [B+1]")
    if cu_seqlens_q.dtype != torch.int32 or cu_seqlens_k.dtype != torch.int32:
        raise ValueError("cu_seqlens must be int32")
    if q_pos.shape != (t,) or k_pos.shape != (s,):
        raise ValueError(f"q_pos must be [{t}] and k_pos [{s}]")
    if tree is not None and (tree.shape != (t, t) or tree.dtype != torch.bool):
        raise ValueError(f"tree must be bool [{t}, {t}]")
    if window is not None and window < 1:
        raise ValueError(f"window must be positive, got {window}")
    q, k, v = (x if x.stride(2) == 1 else x.contiguous() for x in (q, k, v))
    tensors = (k, v, cu_seqlens_q, cu_seqlens_k, q_pos, k_pos)
    if any(x.device != q.device for x in tensors):
        raise ValueError("all operands must be on one device")
    q_pos, k_pos = q_pos.contiguous(), k_pos.contiguous()
    if tree is not None:
        if tree.device != q.device:
            raise ValueError("all operands must be on one device")
        tree = (tree if tree.stride(1) == 1 else tree.contiguous()).view(torch.uint8)
    out = torch.empty(t, hq, d, dtype=q.dtype, device=q.device)
    if max_seqlen_q is None:
        max_seqlen_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max()) if b else 0
    if t == 0 or max_seqlen_q == 0:
        return out
    block_d = max(16, triton.next_power_of_2(d))
    block_m, block_n = (64, 32) if block_d > 128 else (64, 64)
    grid = (triton.cdiv(max_seqlen_q, block_m), b, hq)
    _attention_kernel[grid](
        q, k, v, out, q_pos, k_pos, cu_seqlens_q, cu_seqlens_k,
        q_pos if tree is None else tree,  # unread without a tree
        scale * LOG2E, window or 0,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), 0 if tree is None else tree.stride(0),
        GROUP=hq // hkv, HEAD_DIM=d, HAS_WINDOW=window is not None, HAS_TREE=tree is not None,
        IEEE=q.dtype == torch.float32, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        num_warps=8 if block_d > 128 else 4,
    )
    return out
