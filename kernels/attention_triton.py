"""Prefill attention over a pass of token trees: Triton kernel of the contract in
attention.py (online softmax, fp32 accumulation).

One program per block of rows and key/value head, a row being one query token at one of
the query heads sharing that key/value head (GQA): each key/value tile is loaded once
for all of them. Its keys run from the smallest lo[i] of the block to its last token, so
a packed pass costs each block only its own sequence (and, in a sliding layer, its
window); the (lo, end) test does the rest, on the key blocks that some row of the block
does not see whole (the diagonal, a window's edge, another branch). A cached prefix,
when given, is read first, straight from the cache's slots.

A long causal sequence gives its last query blocks many more keys than its first ones.
A full-attention launch may split a block's keys over up to SPLITS programs (never
fewer than MIN_PER key blocks each): each writes its partial (max, sum, output) to a
workspace and counts itself in; the last to arrive combines the parts in a fixed order
(the result does not depend on which came last) and resets the count. Such launches
start with the last query blocks, the longest of a causal sequence, so that the short
ones fill in behind them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import arrivals
from .attention_tiles import choose
from .pdl import launch_options, let_next_launch, wait_for_inputs

LOG2E = 1.4426950408889634
MAX_BLOCKS = arrivals.SLOTS  # query blocks (times KV heads) of one split launch
# Full attention starts the longest query blocks first up to this many rows (one causal
# sequence of 8192 tokens: 412 -> 291 us); past them a pass is a daemon's batch of short
# sequences, where that order cost 18% (128 x 256 tokens)
LONGEST_FIRST_ROWS = 32768


@triton.jit
def _scores(q, k, IEEE: tl.constexpr):
    """q [BM, BD] against a key block k [BN, BD]: [BM, BN] fp32."""
    if IEEE:  # fp32 operands: no TF32 rounding on the GPU
        return tl.dot(q, tl.trans(k), input_precision="ieee")
    return tl.dot(q, tl.trans(k))


@triton.jit
def _fold(s, v, m_i, l_i, acc, IEEE: tl.constexpr):
    """One key block's scores (log2 units) and values folded into the running (max, sum,
    output) of the online softmax."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha
    acc = acc * alpha[:, None]
    m_i = m_new
    p = tl.exp2(s - m_i[:, None])
    l_i = l_i + tl.sum(p, 1)
    if IEEE:
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision="ieee")
    else:
        acc = tl.dot(p.to(v.dtype), v, acc)
    return m_i, l_i, acc


