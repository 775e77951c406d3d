"""Which tiles the packed matmul takes for a given shape (the H200 sweeps of
scripts/bench_kernels.py, docs/benchmarks.md), and from how many rows a weight is
multiplied dequantized instead (LARGE_M: cuBLAS on a copy wins once arithmetic, not the
weight read, is the cost)."""

from __future__ import annotations

import torch
import triton

from . import arrivals
from .qweight import QWeight

LARGE_M = 256  # rows from which dequantize (made ahead) + cuBLAS wins (docs/benchmarks.md)
LARGE_W = 1 << 25  # ... for weights up to this many elements (not the 262k-row head)
# gate/up from LARGE_M rows: the Triton matmul on the dequantized weight, gelu*up in its
# epilogue, up to this many rows (it saves the [M, N] product's trip through memory, 8-10%
# on the 270M's gate/up); past them cuBLAS's speed wins even with a gelu kernel after it
DENSE_GELU_M = 8192

Blocks = tuple[int, int, int, int, int, int]  # BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, split-K
DENSE_BLOCKS = (128, 256, 64, 8, 3, 1)  # the H200 sweep's best with gelu at 1024 rows
MAX_TILES = arrivals.SLOTS  # output tiles of one split-K launch


def built_in(x: torch.Tensor, w: QWeight, n: int | None = None) -> Blocks:
    """The built-in tiles of x @ dequant(w).T (of n of w's rows)."""
    return choose(len(x), n or w.shape[0], w.shape[1], w.group, w.bits, x.element_size())


def k_tiles(k: int, group: int) -> list[int]:
    """K tiles that divide K (no K masking) and hold whole groups or lie in one."""
    fits = [b for b in (128, 64, 32, 16) if k % b == 0 and (b % group == 0 or group % b == 0)]
    if not fits:
        raise ValueError(f"no K tile fits K={k} in groups of {group}")
    return fits


def check_k_tile(k: int, bk: int, group: int, split: int = 1) -> None:
    """A K tile must divide each of the `split` K slices and hold whole groups or lie in
    one (the kernels neither mask K nor straddle a group)."""
    if k % (split * bk) or (bk % group and group % bk):
        raise ValueError(f"K tile {bk} does not divide K={k} / split {split} in groups of "
                         f"{group}")


def k_tile(k: int, group: int) -> int:
    """The K tile of wide tiles: at most 64 where one fits."""
    fits = k_tiles(k, group)
    return ([b for b in fits if b <= 64] or fits)[0]


def choose(m: int, n: int, k: int, group: int, bits: int, itemsize: int = 2) -> Blocks:
    """Tiles for M rows (below LARGE_M; past it cuBLAS takes over), from the H200 sweep of
    scripts/bench_kernels.py on Gemma 3 270M shapes in CUDA graphs (docs/benchmarks.md):
    wide K tiles (few loop trips, each of which waits on memory: up to 128 bytes of codes
    a row), M tiles of half the rows up to 128 (64 for a weight of few rows, 32 where
    split-K already makes programs enough), narrow N tiles for few rows (programs enough
    to fill the GPU), and two K slices from K = 2048 (unless the tiles alone are more
    than the split-K counts hold: programs enough anyway). Past 16 rows fp32 operands
    (itemsize 4) take K tiles of at most 64, which keeps their pipelined tiles within the
    shared memory."""
    fits = k_tiles(k, group)
    if m <= 16:  # label rows of the head, decode-like: weight-bandwidth bound
        return 16, 64, fits[0], 4, 3, 1
    bk = fits[0] if itemsize <= 2 else k_tile(k, group)
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


def takes_dense(m: int, w: QWeight, dtype: torch.dtype) -> bool:
    """Whether a pass of m rows multiplies w dequantized (cuBLAS, or the gelu epilogue on
    the dense copy) rather than packed."""
    n, k = w.shape
    return m >= LARGE_M and n * k <= LARGE_W and dtype != torch.float32
