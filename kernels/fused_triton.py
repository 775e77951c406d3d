"""Triton kernels of the contracts in fused.py, fp32 inside. The norms and RoPE take a
block of token rows per program: one row each makes thousands of tiny programs at passes
of thousands of tokens (`_tile`: the H200 sweep of scripts/bench_kernels.py)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import launch_options, let_next_launch, wait_for_inputs


@triton.jit
def _norm(x, w, mask, n, eps):
    """x [R, B] normed along its rows by w [B]; masked lanes are zero."""
    x = tl.where(mask, x, 0.0)
    return x * tl.rsqrt(tl.sum(x * x, 1) / n + eps)[:, None] * w[None, :]


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, o_ptr, T, N, stride_x, stride_o, eps, ROWS: tl.constexpr,
                     BLOCK: tl.constexpr, PDL: tl.constexpr):
    wait_for_inputs(PDL)
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]  # [R, 1]
    c = tl.arange(0, BLOCK)
    mask = (r < T) & (c < N)[None, :]
    x = tl.load(x_ptr + r * stride_x + c[None, :], mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + c, mask=c < N, other=0.0)
    let_next_launch(PDL)
    tl.store(o_ptr + r * stride_o + c[None, :],
             _norm(x, w, mask, N, eps).to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _add_rms_norm_kernel(x_ptr, y_ptr, wy_ptr, wn_ptr, s_ptr, xo_ptr, h_ptr, T, N, stride_x,
                         stride_y, eps, HAS_NEXT: tl.constexpr, HAS_SCALE: tl.constexpr,
                         ROWS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    wait_for_inputs(PDL)
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]  # [R, 1]
    c = tl.arange(0, BLOCK)
    mask = (r < T) & (c < N)[None, :]
    y = tl.load(y_ptr + r * stride_y + c[None, :], mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + r * stride_x + c[None, :], mask=mask, other=0.0).to(tl.float32)
    wy = tl.load(wy_ptr + c, mask=c < N, other=0.0)
    let_next_launch(PDL)
    # norm(y) rounded to y's dtype and the stream to its own, as the torch reference does
    x = (x + _norm(y, wy, mask, N, eps).to(y_ptr.dtype.element_ty).to(tl.float32))
    if HAS_SCALE:  # Gemma 4's layer_scalar, on the whole stream
        x = x * tl.load(s_ptr)
    x = x.to(xo_ptr.dtype.element_ty)
    tl.store(xo_ptr + r * N + c[None, :], x, mask=mask)
    if HAS_NEXT:
        wn = tl.load(wn_ptr + c, mask=c < N, other=0.0)
        h = _norm(x.to(tl.float32), wn, mask, N, eps)
    else:  # the stream itself, for a projection that reads it unnormed
        h = x
    tl.store(h_ptr + r * N + c[None, :], h.to(h_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _qk_norm_rope_kernel(x_ptr, wq_ptr, wk_ptr, pos_ptr, cos_ptr, sin_ptr, T, NQ, NR,
                         stride_t, stride_h, eps, HALF: tl.constexpr, TURN: tl.constexpr,
                         ROWS: tl.constexpr, PDL: tl.constexpr):
    """One head (program axis 1) of ROWS tokens: the head's halves as [R, D / 2] tiles.
    The first TURN frequency pairs turn (the tables' width), the rest stay. Heads from NR
    on (Gemma 4's v) are normed without a weight and not rotated."""
    wait_for_inputs(PDL)
    t = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]  # [R, 1]
    head = tl.program_id(1)
    c = tl.arange(0, HALF)[None, :]  # [1, D / 2]
    mask = (t < T) & (c < HALF)
    base = x_ptr + t * stride_t + head * stride_h
    x1 = tl.load(base + c, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(base + HALF + c, mask=mask, other=0.0).to(tl.float32)
    is_q = head < NQ
    w1 = tl.where(is_q, tl.load(wq_ptr + c), tl.load(wk_ptr + c))
    w2 = tl.where(is_q, tl.load(wq_ptr + HALF + c), tl.load(wk_ptr + HALF + c))
    rotate = head < NR
    w1, w2 = tl.where(rotate, w1, 1.0), tl.where(rotate, w2, 1.0)
    r = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1))[:, None] / (2 * HALF) + eps)
    x1, x2 = x1 * r * w1, x2 * r * w2
    p = tl.load(pos_ptr + t, mask=t < T, other=0)
    turns = c < TURN
    cs = tl.where(rotate, tl.load(cos_ptr + p * TURN + c, mask=turns, other=1.0), 1.0)
    sn = tl.where(rotate, tl.load(sin_ptr + p * TURN + c, mask=turns, other=0.0), 0.0)
    let_next_launch(PDL)
    ty = x_ptr.dtype.element_ty
    tl.store(base + c, (x1 * cs - x2 * sn).to(ty), mask=mask)
    tl.store(base + HALF + c, (x2 * cs + x1 * sn).to(ty), mask=mask)


