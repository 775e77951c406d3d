"""Matmul against packed quantized weights: torch reference (fp32 on CPU).

x @ dequant(W).T where dequant reads the packed words directly: 4-bit codes two per byte
(column 2k low nibble, 2k+1 high) or int8 codes, times the group scale, plus the group
offset for 4-bit. A Triton kernel of the same contract goes beside this one.
"""

from __future__ import annotations

import torch

from . import dispatch
from .fused import softcap_
from .qweight import QWeight

CHUNK_ROWS = 16384  # rows dequantized at a time: bounds the fp32 copy of a vocab-sized W


def dequantize(w: QWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[N, K] in `dtype`; fp32 arithmetic, so it is exact against the GGUF reference."""
    n, k = w.shape
    if w.bits == 4:
        q = torch.stack([w.codes & 15, w.codes >> 4], -1).view(n, -1, w.group)
    else:
        q = w.codes.view(n, -1, w.group)
    if w.symmetric:
        q = q.to(torch.int8) - 8
    out = q * w.scale.float()[..., None]  # int * fp32 promotes to fp32 in one pass
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


def qmatmul_logsumexp(x: torch.Tensor, w: QWeight, out: torch.Tensor | None = None,
                      softcap: float | None = None) -> torch.Tensor:
    """logsumexp over N of x @ dequant(w).T in fp32 -> [M] (into `out` when given): the
    head's normaliser; softcap: of cap * tanh(logits / cap). On CUDA two Triton kernels
    that never write the [M, N] logits."""
    if dispatch.triton(x):
        from .qmatmul_triton import qmatmul_logsumexp as on_gpu

        return on_gpu(x, w, out, softcap=softcap)
    logits = qmatmul(x, w, torch.empty(len(x), w.shape[0]))
    if softcap:
        softcap_(logits, softcap)
    return torch.logsumexp(logits, dim=-1, out=out)