@triton.jit
def _attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lo_ptr, end_ptr, rows_ptr,
    ck_ptr, cv_ptr, cpos_ptr, qpos_ptr, work_ptr, count_ptr,
    T, TQ, S, qk_scale, window, BLOCKS,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    stride_ckt, stride_ckh, stride_cvt, stride_cvh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HAS_CACHE: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_ROWS: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    SPLITS: tl.constexpr, MIN_PER: tl.constexpr, LONGEST_FIRST: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_inputs(PDL)
    kv_head = tl.program_id(1)
    pid_m = tl.program_id(0) // SPLITS
    if LONGEST_FIRST:  # a causal sequence's last blocks are its longest
        pid_m = BLOCKS - 1 - pid_m
    part = tl.program_id(0) % SPLITS
    r = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # rows: (query, query head of the group)
    rm = r // GROUP
    head = kv_head * GROUP + r % GROUP
    rd = tl.arange(0, BLOCK_D)
    m_ok = rm < TQ
    d_ok = rd < HEAD_DIM
    if HAS_ROWS:  # the pass token each query is (best ascending: a block reads keys min..max)
        tok = tl.load(rows_ptr + rm, mask=m_ok, other=T)
        last = tl.max(tl.where(m_ok, tok, -1), 0) + 1
    else:
        tok = rm
        last = tl.minimum((pid_m * BLOCK_M + BLOCK_M - 1) // GROUP + 1, T)
    lo = tl.load(lo_ptr + tok, mask=m_ok, other=T)
    first = (tl.min(lo, 0) // BLOCK_N) * BLOCK_N
    # this program's share of the block's key blocks: none past the block's parts
    per = tl.maximum(tl.cdiv(tl.cdiv(last - first, BLOCK_N), SPLITS), MIN_PER) * BLOCK_N
    parts = tl.cdiv(last - first, per)
    keys_lo = first + part * per
    keys_hi = tl.minimum(keys_lo + per, last)
    busy = part < parts
    q_ok = rm < tl.where(busy, TQ, 0)  # an idle program loads nothing
    q = tl.load(q_ptr + rm[:, None] * stride_qt + head[:, None] * stride_qh + rd[None, :],
                mask=q_ok[:, None] & d_ok[None, :], other=0.0)  # [BM, BD]

    # a finite floor: rows that see no key of a block stay at exp2(-inf - floor) = 0
    m_i = tl.full((BLOCK_M,), -1.0e30, tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    if HAS_CACHE:  # the cached prefix of the pass's one sequence (SPLITS 1): first
        q_pos = tl.load(qpos_ptr + tok, mask=m_ok, other=0)
        for n0 in range(0, S, BLOCK_N):
            rn = n0 + tl.arange(0, BLOCK_N)
            n_ok = rn < S
            c_pos = tl.load(cpos_ptr + rn, mask=n_ok, other=-1)
            ok = (c_pos >= 0)[None, :] & m_ok[:, None]
            if HAS_WINDOW:
                ok = ok & (q_pos[:, None] - c_pos[None, :] < window)
            kv_mask = n_ok[:, None] & d_ok[None, :]
            k = tl.load(ck_ptr + rn[:, None] * stride_ckt + kv_head * stride_ckh + rd[None, :],
                        mask=kv_mask, other=0.0)  # [BN, BD]
            v = tl.load(cv_ptr + rn[:, None] * stride_cvt + kv_head * stride_cvh + rd[None, :],
                        mask=kv_mask, other=0.0)
            s = tl.where(ok, _scores(q, k, IEEE) * qk_scale, float("-inf"))
            m_i, l_i, acc = _fold(s, v, m_i, l_i, acc, IEEE)
    first_row = tl.min(tok, 0)
    lo_max = tl.max(lo, 0)  # T where the block has padding rows: every key block masked
    for n0 in range(keys_lo, keys_hi, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        n_ok = rn < T
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + rn[:, None] * stride_kt + kv_head * stride_kh + rd[None, :],
                    mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + rn[:, None] * stride_vt + kv_head * stride_vh + rd[None, :],
                    mask=kv_mask, other=0.0)
        end = tl.load(end_ptr + rn, mask=n_ok, other=0)
        s = _scores(q, k, IEEE) * qk_scale
        # a key block every row sees whole (each row's lo at or before it, it at or before
        # the first row's token, each key's subtree past the last) needs no mask: most
        # blocks of a long chain
        if (n0 < lo_max) | (n0 + BLOCK_N - 1 > first_row) | (tl.min(end, 0) < last):
            ok = (rn[None, :] >= lo[:, None]) & (rn[None, :] <= tok[:, None]) \
                & (tok[:, None] < end[None, :])
            s = tl.where(ok, s, float("-inf"))
        m_i, l_i, acc = _fold(s, v, m_i, l_i, acc, IEEE)
    let_next_launch(PDL)
    o_ptrs = o_ptr + rm[:, None] * stride_ot + head[:, None] * stride_oh + rd[None, :]
    o_mask = m_ok[:, None] & d_ok[None, :]
    if parts == 1:
        if part == 0:  # every query sees itself; padding rows divide by 1
            out = acc / tl.where(m_ok, l_i, 1.0)[:, None]
            tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=o_mask)
    elif busy:
        # the workspace: outputs [blocks, SPLITS, BM, BD], then (max, sum) [.., 2, BM]
        stat_ptr = work_ptr + tl.num_programs(1) * BLOCKS * SPLITS * BLOCK_M * BLOCK_D
        rr = tl.arange(0, BLOCK_M)
        block = kv_head * BLOCKS + pid_m
        slot = (block * SPLITS + part).to(tl.int64)
        tl.store(work_ptr + (slot * BLOCK_M + rr[:, None]) * BLOCK_D + rd[None, :], acc)
        tl.store(stat_ptr + slot * 2 * BLOCK_M + rr, m_i)
        tl.store(stat_ptr + slot * 2 * BLOCK_M + BLOCK_M + rr, l_i)
        tl.debug_barrier()  # every thread's part is written before the count says so
        if tl.atomic_add(count_ptr + block, 1, sem="acq_rel", scope="gpu") == parts - 1:
            out = _combine(work_ptr, stat_ptr, block.to(tl.int64) * SPLITS, parts, rr, rd,
                           BLOCK_M, BLOCK_D)
            tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=o_mask)
            tl.store(count_ptr + block, 0)


@triton.jit
def _combine(part_ptr, stat_ptr, slot0, parts, rr, rd, BLOCK_M: tl.constexpr,
             BLOCK_D: tl.constexpr):
    """The output [BM, BD] of a query block from its parts' (max, sum, output), in part
    order. Padding rows' sums are 0 in every part: they divide by 1."""
    m_all = tl.full((BLOCK_M,), -1.0e30, tl.float32)
    for p in range(0, parts):
        m_all = tl.maximum(m_all, tl.load(stat_ptr + (slot0 + p) * 2 * BLOCK_M + rr,
                                          cache_modifier=".cg"))
    l_all = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    for p in range(0, parts):
        stat = stat_ptr + (slot0 + p) * 2 * BLOCK_M + rr
        f = tl.exp2(tl.load(stat, cache_modifier=".cg") - m_all)
        l_all += f * tl.load(stat + BLOCK_M, cache_modifier=".cg")
        acc += f[:, None] * tl.load(
            part_ptr + ((slot0 + p) * BLOCK_M + rr[:, None]) * BLOCK_D + rd[None, :],
            cache_modifier=".cg")
    return acc / tl.where(l_all > 0, l_all, 1.0)[:, None]


def attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lo: torch.Tensor,
                     end: torch.Tensor, scale: float, *, cache: tuple | None = None,
                     q_pos: torch.Tensor | None = None, window: int | None = None,
                     rows: torch.Tensor | None = None, out: torch.Tensor | None = None,
                     blocks: tuple[int, ...] | None = None) -> torch.Tensor:
    """q [T, Hq, D], k and v [T, Hkv, D] (any row and head strides, unit stride along D;
    views into one fused QKV output do), lo and end [T] int32 -> q.shape in q.dtype.
    rows: int32 [Tq], the pass tokens that q's Tq queries are (best ascending), instead
    of every token in order; lo, end and q_pos stay per token.
    cache: (k [S, Hkv, D], v, pos [S]) with q_pos [T]; window: the sliding window (None:
    full attention), which the kernel only needs for the cache (lo encodes it for the
    pass's own keys). blocks: (BLOCK_M, BLOCK_N, warps, stages[, splits, min_per])
    instead of the built-in choice (for tuning; splits need no cache). Launches nothing
    that syncs with the host, so a CUDA graph can hold it."""
    if rows is not None and (rows.dim() != 1 or rows.dtype != torch.int32):
        raise ValueError(f"rows must be int32 [Tq], got {rows.dtype} {tuple(rows.shape)}")
    if q.dim() != 3 or k.dim() != 3 or k.shape != v.shape or k.shape[2] != q.shape[2] \
            or q.shape[0] != (k.shape[0] if rows is None else len(rows)):
        raise ValueError(f"q must be [T, Hq, D] (or [rows, Hq, D]) and k, v [T, Hkv, D]; got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    tq = q.shape[0]
    t, hq, d = k.shape[0], q.shape[1], q.shape[2]
    hkv = k.shape[1]
    if hkv == 0 or hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hkv})")
    if d > 512:
        raise ValueError(f"head dim {d} > 512")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float16, torch.bfloat16,
                                                              torch.float32):
        raise ValueError(f"q, k, v must share one of fp16, bf16, fp32; got {q.dtype}, "
                         f"{k.dtype}, {v.dtype}")
    if lo.shape != (t,) or end.shape != (t,) or lo.dtype != torch.int32 \
            or end.dtype != torch.int32:
        raise ValueError(f"lo and end must be int32 [{t}]")
    if any(x.stride(2) != 1 for x in (q, k, v)):
        raise ValueError("q, k, v need unit stride along the head dim")
    if window is not None and window < 1:
        raise ValueError(f"window must be positive, got {window}")
    if cache is not None:
        ck, cv, cpos = cache
        if ck.shape != cv.shape or ck.shape[1:] != k.shape[1:] or cpos.shape != ck.shape[:1] \
                or ck.dtype != q.dtype or q_pos is None or q_pos.shape != (t,):
            raise ValueError("cache must be (k [S, Hkv, D], v [S, Hkv, D], pos [S]) in q's "
                             "dtype, with q_pos [T]")
        if ck.stride(2) != 1 or cv.stride(2) != 1:
            raise ValueError("the cache needs unit stride along the head dim")
    else:
        ck = cv = k
        cpos = q_pos = lo  # unread without a cache
    tokens = lo if rows is None else rows  # unread without rows
    if any(x.device != q.device for x in (k, v, lo, end, ck, cv, cpos, q_pos, tokens)):
        raise ValueError("all operands must be on one device")
    if out is None:
        out = torch.empty(tq, hq, d, dtype=q.dtype, device=q.device)
    if tq == 0:
        return out
    block_d = max(16, triton.next_power_of_2(d))
    n_rows = tq * (hq // hkv)
    full = window is None and cache is None
    blocks = blocks or choose(n_rows, block_d, q.dtype, full)
    block_m, block_n, warps, stages = blocks[:4]
    splits, min_per = blocks[4:] or (1, 1)
    n_blocks = triton.cdiv(n_rows, block_m)
    if splits > 1 and (cache is not None or n_blocks * hkv > MAX_BLOCKS):
        raise ValueError(f"{splits} splits need no cache and at most {MAX_BLOCKS} query "
                         f"blocks, got {n_blocks * hkv}")
    # each split block's parts: outputs [splits, BM, BD] and (max, sum) [splits, 2, BM]
    work = torch.empty(n_blocks * hkv * splits * block_m * (block_d + 2) if splits > 1 else 0,
                       dtype=torch.float32, device=q.device)
    _attention_kernel[(n_blocks * splits, hkv)](
        q, k, v, out, lo, end, tokens, ck, cv, cpos, q_pos, work, arrivals.counts(q.device),
        t, tq, ck.shape[0] if cache is not None else 0, scale * LOG2E, window or 0, n_blocks,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), ck.stride(0), ck.stride(1), cv.stride(0), cv.stride(1),
        GROUP=hq // hkv, HEAD_DIM=d, HAS_CACHE=cache is not None,
        HAS_WINDOW=window is not None, HAS_ROWS=rows is not None,
        IEEE=q.dtype == torch.float32,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, num_warps=warps, num_stages=stages,
        SPLITS=splits, MIN_PER=min_per, LONGEST_FIRST=full and n_rows <= LONGEST_FIRST_ROWS,
        **launch_options(q),
    )
    return out