@triton.jit
def gelu_tanh(g):
    """gelu, tanh form, in fp32: tanh(z) = 2 sigmoid(2z) - 1."""
    z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
    return g * tl.sigmoid(2.0 * z)


@triton.jit
def _gelu_mul_kernel(gu_ptr, o_ptr, F, stride_gu, BLOCK: tl.constexpr, PDL: tl.constexpr):
    wait_for_inputs(PDL)
    row, blk = tl.program_id(0), tl.program_id(1)
    c = blk * BLOCK + tl.arange(0, BLOCK)
    mask = c < F
    pairs = 2 * c[:, None] + tl.arange(0, 2)[None, :]  # [BLOCK, 2]: gate, up side by side
    g, u = tl.split(tl.load(gu_ptr + row * stride_gu + pairs, mask=mask[:, None],
                            other=0.0).to(tl.float32))
    let_next_launch(PDL)
    tl.store(o_ptr + row * F + c, (gelu_tanh(g) * u).to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gelu_times_kernel(g_ptr, m_ptr, o_ptr, N, stride_g, stride_m, BLOCK: tl.constexpr,
                       PDL: tl.constexpr):
    wait_for_inputs(PDL)
    row, blk = tl.program_id(0), tl.program_id(1)
    c = blk * BLOCK + tl.arange(0, BLOCK)
    mask = c < N
    g = tl.load(g_ptr + row * stride_g + c, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(m_ptr + row * stride_m + c, mask=mask, other=0.0).to(tl.float32)
    let_next_launch(PDL)
    tl.store(o_ptr + row * N + c, (gelu_tanh(g) * m).to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def tanh(z):
    """tanh in fp32 as 2 sigmoid(2z) - 1 (the gelu's form)."""
    return 2.0 * tl.sigmoid(2.0 * z) - 1.0


@triton.jit
def _softcap_kernel(x_ptr, n, cap, BLOCK: tl.constexpr, PDL: tl.constexpr):
    wait_for_inputs(PDL)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n)
    let_next_launch(PDL)
    tl.store(x_ptr + i, cap * tanh(x / cap), mask=i < n)


def _rows(x: torch.Tensor, n: int, name: str) -> None:
    if x.dim() != 2 or x.shape[1] != n or x.stride(1) != 1:
        raise ValueError(f"{name} must be [T, {n}] with unit column stride, got "
                         f"{tuple(x.shape)} strides {x.stride()}")


def _weight(w: torch.Tensor, n: int, name: str) -> None:
    if w.shape != (n,) or w.dtype != torch.float32 or not w.is_contiguous():
        raise ValueError(f"{name} must be contiguous fp32 [{n}]")


NORM_SWEPT = 2048  # the widest row (a power of two) the norms' tiles were swept on


def _norm_tile(t: int, block: int) -> tuple[int, int]:
    """(token rows per program, warps) for norms of t rows of the hidden size padded to
    `block`. Rows wider than NORM_SWEPT take warps in proportion (at most 16) and at most
    32 of a row's values a thread: more spill registers (docs/experiments.md, 31B's
    norms)."""
    rows, warps = (1, 2) if t <= 256 else (2, 4) if t <= 1024 else (4, 4)
    if block > NORM_SWEPT:
        warps = min(16, warps * block // NORM_SWEPT)
        rows = max(1, min(rows, warps * 32 * 32 // block))
    return rows, warps


def _rope_tile(t: int) -> tuple[int, int]:
    """(token rows per program, warps) for q/k norm + RoPE on t tokens (a head's halves)."""
    return (2, 1) if t <= 256 else (4, 4)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, dtype: torch.dtype | None = None,
             *, tile: tuple[int, int] | None = None) -> torch.Tensor:
    n = w.shape[0]
    _rows(x, n, "x")
    _weight(w, n, "w")
    out = torch.empty(x.shape, dtype=dtype or x.dtype, device=x.device)
    if len(x):
        block = triton.next_power_of_2(n)
        rows, warps = tile or _norm_tile(len(x), block)
        _rms_norm_kernel[(triton.cdiv(len(x), rows),)](
            x, w, out, len(x), n, x.stride(0), out.stride(0), eps, ROWS=rows,
            BLOCK=block, num_warps=warps, **launch_options(x))
    return out


def add_rms_norm(x, y, w_y, w_next, eps, scale=None, *, tile: tuple[int, int] | None = None):
    n = w_y.shape[0]
    _rows(x, n, "x")
    _rows(y, n, "y")
    _weight(w_y, n, "w_y")
    if w_next is not None:
        _weight(w_next, n, "w_next")
    if scale is not None and (scale.shape != (1,) or scale.dtype != torch.float32):
        raise ValueError(f"scale must be fp32 [1], got {scale.dtype} {tuple(scale.shape)}")
    if y.shape != x.shape:
        raise ValueError(f"x and y differ: {tuple(x.shape)} vs {tuple(y.shape)}")
    if x.dtype != torch.float32 and x.dtype != y.dtype:
        raise ValueError(f"x must be fp32 or y's dtype, got {x.dtype} and {y.dtype}")
    x_out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    h = torch.empty(x.shape, dtype=y.dtype, device=x.device)
    if len(x):
        block = triton.next_power_of_2(n)
        rows, warps = tile or _norm_tile(len(x), block)
        _add_rms_norm_kernel[(triton.cdiv(len(x), rows),)](
            x, y, w_y, w_y if w_next is None else w_next, w_y if scale is None else scale,
            x_out, h, len(x), n, x.stride(0), y.stride(0), eps, HAS_NEXT=w_next is not None,
            HAS_SCALE=scale is not None, ROWS=rows, BLOCK=block,
            num_warps=warps, **launch_options(x))
    return x_out, h


def qk_norm_rope_(x, n_q, w_q, w_k, pos, cos, sin, eps, n_v=0, *,
                  tile: tuple[int, int] | None = None):
    t, heads, d = x.shape
    if x.stride(2) != 1 or d % 2 or d & (d - 1):
        raise ValueError(f"x must be [T, H, D] with unit stride along a power-of-two D, got "
                         f"{tuple(x.shape)} strides {x.stride()}")
    if not 0 <= n_v <= heads - n_q:
        raise ValueError(f"{n_v} v heads do not fit {heads} heads after {n_q} q heads")
    _weight(w_q, d, "w_q")
    _weight(w_k, d, "w_k")
    if cos.shape != sin.shape or cos.dim() != 2 or not 0 < cos.shape[1] <= d // 2 \
            or cos.dtype != torch.float32 or not (cos.is_contiguous() and sin.is_contiguous()):
        raise ValueError(f"cos and sin must be contiguous fp32 [n, P], 0 < P <= {d // 2}")
    if pos.shape != (t,) or pos.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"pos must be integer [{t}]")
    if t and heads:
        rows, warps = tile or _rope_tile(t)
        _qk_norm_rope_kernel[(triton.cdiv(t, rows), heads)](
            x, w_q, w_k, pos, cos, sin, t, n_q, heads - n_v, x.stride(0), x.stride(1), eps,
            HALF=d // 2, TURN=cos.shape[1], ROWS=rows, num_warps=warps, **launch_options(x))


def gelu_mul(gu: torch.Tensor) -> torch.Tensor:
    if gu.dim() != 2 or gu.shape[1] % 2 or gu.stride(1) != 1:
        raise ValueError(f"gu must be [T, 2F] with unit column stride, got {tuple(gu.shape)}")
    f = gu.shape[1] // 2
    out = torch.empty(len(gu), f, dtype=gu.dtype, device=gu.device)
    if len(gu):
        block = min(1024, triton.next_power_of_2(f))
        _gelu_mul_kernel[(len(gu), triton.cdiv(f, block))](gu, out, f, gu.stride(0),
                                                          BLOCK=block, **launch_options(gu))
    return out


def gelu_times(g: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    if g.dim() != 2 or g.shape != m.shape or g.stride(1) != 1 or m.stride(1) != 1:
        raise ValueError(f"g and m must be one [T, N] shape with unit column stride, got "
                         f"{tuple(g.shape)} and {tuple(m.shape)}")
    n = g.shape[1]
    out = torch.empty(g.shape, dtype=g.dtype, device=g.device)
    if len(g):
        block = min(1024, triton.next_power_of_2(n))
        _gelu_times_kernel[(len(g), triton.cdiv(n, block))](
            g, m, out, n, g.stride(0), m.stride(0), BLOCK=block, **launch_options(g))
    return out


def softcap_(x: torch.Tensor, cap: float) -> torch.Tensor:
    if x.dtype != torch.float32 or not x.is_contiguous():
        raise ValueError(f"x must be contiguous fp32, got {x.dtype}")
    if x.numel():
        _softcap_kernel[(triton.cdiv(x.numel(), 1024),)](x, x.numel(), float(cap), BLOCK=1024,
                                                         **launch_options(x))
    return x
