"""The small fused steps between a Gemma layer's matmuls: torch references.

Each is one launch on CUDA (fused_triton.py) where eager torch would take five to ten,
which is what a pass of a few hundred tokens is made of. Norms and RoPE compute in fp32
and round once to the activation dtype; norms multiply by the stored weight (Gemma 3's
GGUF weights already hold its 1 + w, Gemma 4's are w).
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


def add_rms_norm(x: torch.Tensor, y: torch.Tensor, w_y: torch.Tensor,
                 w_next: torch.Tensor | None, eps: float, scale: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """A sublayer's end and the next one's start: x + norm(y) (the residual stream, in
    x.dtype; norm(y) rounded to y.dtype first), times `scale` (fp32 [1]: Gemma 4's
    layer_scalar, on the whole stream) when given, and its norm by w_next in y.dtype
    (the next sublayer's input; w_next None: the stream itself in y.dtype, for a
    projection that reads it unnormed)."""
    if (k := _triton(x)) is not None:
        return k.add_rms_norm(x, y, w_y, w_next, eps, scale)
    x = x + rms_norm(y, w_y, eps)
    if scale is not None:
        x = x * scale
    return x, x.to(y.dtype) if w_next is None else rms_norm(x, w_next, eps, y.dtype)


def rope_tables(n: int, dim: int, base: float, scale: float = 1.0,
                rotated: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin fp32 [n, pairs] of rotate-half RoPE at positions 0..n-1 (linear scaling),
    pairs = dim / 2. rotated: only the first that many frequency pairs turn (Gemma 4's
    "proportional" RoPE: the frequencies of the whole head, the rest at angle 0), and
    the tables hold those alone (pairs = rotated): the rest would be ones and zeros."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)) / scale
    angles = torch.arange(n, dtype=torch.float32)[:, None] * inv_freq[None, :rotated]
    return angles.cos(), angles.sin()


def qk_norm_rope_(x: torch.Tensor, n_q: int, w_q: torch.Tensor, w_k: torch.Tensor,
                  pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float,
                  n_v: int = 0) -> None:
    """In place on x [T, H, D] (the heads of a fused QKV output): heads below n_q normed
    by w_q, the next ones up to H - n_v by w_k, those rotated by RoPE at positions pos [T]
    from the tables [n, P] (`rope_tables`: the first P <= D / 2 frequency pairs turn,
    the others stay); the last n_v heads (Gemma 4's v) normed without a weight and not
    rotated. Heads past what the caller passes are left alone."""
    if (k := _triton(x)) is not None:
        return k.qk_norm_rope_(x, n_q, w_q, w_k, pos, cos, sin, eps, n_v)
    xf = x.float()
    h = x.shape[1]
    w = torch.cat([w_q.expand(n_q, -1), w_k.expand(h - n_q - n_v, -1),
                   torch.ones_like(w_k).expand(n_v, -1)])
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w
    still = x.shape[2] // 2 - cos.shape[1]  # pairs at angle 0
    if still < 0:
        raise ValueError(f"cos and sin must be [n, P], 0 < P <= {x.shape[2] // 2}, got P = "
                         f"{cos.shape[1]}")
    c = F.pad(cos[pos][:, None], (0, still), value=1.0)  # [T, 1, D / 2]
    s = F.pad(sin[pos][:, None], (0, still), value=0.0)
    x1, x2 = xf[:, :h - n_v].chunk(2, -1)
    x[:, :h - n_v] = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)
    x[:, h - n_v:] = xf[:, h - n_v:]


def gelu_mul(gu: torch.Tensor) -> torch.Tensor:
    """gu [T, 2F] (gate and up interleaved: column 2i gate i, 2i + 1 up i) ->
    gelu_tanh(gate) * up [T, F]. Interleaved, a matmul tile holds both halves of its
    outputs, so the packed matmul can apply this in its epilogue (qmatmul_gelu)."""
    if (k := _triton(gu)) is not None:
        return k.gelu_mul(gu)
    gate, up = gu.unflatten(-1, (-1, 2)).float().unbind(-1)
    return (F.gelu(gate, approximate="tanh") * up).to(gu.dtype)


def gelu_times(g: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(g) * m, elementwise in fp32, in g.dtype: Gemma 4's per-layer input
    gate times that layer's input."""
    if (k := _triton(g)) is not None:
        return k.gelu_times(g, m)
    return (F.gelu(g.float(), approximate="tanh") * m.float()).to(g.dtype)


def softcap_(x: torch.Tensor, cap: float) -> torch.Tensor:
    """In place on fp32 logits: cap * tanh(x / cap) (Gemma 4's final softcapping, which
    comes before any logsumexp)."""
    if (k := _triton(x)) is not None:
        return k.softcap_(x, cap)
    return x.div_(cap).tanh_().mul_(cap)
