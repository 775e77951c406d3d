"""Embedding lookups: rows of a packed (or dense) table by token id, torch reference.
On CUDA one Triton kernel each (embed_triton.py)."""

from __future__ import annotations

import math

import torch

from . import dispatch
from .fused import rms_norm
from .qmatmul import dequantize
from .qweight import QWeight


def embed(w: QWeight, ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rows `ids` [T] of the dequantized weight -> [T, K] (an embedding lookup)."""
    return dequantize(w.rows(ids), dtype)


def embed_rms_norm(w: QWeight | torch.Tensor, ids: torch.Tensor, scale: torch.Tensor,
                   norm: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A model's first step: rows `ids` [T] of the embedding (packed, or dense in scale's
    dtype) rounded to the activation dtype (scale's), times the scalar `scale`, rounded
    again, as fp32 x [T, K] (the residual stream), and h = rms_norm(x) * norm in the
    activation dtype. On CUDA one kernel (eager torch takes about nine)."""
    if dispatch.triton(ids):
        from .embed_triton import embed_rms_norm_triton

        return embed_rms_norm_triton(w, ids, scale, norm, eps)
    rows = embed(w, ids, scale.dtype) if isinstance(w, QWeight) else w[ids]
    x = (rows * scale).float()
    return x, rms_norm(x, norm, eps, scale.dtype)


def rows(w: QWeight | torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """fp32 [T, K]: rows `ids` of a packed table dequantized, or of a dense one widened."""
    return embed(w, ids) if isinstance(w, QWeight) else w[ids].float()


def per_layer_inputs(proj: torch.Tensor, table: QWeight | torch.Tensor, ids: torch.Tensor,
                     norm: torch.Tensor, eps: float, hidden: int) -> torch.Tensor:
    """Gemma 4's per-layer inputs [T, L * P] in proj's dtype: the scaled embedding's
    projection proj [T, L * P] times hidden^-0.5, RMS-normed by norm [P] in each layer's
    slice, plus the per-layer table's rows `ids` times sqrt(P), times 2^-0.5; fp32 inside.
    On CUDA one kernel, the table read in its stored form."""
    if dispatch.triton(ids):
        from .embed_triton import per_layer_inputs_triton

        return per_layer_inputs_triton(proj, table, ids, norm, eps, hidden)
    t, p = len(ids), norm.shape[0]
    context = rms_norm((proj.float() * hidden ** -0.5).view(-1, p), norm, eps).view(t, -1)
    return ((context + rows(table, ids) * math.sqrt(p)) * 2 ** -0.5).to(proj.dtype)
