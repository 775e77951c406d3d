"""Matmul against packed quantized weights: the launchers of qmatmul_kernels.py's Triton
kernels, the contract of qmatmul.py, on the tiles of qmatmul_tiles.py.

From LARGE_M rows (a pass of a few hundred tokens or more) the arithmetic, not the weight
read, is the cost, and cuBLAS on a bf16 copy beats the fused kernel even after paying for
the copy (measured on the H200, docs/experiments.md): a layer's weight is then dequantized
by one kernel into a buffer (by the engine ahead of the layer, engines/dense_weights.py,
or here when none is given), and stays packed at rest. The fused gate/up projection
reads that buffer with the packed matmul's own kernel instead (in DENSE_GELU_ROWS), for
gelu*up in the epilogue.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import triton

from . import arrivals
from .fused_triton import gelu_mul
from .pdl import launch_options
from .qmatmul_kernels import _dequantize_kernel, _lse_combine_kernel, _qmatmul_kernel
from .qmatmul_tiles import (
    DENSE_BLOCKS,
    DENSE_GELU_ROWS,
    HEAD_CHUNK,
    LARGE_M,
    MAX_TILES,
    Blocks,
    built_in,
    check_k_tile,
    dequantize_tile,
    takes_dense,
)
from .qweight import QWeight


def operands(w: QWeight | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """codes, scale, offset as the kernels read them (the scale stands in for a missing
    offset, a dense weight for all three: the kernels do not read them)."""
    if isinstance(w, torch.Tensor):
        w = w.contiguous()
        return w, w, w
    scale = w.scale.contiguous()
    return w.codes.contiguous(), scale, scale if w.offset is None else w.offset.contiguous()


def dequantize_triton(w: QWeight, dtype: torch.dtype,
                      tile: tuple[int, int, int] | None = None,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """[N, K] in `dtype` (into `out` when given), one kernel. tile: (BLOCK_N, BLOCK_K,
    warps) instead of the built-in choice (`dequantize_tile`)."""
    n, k = w.shape
    codes, scale, offset = operands(w)
    if out is None:
        out = torch.empty(n, k, dtype=dtype, device=codes.device)
    elif out.shape != (n, k) or out.dtype != dtype or not out.is_contiguous():
        raise ValueError(f"out must be contiguous [{n}, {k}] in {dtype}")
    bn, bk, warps = tile or dequantize_tile(n, k, w.group)
    check_k_tile(k, bk, w.group)
    _dequantize_kernel[(triton.cdiv(n, bn), k // bk)](
        codes, scale, offset, out, n, codes.stride(0), scale.stride(0), out.stride(0),
        BITS=w.bits, GROUP=w.group, HAS_OFFSET=w.offset is not None, BLOCK_N=bn, BLOCK_K=bk,
        num_warps=warps)
    return out


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
        _launch(x, w, out, out, blocks or built_in(x, w, n), rows=rows)
    return out


def qmatmul_gelu_triton(x: torch.Tensor, w: QWeight, blocks: Blocks | None = None,
                        dense: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ dequant(w).T, w's rows gate and up interleaved -> gelu_tanh(gate) * up
    [M, N / 2] in x.dtype, in the matmul's epilogue (from LARGE_M on the weight dequantized,
    or `dense`, in DENSE_GELU_ROWS; elsewhere cuBLAS, then gelu_mul)."""
    x = _activations(x, w)
    m, n = x.shape[0], w.shape[0]
    if n % 2:
        raise ValueError(f"interleaved gate and up rows come in pairs, got {n} rows")
    if blocks is None and takes_dense(m, w, x.dtype):
        dense = _dense(x, w, dense)
        if m in DENSE_GELU_ROWS:
            return matmul_dense_triton(x, dense, gelu=True)
        return gelu_mul(torch.matmul(x, dense.T))
    out = torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
    if m and n:
        _launch(x, w, out, out, blocks or built_in(x, w), gelu=True)
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


