"""Matmul against packed quantized weights: torch reference (fp32 on CPU).

x @ dequant(W).T where dequant reads the packed words directly: 4-bit codes two per byte
(column 2k low nibble, 2k+1 high) or int8 codes, times the group scale, plus the group
offset for 4-bit. A Triton kernel of the same contract goes beside this one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import dispatch
from .fused import rms_norm

CHUNK_ROWS = 16384  # rows dequantized at a time: bounds the fp32 copy of a vocab-sized W


@dataclass(frozen=True, slots=True)
class QWeight:
    codes: torch.Tensor  # bits 4: uint8 [N, K // 2]; bits 8: int8 [N, K]
    scale: torch.Tensor  # fp32 [N, K // group]
    offset: torch.Tensor | None  # fp32 [N, K // group]; bits 4 only
    group: int
    bits: int

    def __post_init__(self) -> None:
        n, k = self.shape
        dtype, width = {4: (torch.uint8, k // 2), 8: (torch.int8, k)}[self.bits]
        if self.codes.dtype != dtype or tuple(self.codes.shape) != (n, width):
            raise ValueError(f"{self.bits}-bit codes must be {dtype} [{n}, {width}], got "
                             f"{self.codes.dtype} {tuple(self.codes.shape)}")
        if self.scale.dtype != torch.float32 or (self.offset is None) != (self.bits == 8):
            raise ValueError("scales are fp32; 4-bit weights have an offset, 8-bit ones none")

    @property
    def shape(self) -> tuple[int, int]:
        return self.scale.shape[0], self.scale.shape[1] * self.group

    def rows(self, index: torch.Tensor | slice) -> QWeight:
        """The packed weight of a subset of output rows (label rows of a head)."""
        off = None if self.offset is None else self.offset[index]
        return QWeight(self.codes[index], self.scale[index], off, self.group, self.bits)

    def to(self, device: torch.device | str) -> QWeight:
        off = None if self.offset is None else self.offset.to(device)
        return QWeight(self.codes.to(device), self.scale.to(device), off, self.group, self.bits)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size()
                   for t in (self.codes, self.scale, self.offset) if t is not None)


def dequantize(w: QWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[N, K] in `dtype`; fp32 arithmetic, so it is exact against the GGUF reference."""
    n, k = w.shape
    if w.bits == 4:
        q = torch.stack([w.codes & 15, w.codes >> 4], -1).view(n, -1, w.group)
    else:
        q = w.codes.view(n, -1, w.group)
    out = q * w.scale[..., None]  # int * fp32 promotes to fp32 in one pass
    if w.offset is not None:
        out = out + w.offset[..., None]
    return out.view(n, k).to(dtype)


def qmatmul(x: torch.Tensor, w: QWeight, out: torch.Tensor | None = None,
            dense: torch.Tensor | None = None, rows: torch.Tensor | None = None
            ) -> torch.Tensor:
    """x [M, K] @ dequant(w).T -> [M, N], into `out` when given (a column slice of a wider
    buffer will do); rows (int32 [N]): of those rows of w only (label rows of a head). The
    weight is rounded to x.dtype and the products are summed in out.dtype (fp32 for the
    head's logits), as the kernel's fp32 accumulator does. On CUDA the Triton kernel
    reads the packed words, or for a large pass a dequantized copy (`dense`, made ahead,
    when given: qmatmul_triton); elsewhere this reference dequantizes at most CHUNK_ROWS
    rows at a time."""
    if dispatch.triton(x):
        from .qmatmul_triton import qmatmul_triton  # Triton only where it compiles

        return qmatmul_triton(x, w, out, dense=dense, rows=rows)
    if rows is not None:
        w = w.rows(rows)
    n = w.shape[0]
    if out is None:
        out = torch.empty(len(x), n, dtype=x.dtype)
    xo = x.to(out.dtype)
    for i in range(0, n, CHUNK_ROWS):
        wi = dequantize(w.rows(slice(i, i + CHUNK_ROWS)), x.dtype)
        out[:, i:i + CHUNK_ROWS] = xo @ wi.to(out.dtype).T
    return out


def qmatmul_gelu(x: torch.Tensor, w: QWeight, dense: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """x [M, K] @ dequant(w).T with w's rows gate and up interleaved (row 2i gate i, 2i + 1
    up i) -> gelu_tanh(gate) * up [M, N / 2] (fused.gelu_mul). On CUDA the matmul's
    epilogue computes it, so the [M, N] product never goes to memory."""
    if dispatch.triton(x):
        from .qmatmul_triton import qmatmul_gelu_triton

        return qmatmul_gelu_triton(x, w, dense=dense)
    from .fused import gelu_mul

    return gelu_mul(qmatmul(x, w))


def qmatmul_logsumexp(x: torch.Tensor, w: QWeight, out: torch.Tensor | None = None
                      ) -> torch.Tensor:
    """logsumexp over N of x @ dequant(w).T in fp32 -> [M] (into `out` when given): the
    head's normaliser. On CUDA two Triton kernels that never write the [M, N] logits."""
    if dispatch.triton(x):
        from .qmatmul_triton import qmatmul_logsumexp as on_gpu

        return on_gpu(x, w, out)
    return torch.logsumexp(qmatmul(x, w, torch.empty(len(x), w.shape[0])), dim=-1, out=out)


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
        from .qmatmul_triton import embed_rms_norm_triton

        return embed_rms_norm_triton(w, ids, scale, norm, eps)
    rows = embed(w, ids, scale.dtype) if isinstance(w, QWeight) else w[ids]
    x = (rows * scale).float()
    return x, rms_norm(x, norm, eps, scale.dtype)
