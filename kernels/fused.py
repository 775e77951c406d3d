"""The small fused steps between a Gemma 3 layer's matmuls: torch references.

Each is one launch on CUDA (fused_triton.py) where eager torch would take five to ten,
which is what a pass of a few hundred tokens is made of. Norms and RoPE compute in fp32
and round once to the activation dtype; norm weights already hold Gemma's 1 + w.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import dispatch


def _triton(x: torch.Tensor):
    if dispatch.triton(x):
        from . import fused_triton  # Triton only where it runs

        return fused_triton
    return None


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float,
             dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [T, N] -> x / rms(x) * w, in `dtype` (default x.dtype)."""
    if (k := _triton(x)) is not None:
        return k.rms_norm(x, w, eps, dtype)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w).to(dtype or x.dtype)


def add_rms_norm(x: torch.Tensor, y: torch.Tensor, w_y: torch.Tensor, w_next: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A sublayer's end and the next one's start: x + norm(y) (the residual stream, in
    x.dtype; norm(y) rounded to y.dtype first) and its norm by w_next, in y.dtype (the
    next sublayer's input)."""
    if (k := _triton(x)) is not None:
        return k.add_rms_norm(x, y, w_y, w_next, eps)
    x = x + rms_norm(y, w_y, eps)
    return x, rms_norm(x, w_next, eps, y.dtype)


def rope_tables(n: int, dim: int, base: float, scale: float = 1.0) -> tuple[torch.Tensor,
                                                                            torch.Tensor]:
    """cos, sin fp32 [n, dim / 2] of rotate-half RoPE at positions 0..n-1 (linear scaling)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)) / scale
    angles = torch.arange(n, dtype=torch.float32)[:, None] * inv_freq[None]
    return angles.cos(), angles.sin()


def qk_norm_rope_(x: torch.Tensor, n_q: int, w_q: torch.Tensor, w_k: torch.Tensor,
                  pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float) -> None:
    """In place on x [T, H, D] (the q and k heads of a fused QKV output; more heads may
    follow and are left alone): heads below n_q normed by w_q, the next ones up to H by
    w_k, then rotated by RoPE at positions pos [T] from the tables [n, D / 2]."""
    if (k := _triton(x)) is not None:
        return k.qk_norm_rope_(x, n_q, w_q, w_k, pos, cos, sin, eps)
    xf = x.float()
    w = torch.cat([w_q.expand(n_q, -1), w_k.expand(x.shape[1] - n_q, -1)])
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w
    c, s = cos[pos][:, None], sin[pos][:, None]  # [T, 1, D / 2]
    x1, x2 = xf.chunk(2, -1)
    x.copy_(torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1))


def gelu_mul(gu: torch.Tensor) -> torch.Tensor:
    """gu [T, 2F] (gate and up interleaved: column 2i gate i, 2i + 1 up i) ->
    gelu_tanh(gate) * up [T, F]. Interleaved, a matmul tile holds both halves of its
    outputs, so the packed matmul can apply this in its epilogue (qmatmul_gelu)."""
    if (k := _triton(gu)) is not None:
        return k.gelu_mul(gu)
    gate, up = gu.unflatten(-1, (-1, 2)).float().unbind(-1)
    return (F.gelu(gate, approximate="tanh") * up).to(gu.dtype)