def qmatmul_logsumexp(x: torch.Tensor, w: QWeight, out: torch.Tensor | None = None,
                      softcap: float | None = None, blocks: Blocks | None = None
                      ) -> torch.Tensor:
    """logsumexp over N of x @ dequant(w).T -> fp32 [M] (into `out` when given), never
    writing the [M, N] logits (the full-vocabulary normaliser of the tied head): the
    matmul leaves a (max, sum of exp) pair per row and column block, one more kernel
    combines each row's pairs. From LARGE_M rows in fp16 or bf16 the matmul multiplies
    w dequantized, a chunk of rows at a time (`_dense_chunks`). softcap: of cap *
    tanh(logits / cap). blocks: tiles of one K slice on the packed weight instead of
    the built-in choice (for tuning)."""
    x = _activations(x, w)
    m, n = len(x), w.shape[0]
    if out is None:
        out = torch.empty(m, dtype=torch.float32, device=x.device)
    if out.shape != (m,) or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"out must be contiguous fp32 [{m}]")
    # (the dense tiles' K tile must divide K: every Gemma's hidden size is a multiple)
    dense = blocks is None and m >= LARGE_M and x.dtype != torch.float32 \
        and w.shape[1] % DENSE_BLOCKS[2] == 0
    if dense:
        blocks = DENSE_BLOCKS
    elif blocks is None:
        # one K slice: each program's (max, sum of exp) pair needs its tile's whole sums;
        # a head's few rows stream the whole weight: 128 of its rows a program, two
        # stages (H200: 67 against 71 us, 16 rows of the 262,144 x 640 8-bit embedding)
        bm, bn, bk, warps, stages, _ = built_in(x, w)
        blocks = (bm, 128, bk, warps, 2, 1) if m <= 16 else (bm, bn, bk, warps, stages, 1)
    cols = triton.cdiv(n, blocks[1])
    top = torch.empty(m, cols, dtype=torch.float32, device=x.device)
    total = torch.empty_like(top)
    if m:
        for part, first in _dense_chunks(w, x.dtype, blocks[1]) if dense else [(w, 0)]:
            c = first // blocks[1]  # the chunk's column blocks
            _launch(x, part, top[:, c:], total[:, c:], blocks, lse=True,
                    softcap=softcap or 0.0)
        _lse_combine_kernel[(m,)](top, total, out, cols, BLOCK=1024, **launch_options(x))
    return out


def _dense_chunks(w: QWeight, dtype: torch.dtype, block: int
                  ) -> Iterator[tuple[torch.Tensor, int]]:
    """(chunk, its first row): w's rows dequantized in `dtype` into one reused buffer, in
    as few chunks of at most HEAD_CHUNK elements as there can be, each of whole groups of
    four column blocks of `block` rows (its view of the (max, sum) pairs then starts 16
    bytes aligned, as Triton's compiled variants expect)."""
    n, k = w.shape
    chunks = triton.cdiv(n * k, HEAD_CHUNK)
    step = triton.cdiv(triton.cdiv(n, chunks), 4 * block) * 4 * block
    copy = torch.empty(min(step, n), k, dtype=dtype, device=w.codes.device)
    for first in range(0, n, step):
        rows = min(step, n - first)
        yield dequantize_triton(w.rows(slice(first, first + rows)), dtype,
                                out=copy[:rows]), first


def _launch(x, w: QWeight | torch.Tensor, y, z, blocks: Blocks, lse: bool = False,
            gelu: bool = False, rows: torch.Tensor | None = None, softcap: float = 0.0
            ) -> None:
    """The matmul kernel on a packed weight (or `rows` of it), or on a dense [N, K] one in
    x's dtype."""
    m, k = x.shape
    n = w.shape[0] if rows is None else len(rows)
    codes, scale, offset = operands(w)
    bm, bn, bk, warps, stages, split = blocks
    dense = isinstance(w, torch.Tensor)
    bits, group = (16, bk) if dense else (w.bits, w.group)  # dense: no groups to straddle
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn), split)
    check_k_tile(k, bk, group, split)
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
        SPLIT_K=split, SOFTCAP=float(softcap),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages,
        **launch_options(x),
    )
