"""Matmul against packed quantized weights: Triton kernels of the contract in qmatmul.py.

y = x @ dequant(W).T with W read as packed words: each program dequantizes a
[BLOCK_N, BLOCK_K] tile of W in registers (nibble or int8 code, times the group scale,
plus the group offset for 4-bit), casts it to the activation dtype and accumulates
tl.dot in fp32. Nothing dequantized goes to memory.

From LARGE_M rows (a pass of a thousand tokens or more) the arithmetic, not the weight
read, is the cost, and cuBLAS on a bf16 copy beats the fused kernel even after paying for
the copy (measured on the H200, docs/benchmarks.md): a layer's weight is then dequantized
by one kernel into a buffer (by the engine ahead of the layer, engines/dense_weights.py,
or here when none is given), and stays packed at rest. The fused gate/up projection
reads that buffer with this file's own kernel instead (up to DENSE_GELU_M rows), for
gelu*up in the epilogue.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import arrivals
from .fused_triton import gelu_mul, gelu_tanh
from .pdl import launch_options, let_next_launch, wait_for_inputs
from .qmatmul import QWeight

LARGE_M = 1024  # rows from which dequantize + cuBLAS wins
LARGE_W = 1 << 25  # ... for weights up to this many elements (not the 262k-row head)
# gate/up from LARGE_M rows: the Triton matmul on the dequantized weight, gelu*up in its
# epilogue, up to this many rows (it saves the [M, N] product's trip through memory, 8-10%
# on the 270M's gate/up); past them cuBLAS's speed wins even with a gelu kernel after it
DENSE_GELU_M = 8192


@triton.jit
def _weight_tile(codes_ptr, scale_ptr, offset_ptr, rn, k0, stride_cn, stride_sn,
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
        # one scale (and offset) per row and group, broadcast in registers
        if GROUP >= BLOCK_K:  # the tile lies in one group
            g = rn * stride_sn + k0 // GROUP  # [BN]
            w = q * tl.load(scale_ptr + g)[:, None]
            if HAS_OFFSET:
                w += tl.load(offset_ptr + g)[:, None]
        else:  # the tile holds BK // GROUP whole groups
            gk = k0 // GROUP + tl.arange(0, BLOCK_K // GROUP)
            g = rn[:, None] * stride_sn + gk[None, :]  # [BN, BK / G]
            w = tl.reshape(q, (BLOCK_N, BLOCK_K // GROUP, GROUP)) \
                * tl.load(scale_ptr + g)[:, :, None]
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
):
    """y = x @ W.T (GELU: then gelu_tanh(gate) * up of W's interleaved gate and up rows);
    or (LSE) per row and column block, the max of its logits in y and the sum of their
    exp(logit - max) in z, at [row, program along N]. HAS_ROWS: W is the rows rows_ptr[N]
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
        w = _weight_tile(codes_ptr, scale_ptr, offset_ptr, rn_safe, k0, stride_cn, stride_sn,
                         BITS, GROUP, HAS_OFFSET, BLOCK_N, BLOCK_K).to(x.dtype)
        w = tl.trans(w)  # [BK, BN]
        if IEEE:  # fp32 operands: no TF32 rounding on the GPU
            acc = tl.dot(x, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(x, w, acc)
    let_next_launch(PDL)
    mn_ok = m_ok[:, None] & n_ok[None, :]
    if LSE:
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
    w = _weight_tile(codes_ptr, scale_ptr, offset_ptr, tl.where(n_ok, rn, 0), k0, stride_cn,
                     stride_sn, BITS, GROUP, HAS_OFFSET, BLOCK_N, BLOCK_K)
    k = k0 + tl.arange(0, BLOCK_K)
    tl.store(w_ptr + rn[:, None] * stride_wn + k[None, :], w.to(w_ptr.dtype.element_ty),
             mask=n_ok[:, None])


@triton.jit
def _embed_tile(codes_ptr, scale_ptr, offset_ptr, ids, k0, stride_cn, stride_sn, s,
                BITS: tl.constexpr, GROUP: tl.constexpr, HAS_OFFSET: tl.constexpr,
                ROWS: tl.constexpr, BLOCK_K: tl.constexpr, DTYPE: tl.constexpr):
    """fp32 [ROWS, BK] of embedding rows ids: each value rounded to DTYPE, times s, rounded
    again (Gemma's scaled embedding, as the activation dtype computes it)."""
    # (BITS 16: a dense embedding, already in DTYPE)
    w = _weight_tile(codes_ptr, scale_ptr, offset_ptr, ids, k0, stride_cn, stride_sn, BITS,
                     GROUP, HAS_OFFSET, ROWS, BLOCK_K).to(DTYPE).to(tl.float32)
    return (w * s).to(DTYPE).to(tl.float32)


@triton.jit
def _embed_rms_norm_kernel(codes_ptr, scale_ptr, offset_ptr, ids_ptr, s_ptr, norm_ptr, x_ptr,
                           h_ptr, T, K, stride_cn, stride_sn, eps, BITS: tl.constexpr,
                           GROUP: tl.constexpr, HAS_OFFSET: tl.constexpr, ROWS: tl.constexpr,
                           BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    """x = the scaled embedding rows of ids (fp32), h = x / rms(x) * norm (in h's dtype):
    a pass over K that writes x and sums its squares, then one that writes h (the tiles
    made again from the codes, which the first pass left in the cache)."""
    wait_for_inputs(PDL)
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    r_ok = (r < T)[:, None]
    ids = tl.load(ids_ptr + r, mask=r < T, other=0).to(tl.int64)
    s = tl.load(s_ptr).to(tl.float32)
    dtype = h_ptr.dtype.element_ty
    squares = tl.zeros((ROWS,), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = _embed_tile(codes_ptr, scale_ptr, offset_ptr, ids, k0, stride_cn, stride_sn, s,
                        BITS, GROUP, HAS_OFFSET, ROWS, BLOCK_K, dtype)
        k = k0 + tl.arange(0, BLOCK_K)
        tl.store(x_ptr + r[:, None] * K + k[None, :], x, mask=r_ok)
        squares += tl.sum(x * x, 1)
    inv = tl.rsqrt(squares / K + eps)[:, None]
    let_next_launch(PDL)
    for k0 in range(0, K, BLOCK_K):
        x = _embed_tile(codes_ptr, scale_ptr, offset_ptr, ids, k0, stride_cn, stride_sn, s,
                        BITS, GROUP, HAS_OFFSET, ROWS, BLOCK_K, dtype)
        k = k0 + tl.arange(0, BLOCK_K)
        h = x * inv * tl.load(norm_ptr + k)[None, :]
        tl.store(h_ptr + r[:, None] * K + k[None, :], h.to(dtype), mask=r_ok)


Blocks = tuple[int, int, int, int, int, int]  # BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, split-K
DENSE_BLOCKS = (128, 256, 64, 8, 3, 1)  # the H200 sweep's best with gelu from 1024 rows
MAX_TILES = arrivals.SLOTS  # output tiles of one split-K launch


def _built_in(x: torch.Tensor, w: QWeight, n: int | None = None) -> Blocks:
    """The built-in tiles of x @ dequant(w).T (of n of w's rows)."""
    return _blocks(len(x), n or w.shape[0], w.shape[1], w.group, w.bits, x.element_size())


def _k_tiles(k: int, group: int) -> list[int]:
    """K tiles that divide K (no K masking) and hold whole groups or lie in one."""
    fits = [b for b in (128, 64, 32, 16) if k % b == 0 and (b % group == 0 or group % b == 0)]
    if not fits:
        raise ValueError(f"no K tile fits K={k} in groups of {group}")
    return fits


def _check_k_tile(k: int, bk: int, group: int, split: int = 1) -> None:
    """A K tile must divide each of the `split` K slices and hold whole groups or lie in
    one (the kernels neither mask K nor straddle a group)."""
    if k % (split * bk) or (bk % group and group % bk):
        raise ValueError(f"K tile {bk} does not divide K={k} / split {split} in groups of "
                         f"{group}")


def _k_tile(k: int, group: int) -> int:
    """The K tile of wide tiles: at most 64 where one fits."""
    fits = _k_tiles(k, group)
    return ([b for b in fits if b <= 64] or fits)[0]


def _operands(w: QWeight | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """codes, scale, offset as the kernels read them (the scale stands in for a missing
    offset, a dense weight for all three: the kernels do not read them)."""
    if isinstance(w, torch.Tensor):
        w = w.contiguous()
        return w, w, w
    scale = w.scale.contiguous()
    return w.codes.contiguous(), scale, scale if w.offset is None else w.offset.contiguous()


def _blocks(m: int, n: int, k: int, group: int, bits: int, itemsize: int = 2) -> Blocks:
    """Tiles for M rows (below LARGE_M; past it cuBLAS takes over), from the H200 sweep of
    scripts/bench_kernels.py on Gemma 3 270M shapes in CUDA graphs (docs/benchmarks.md):
    wide K tiles (few loop trips, each of which waits on memory: up to 128 bytes of codes
    a row), M tiles of half the rows up to 128 (64 for a weight of few rows, 32 where
    split-K already makes programs enough), narrow N tiles for few rows (programs enough
    to fill the GPU), and two K slices from K = 2048 (unless the tiles alone are more
    than the split-K counts hold: programs enough anyway). Past 16 rows fp32 operands
    (itemsize 4) take K tiles of at most 64, which keeps their pipelined tiles within the
    shared memory."""
    fits = _k_tiles(k, group)
    if m <= 16:  # label rows of the head, decode-like: weight-bandwidth bound
        return 16, 64, fits[0], 4, 3, 1
    bk = fits[0] if itemsize <= 2 else _k_tile(k, group)
    bm = min(128 if n >= 1024 else 64, max(32, triton.next_power_of_2(m) // 2))
    bn = (16 if m <= 128 else 32) * (2 if n >= 4096 else 1)
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    split = 2 if k >= 2048 and k % (2 * bk) == 0 and tiles <= MAX_TILES else 1
    if split > 1 and m <= 128:
        bm = 32
    wide = 8 * 128 // bits  # 128 bytes of codes a row
    if itemsize <= 2 and m <= 128 and wide > bk and k % (wide * split) == 0 \
            and wide % group == 0:
        bk = wide
    return bm, bn, bk, 8 if bm * bn >= 128 * 64 else 4, 3, split


def dequantize_triton(w: QWeight, dtype: torch.dtype,
                      tile: tuple[int, int, int] | None = None,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """[N, K] in `dtype` (into `out` when given), one kernel. tile: (BLOCK_N, BLOCK_K,
    warps) instead of the built-in choice: 16 rows of the widest K tile, 8 warps (the
    H200 sweep of scripts/bench_kernels.py on Gemma 3 270M weights: 1.7-3.2 us per weight
    against 2.2-3.9 for 64 rows of 64 columns, 4 warps)."""
    n, k = w.shape
    codes, scale, offset = _operands(w)
    if out is None:
        out = torch.empty(n, k, dtype=dtype, device=codes.device)
    elif out.shape != (n, k) or out.dtype != dtype or not out.is_contiguous():
        raise ValueError(f"out must be contiguous [{n}, {k}] in {dtype}")
    bn, bk, warps = tile or (16, _k_tiles(k, w.group)[0], 8)
    _check_k_tile(k, bk, w.group)
    _dequantize_kernel[(triton.cdiv(n, bn), k // bk)](
        codes, scale, offset, out, n, codes.stride(0), scale.stride(0), out.stride(0),
        BITS=w.bits, GROUP=w.group, HAS_OFFSET=w.offset is not None, BLOCK_N=bn, BLOCK_K=bk,
        num_warps=warps)
    return out


def embed_rms_norm_triton(w: QWeight | torch.Tensor, ids: torch.Tensor, scale: torch.Tensor,
                          norm: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """qmatmul.embed_rms_norm in one kernel: ids int32 [T] -> (x fp32 [T, K], h [T, K] in
    scale's dtype)."""
    k = w.shape[1]
    dtype = scale.dtype
    if ids.dim() != 1 or ids.dtype != torch.int32 or scale.shape != () \
            or norm.shape != (k,) or norm.dtype != torch.float32 or not norm.is_contiguous():
        raise ValueError(f"ids must be int32 [T], scale a scalar, norm contiguous fp32 [{k}]")
    dense = isinstance(w, torch.Tensor)
    if dense and w.dtype != dtype:
        raise ValueError(f"a dense embedding must be in scale's dtype {dtype}, got {w.dtype}")
    codes, scales, offset = _operands(w)
    bits, group = (16, 1) if dense else (w.bits, w.group)
    bk = _k_tiles(k, group)[0]
    t = len(ids)
    x = torch.empty(t, k, dtype=torch.float32, device=ids.device)
    h = torch.empty(t, k, dtype=dtype, device=ids.device)
    rows, warps = (1, 2) if t <= 256 else (4, 4)
    if t:
        _embed_rms_norm_kernel[(triton.cdiv(t, rows),)](
            codes, scales, offset, ids, scale, norm, x, h, t, k, codes.stride(0),
            scales.stride(0), eps, BITS=bits, GROUP=bk if dense else group,
            HAS_OFFSET=not dense and w.offset is not None, ROWS=rows, BLOCK_K=bk,
            num_warps=warps, **launch_options(ids))
    return x, h


def qmatmul_triton(x: torch.Tensor, w: QWeight, out: torch.Tensor | None = None,
                   blocks: Blocks | None = None, dense: torch.Tensor | None = None,
                   rows: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (fp16, bf16 or fp32; unit stride along K) @ dequant(w).T -> [M, N] in
    x.dtype, or into `out` when given: x.dtype or fp32 (the head's logits), any row stride
    (a column slice of a wider buffer). blocks: tiles to use instead of the built-in
    choice (for tuning; it also keeps the fused kernel at any M). dense: w already
    dequantized in x.dtype, for when the pass takes that path (`takes_dense`). rows: int32
    [N] indices of w's rows to multiply, read by the kernel (label rows of a head)."""
    x = _activations(x, w)
    m, n = x.shape[0], w.shape[0]
    if rows is not None:
        if rows.dim() != 1 or rows.dtype != torch.int32 or rows.device != x.device \
                or dense is not None:
            raise ValueError("rows must be int32 [N] on x's device, with no dense copy")
        n = len(rows)
    if out is not None and (out.shape != (m, n) or out.dtype not in (x.dtype, torch.float32)
                            or out.stride(1) != 1):
        raise ValueError(f"out must be [{m}, {n}] in {x.dtype} or fp32, unit column stride")
    if blocks is None and rows is None and takes_dense(m, w, x.dtype):
        y = torch.matmul(x, _dense(x, w, dense).T)
        return y if out is None else out.copy_(y)
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m and n:
        _launch(x, w, out, out, blocks or _built_in(x, w, n), rows=rows)
    return out


def qmatmul_gelu_triton(x: torch.Tensor, w: QWeight, blocks: Blocks | None = None,
                        dense: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ dequant(w).T, w's rows gate and up interleaved -> gelu_tanh(gate) * up
    [M, N / 2] in x.dtype, in the matmul's epilogue (from LARGE_M on the weight dequantized,
    or `dense`; past DENSE_GELU_M cuBLAS, then gelu_mul)."""
    x = _activations(x, w)
    m, n = x.shape[0], w.shape[0]
    if n % 2:
        raise ValueError(f"interleaved gate and up rows come in pairs, got {n} rows")
    if blocks is None and takes_dense(m, w, x.dtype):
        dense = _dense(x, w, dense)
        if m <= DENSE_GELU_M:
            return matmul_dense_triton(x, dense, gelu=True)
        return gelu_mul(torch.matmul(x, dense.T))
    out = torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
    if m and n:
        _launch(x, w, out, out, blocks or _built_in(x, w), gelu=True)
    return out


def _dense(x: torch.Tensor, w: QWeight, dense: torch.Tensor | None) -> torch.Tensor:
    """w dequantized in x.dtype: `dense` when given (checked), else now."""
    if dense is None:
        return dequantize_triton(w, x.dtype)
    if dense.shape != w.shape or dense.dtype != x.dtype or dense.device != x.device:
        raise ValueError(f"dense must be {list(w.shape)} in {x.dtype} on {x.device}, got "
                         f"{list(dense.shape)} in {dense.dtype}")
    return dense


def matmul_dense_triton(x: torch.Tensor, w: torch.Tensor, gelu: bool = False,
                        blocks: Blocks | None = None) -> torch.Tensor:
    """x [M, K] @ w.T for a dense w [N, K] in x.dtype (a large pass's dequantized weight)
    -> [M, N]; gelu: w's rows gate and up interleaved -> gelu_tanh(gate) * up [M, N / 2],
    in the epilogue."""
    (m, k), n = x.shape, w.shape[0]
    if w.dim() != 2 or w.shape[1] != k or w.dtype != x.dtype or w.device != x.device:
        raise ValueError(f"w must be [N, {k}] in {x.dtype} on {x.device}, got {w.dtype} "
                         f"{tuple(w.shape)}")
    out = torch.empty(m, n // 2 if gelu else n, dtype=x.dtype, device=x.device)
    if m and n:
        _launch(x if x.stride(1) == 1 else x.contiguous(), w, out, out,
                blocks or DENSE_BLOCKS, gelu=gelu)
    return out


def _activations(x: torch.Tensor, w: QWeight) -> torch.Tensor:
    """x checked against w, with unit stride along K."""
    k = w.shape[1]
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x must be [M, {k}], got {tuple(x.shape)}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"x must be fp16, bf16 or fp32, got {x.dtype}")
    parts = [w.codes, w.scale] + ([w.offset] if w.offset is not None else [])
    if any(t.device != x.device for t in parts):
        raise ValueError("x and the packed weight must be on one device")
    return x if x.stride(1) == 1 else x.contiguous()


def takes_dense(m: int, w: QWeight, dtype: torch.dtype) -> bool:
    """Whether a pass of m rows multiplies w dequantized (cuBLAS, or the gelu epilogue on
    the dense copy) rather than packed."""
    n, k = w.shape
    return m >= LARGE_M and n * k <= LARGE_W and dtype != torch.float32


def qmatmul_logsumexp(x: torch.Tensor, w: QWeight, out: torch.Tensor | None = None
                      ) -> torch.Tensor:
    """logsumexp over N of x @ dequant(w).T -> fp32 [M] (into `out` when given), never
    writing the [M, N] logits (the full-vocabulary normaliser of the tied head): the
    matmul leaves a (max, sum of exp) pair per row and column block, one more kernel
    combines each row's pairs."""
    x = _activations(x, w)
    m, n = len(x), w.shape[0]
    if out is None:
        out = torch.empty(m, dtype=torch.float32, device=x.device)
    if out.shape != (m,) or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"out must be contiguous fp32 [{m}]")
    # one K slice: each program's (max, sum of exp) pair needs its tile's whole sums; a
    # head's few rows stream the whole weight: 128 of its rows a program, two stages
    # (H200: 67 against 71 us, 16 rows of the 262,144 x 640 8-bit embedding)
    bm, bn, bk, warps, stages, _ = _built_in(x, w)
    blocks = (bm, 128, bk, warps, 2, 1) if m <= 16 else (bm, bn, bk, warps, stages, 1)
    cols = triton.cdiv(n, blocks[1])
    top = torch.empty(m, cols, dtype=torch.float32, device=x.device)
    total = torch.empty_like(top)
    if m:
        _launch(x, w, top, total, blocks, lse=True)
        _lse_combine_kernel[(m,)](top, total, out, cols, BLOCK=1024, **launch_options(x))
    return out


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


def _launch(x, w: QWeight | torch.Tensor, y, z, blocks: Blocks, lse: bool = False,
            gelu: bool = False, rows: torch.Tensor | None = None) -> None:
    """The matmul kernel on a packed weight (or `rows` of it), or on a dense [N, K] one in
    x's dtype."""
    m, k = x.shape
    n = w.shape[0] if rows is None else len(rows)
    codes, scale, offset = _operands(w)
    bm, bn, bk, warps, stages, split = blocks
    dense = isinstance(w, torch.Tensor)
    bits, group = (16, bk) if dense else (w.bits, w.group)  # dense: no groups to straddle
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn), split)
    _check_k_tile(k, bk, group, split)
    if split > 1:
        if lse or grid[0] * grid[1] > MAX_TILES:
            raise ValueError(f"split-K {split} does not fit {grid[0] * grid[1]} tiles")
        z = torch.empty(split, m, n, dtype=torch.float32, device=x.device)
    _qmatmul_kernel[grid](
        x, codes, scale, offset, scale if rows is None else rows, y, z,
        arrivals.counts(x.device), m, n, k,
        x.stride(0), codes.stride(0), scale.stride(0), y.stride(0),
        BITS=bits, GROUP=group, HAS_OFFSET=not dense and w.offset is not None,
        HAS_ROWS=rows is not None, IEEE=x.dtype == torch.float32, LSE=lse, GELU=gelu,
        SPLIT_K=split,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages,
        **launch_options(x),
    )
