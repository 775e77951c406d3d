"""Embedding lookups on the GPU: Triton kernels of embed.py's contracts, reading the
rows of a packed (or dense) table by token id."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import launch_options, let_next_launch, wait_for_inputs
from .qmatmul_kernels import weight_tile
from .qmatmul_tiles import k_tiles
from .qmatmul_triton import operands
from .qweight import QWeight


@triton.jit
def _embed_tile(codes_ptr, scale_ptr, offset_ptr, ids, k0, stride_cn, stride_sn, s,
                BITS: tl.constexpr, GROUP: tl.constexpr, HAS_OFFSET: tl.constexpr,
                ROWS: tl.constexpr, BLOCK_K: tl.constexpr, DTYPE: tl.constexpr):
    """fp32 [ROWS, BK] of embedding rows ids: each value rounded to DTYPE, times s, rounded
    again (Gemma's scaled embedding, as the activation dtype computes it)."""
    # (BITS 16: a dense embedding, already in DTYPE)
    w = weight_tile(codes_ptr, scale_ptr, offset_ptr, ids, k0, stride_cn, stride_sn, BITS,
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
    codes, scales, offset = operands(w)
    bits, group = (16, 1) if dense else (w.bits, w.group)
    bk = k_tiles(k, group)[0]
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


@triton.jit
def _per_layer_inputs_kernel(proj_ptr, codes_ptr, scale_ptr, offset_ptr, ids_ptr, norm_ptr,
                             out_ptr, T, stride_p, stride_o, stride_cn, stride_sn, eps, proj_scale,
                             row_scale, BITS: tl.constexpr, GROUP: tl.constexpr,
                             HAS_OFFSET: tl.constexpr, ROWS: tl.constexpr, P: tl.constexpr,
                             PDL: tl.constexpr):
    """ROWS tokens' slice of one layer (program axis 1): the projection's slice scaled and
    normed, plus the table's slice dequantized and scaled, times 2^-0.5."""
    wait_for_inputs(PDL)
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    r_ok = (r < T)[:, None]
    c = tl.program_id(1) * P + tl.arange(0, P)
    ids = tl.load(ids_ptr + r, mask=r < T, other=0).to(tl.int64)
    x = tl.load(proj_ptr + r[:, None] * stride_p + c[None, :], mask=r_ok, other=0.0)
    x = x.to(tl.float32) * proj_scale
    w = tl.load(norm_ptr + tl.arange(0, P))
    context = x * tl.rsqrt(tl.sum(x * x, 1) / P + eps)[:, None] * w[None, :]
    row = weight_tile(codes_ptr, scale_ptr, offset_ptr, ids, tl.program_id(1) * P, stride_cn,
                      stride_sn, BITS, GROUP, HAS_OFFSET, ROWS, P).to(tl.float32)
    let_next_launch(PDL)
    out = (context + row * row_scale) * 0.7071067811865476
    tl.store(out_ptr + r[:, None] * stride_o + c[None, :], out.to(out_ptr.dtype.element_ty),
             mask=r_ok)


def per_layer_inputs_triton(proj: torch.Tensor, table: QWeight | torch.Tensor,
                            ids: torch.Tensor, norm: torch.Tensor, eps: float, hidden: int
                            ) -> torch.Tensor:
    """embed.per_layer_inputs in one kernel: a program per block of tokens and layer."""
    t, p = len(ids), norm.shape[0]
    n = table.shape[1]
    if ids.dim() != 1 or ids.dtype != torch.int32 or proj.shape != (t, n) \
            or proj.stride(1) != 1 or norm.dtype != torch.float32 or p & (p - 1) or n % p:
        raise ValueError(f"ids must be int32 [T], proj [T, {n}] with unit column stride, "
                         f"norm fp32 [P] for a power-of-two P dividing {n}")
    dense = isinstance(table, torch.Tensor)
    codes, scales, offset = operands(table)
    bits, group = (16, p) if dense else (table.bits, table.group)
    if not dense and p % group and group % p:
        raise ValueError(f"a layer's slice of {p} columns straddles groups of {group}")
    out = torch.empty(t, n, dtype=proj.dtype, device=proj.device)
    rows = 1 if t <= 256 else 4
    if t:
        _per_layer_inputs_kernel[(triton.cdiv(t, rows), n // p)](
            proj, codes, scales, offset, ids, norm, out, t, proj.stride(0), out.stride(0),
            codes.stride(0), scales.stride(0), eps, hidden ** -0.5, p ** 0.5, BITS=bits,
            GROUP=group,
            HAS_OFFSET=not dense and table.offset is not None, ROWS=rows, P=p,
            num_warps=2 if p <= 256 else 4, **launch_options(ids))
    return out
