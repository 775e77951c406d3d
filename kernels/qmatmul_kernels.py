"""The packed matmul's Triton kernels (qmatmul_triton.py launches them): each program
dequantizes a [BLOCK_N, BLOCK_K] tile of W in registers (nibble or int8 code, times the
group scale, plus the group offset for 4-bit), casts it to the activation dtype and
accumulates tl.dot in fp32. Nothing dequantized goes to memory, except by the dequantize
kernel, for the passes that multiply a dense copy."""

from __future__ import annotations

import triton
import triton.language as tl

from .fused_triton import gelu_tanh, tanh
from .pdl import let_next_launch, wait_for_inputs


@triton.jit
def weight_tile(codes_ptr, scale_ptr, offset_ptr, rn, k0, stride_cn, stride_sn,
                 BITS: tl.constexpr, GROUP: tl.constexpr, HAS_OFFSET: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BN, BK] of rows rn, columns k0.. (K contiguous in memory, as stored): dequantized
    in fp32, or (BITS 16) a dense weight's values in its own dtype."""
    if BITS == 16:
        k = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(codes_ptr + rn[:, None] * stride_cn + k[None, :])
    else:
        if BITS == 4:  # byte j holds columns 2j (low nibble) and 2j + 1 (high)
            kb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
            byte = tl.load(codes_ptr + rn[:, None] * stride_cn + kb[None, :])
            q = tl.interleave(byte & 15, byte >> 4).to(tl.float32)
        else:
            k = k0 + tl.arange(0, BLOCK_K)
            q = tl.load(codes_ptr + rn[:, None] * stride_cn + k[None, :]).to(tl.float32)
        if BITS == 4 and not HAS_OFFSET:  # symmetric: (code - 8) * scale
            q = q - 8.0
        # one scale (and offset) per row and group, broadcast in registers; an fp16 scale
        # widens to fp32 exactly
        if GROUP >= BLOCK_K:  # the tile lies in one group
            g = rn * stride_sn + k0 // GROUP  # [BN]
            w = q * tl.load(scale_ptr + g).to(tl.float32)[:, None]
            if HAS_OFFSET:
                w += tl.load(offset_ptr + g)[:, None]
        else:  # the tile holds BK // GROUP whole groups
            gk = k0 // GROUP + tl.arange(0, BLOCK_K // GROUP)
            g = rn[:, None] * stride_sn + gk[None, :]  # [BN, BK / G]
            w = tl.reshape(q, (BLOCK_N, BLOCK_K // GROUP, GROUP)) \
                * tl.load(scale_ptr + g).to(tl.float32)[:, :, None]
            if HAS_OFFSET:
                w += tl.load(offset_ptr + g)[:, :, None]
            w = tl.reshape(w, (BLOCK_N, BLOCK_K))
    return w


@triton.jit
def _store(y_ptr, acc, rm, pid_n, M, N, stride_ym, GELU: tl.constexpr, BLOCK_M: tl.constexpr,
           BLOCK_N: tl.constexpr):
    """A finished fp32 tile of columns pid_n * BN..: stored as it is, or (GELU) each
    interleaved (gate, up) column pair as gelu_tanh(gate) * up, in columns pid_n * BN / 2.."""
    m_ok = (rm < M)[:, None]
    if GELU:
        g, u = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N // 2, 2)))
        rn = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :],
                 (gelu_tanh(g) * u).to(y_ptr.dtype.element_ty), mask=m_ok & (rn < N // 2)[None, :])
    else:
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=m_ok & (rn < N)[None, :])


@triton.jit
def _qmatmul_kernel(
    x_ptr, codes_ptr, scale_ptr, offset_ptr, rows_ptr, y_ptr, z_ptr, count_ptr,
    M, N, K,
    stride_xm, stride_cn, stride_sn, stride_ym,
    BITS: tl.constexpr, GROUP: tl.constexpr, HAS_OFFSET: tl.constexpr, HAS_ROWS: tl.constexpr,
    IEEE: tl.constexpr, LSE: tl.constexpr, GELU: tl.constexpr, SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
    SOFTCAP: tl.constexpr = 0.0,
):
    """y = x @ W.T (GELU: then gelu_tanh(gate) * up of W's interleaved gate and up rows);
    or (LSE) per row and column block, the max of its logits in y and the sum of their
    exp(logit - max) in z, at [row, program along N] (SOFTCAP > 0: of the logits
    softcapped first, SOFTCAP * tanh(logit / SOFTCAP)). HAS_ROWS: W is the rows rows_ptr[N]
    of the packed weight (label rows of a head).

    SPLIT_K > 1: program (m, n, s) sums the s-th K slice into z [SPLIT_K, M, N] (fp32)
    and counts itself in count_ptr[tile]; the tile's last program adds the slices up in
    a fixed order (the result does not depend on which program came last), writes y and
    resets the count for the next launch."""
    wait_for_inputs(PDL)
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    # rows past N read row 0 instead of masking every load: their columns are never stored
    rn_safe = tl.where(n_ok, rn, 0)
    if HAS_ROWS:
        rn_safe = tl.load(rows_ptr + rn_safe)
    k_slice = K // SPLIT_K  # the launcher picks BLOCK_K dividing it
    k_first = tl.program_id(2) * k_slice
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_first, k_first + k_slice, BLOCK_K):
        x = tl.load(x_ptr + rm[:, None] * stride_xm + (k0 + rk)[None, :], mask=m_ok[:, None],
                    other=0.0)
        # (BITS 16: a dense weight already in x's dtype, dequantized for a large pass)
        w = weight_tile(codes_ptr, scale_ptr, offset_ptr, rn_safe, k0, stride_cn, stride_sn,
                         BITS, GROUP, HAS_OFFSET, BLOCK_N, BLOCK_K).to(x.dtype)
        w = tl.trans(w)  # [BK, BN]
        if IEEE:  # fp32 operands: no TF32 rounding on the GPU
            acc = tl.dot(x, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(x, w, acc)
    let_next_launch(PDL)
    mn_ok = m_ok[:, None] & n_ok[None, :]
    if LSE:
        if SOFTCAP > 0:
            acc = SOFTCAP * tanh(acc / SOFTCAP)
        s = tl.where(n_ok[None, :], acc, float("-inf"))
        top = tl.max(s, 1)
        tl.store(y_ptr + rm * stride_ym + pid_n, top, mask=m_ok)
        tl.store(z_ptr + rm * stride_ym + pid_n, tl.sum(tl.exp(s - top[:, None]), 1), mask=m_ok)
    elif SPLIT_K == 1:
        _store(y_ptr, acc, rm, pid_n, M, N, stride_ym, GELU, BLOCK_M, BLOCK_N)
    else:
        part = rm[:, None] * N + rn[None, :]
        tl.store(z_ptr + tl.program_id(2) * M * N + part, acc, mask=mn_ok)
        tl.debug_barrier()  # every thread's slice is written before the count says so
        tile = pid_m * tl.num_programs(1) + pid_n
        if tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu") == SPLIT_K - 1:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(SPLIT_K):
                acc += tl.load(z_ptr + s * M * N + part, mask=mn_ok, other=0.0,
                               cache_modifier=".cg")
            _store(y_ptr, acc, rm, pid_n, M, N, stride_ym, GELU, BLOCK_M, BLOCK_N)
            tl.store(count_ptr + tile, 0)


@triton.jit
def _dequantize_kernel(codes_ptr, scale_ptr, offset_ptr, w_ptr, N, stride_cn, stride_sn,
                       stride_wn, BITS: tl.constexpr, GROUP: tl.constexpr,
                       HAS_OFFSET: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    n_ok = rn < N
    w = weight_tile(codes_ptr, scale_ptr, offset_ptr, tl.where(n_ok, rn, 0), k0, stride_cn,
                     stride_sn, BITS, GROUP, HAS_OFFSET, BLOCK_N, BLOCK_K)
    k = k0 + tl.arange(0, BLOCK_K)
    tl.store(w_ptr + rn[:, None] * stride_wn + k[None, :], w.to(w_ptr.dtype.element_ty),
             mask=n_ok[:, None])


@triton.jit
def _lse_combine_kernel(top_ptr, total_ptr, out_ptr, COLS, BLOCK: tl.constexpr,
                        PDL: tl.constexpr):
    """out[row] = logsumexp of the row's column blocks: max + log(sum(total * exp(top -
    max)))."""
    wait_for_inputs(PDL)
    row = tl.program_id(0)
    peak = tl.full((BLOCK,), float("-inf"), tl.float32)
    for c0 in range(0, COLS, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        peak = tl.maximum(peak, tl.load(top_ptr + row * COLS + c, mask=c < COLS,
                                        other=float("-inf")))
    peak_all = tl.max(peak, 0)
    acc = tl.zeros((BLOCK,), tl.float32)
    for c0 in range(0, COLS, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        t = tl.load(top_ptr + row * COLS + c, mask=c < COLS, other=float("-inf"))
        acc += tl.load(total_ptr + row * COLS + c, mask=c < COLS, other=0.0) * tl.exp(t - peak_all)
    let_next_launch(PDL)
    tl.store(out_ptr + row, peak_all + tl.log(tl.sum(acc, 0)))
