"""Which tiles the packed matmul takes for a given shape (the H200 sweeps of
scripts/bench_kernels.py, docs/experiments.md), and from how many rows a weight is
multiplied dequantized instead (LARGE_M: cuBLAS on a copy wins once arithmetic, not the
weight read, is the cost)."""

from __future__ import annotations

import torch
import triton

from . import arrivals
from .qweight import QWeight

LARGE_M = 256  # rows from which dequantize (made ahead) + cuBLAS wins (docs/experiments.md)
# ... for weights up to this many elements: 31B's gate/up (231M) is one, a vocabulary's
# head (403M and more) is not; a copy is at most 512 MiB in fp16
LARGE_W = 1 << 28
# the head's logsumexp from LARGE_M rows multiplies dequantized chunks of at most this many
# elements (a 128 MiB buffer in fp16)
HEAD_CHUNK = 1 << 26
# gate/up in these rows: the Triton matmul on the dequantized weight, gelu*up in its
# epilogue (it saves the [M, N] product's trip through memory, 8-10% on the 270M's
# gate/up); outside them cuBLAS, then a gelu kernel: past them cuBLAS's speed wins, and
# below them its 128-row tiles leave SMs idle (E2B at 256 rows: 82 TFLOP/s)
DENSE_GELU_ROWS = range(1024, 8192 + 1)

Blocks = tuple[int, int, int, int, int, int]  # BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, split-K
DENSE_BLOCKS = (128, 256, 64, 8, 3, 1)  # the H200 sweep's best with gelu at 1024 rows
MAX_TILES = arrivals.SLOTS  # output tiles of one split-K launch
PROGRAMS = 256  # about two programs per SM (the H200 has 132)
BIG_W = 1 << 24  # from this many elements a weight's read dominates a pass of <= 128 rows
HEAD_N = 1 << 17  # ... unless it is a vocabulary's head (rows of its own, swept apart)


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
    scripts/bench_kernels.py on Gemma 3 270M shapes in CUDA graphs (docs/experiments.md):
    wide K tiles (few loop trips, each of which waits on memory: up to 128 bytes of codes
    a row), M tiles of half the rows up to 128 (64 for a weight of few rows, 32 where
    split-K already makes programs enough), narrow N tiles for few rows (programs enough
    to fill the GPU), and two K slices from K = 2048 (unless the tiles alone are more
    than the split-K counts hold: programs enough anyway). Past 16 rows fp32 operands
    (itemsize 4) take K tiles of at most 64, which keeps their pipelined tiles within the
    shared memory. Up to 16 rows of a weight of 1,024 rows or more, N tiles of 64 for a
    wide or large weight (E2B's shared `down` at 16 rows: 17.9 against 20.5 us at 32),
    K slices until the programs fill the GPU; of fewer than 1,024 rows, N tiles of 32
    and K tiles of 64 sliced likewise (E2B's per-layer input gate, 256 x 1,536, at 16
    rows: 11.1 us in 4 programs, 4.8 in 64); and 17-128 rows of a large weight
    `_big_weight`'s tiles (the sweep of Gemma 4 E2B's KV-shared layers)."""
    fits = k_tiles(k, group)
    if m <= 16:  # decode-like: weight-bandwidth bound
        if n < 1024:  # a head's label rows, E2B's per-layer input gate: K slices
            bk = ([b for b in fits if b <= 64] or fits)[0]
            bn = 16 if n <= 16 else 32
            return 16, bn, bk, 4, 3, _split(triton.cdiv(n, bn), k, bk)
        bn = 64 if n >= 4096 or n * k >= BIG_W else 32
        return 16, bn, fits[0], 4, 3, _split(triton.cdiv(n, bn), k, fits[0])
    if m <= 128 and n * k >= BIG_W and n < HEAD_N and itemsize <= 2:
        return _big_weight(m, n, k, group, bits)
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


def _split(programs: int, k: int, bk: int) -> int:
    """K slices (up to 16) until the programs fill the GPU, each of whole K tiles."""
    split = 1
    while programs * split < PROGRAMS and split < 16 and k % (2 * split * bk) == 0:
        split *= 2
    return split


def _big_weight(m: int, n: int, k: int, group: int, bits: int) -> Blocks:
    """Tiles for 17-128 rows of a weight of BIG_W elements or more: every row in one M
    tile (the weight is read once), N tiles of 64 for a wide weight, else narrow tiles
    with 128 bytes of codes a row and two K slices of a long K (the E2B sweep)."""
    bn, bk = (64, k_tile(k, group)) if n >= 8192 else (16, 8 * 128 // bits)
    if bn == 16 and (k % bk or bk % group):
        bk = k_tiles(k, group)[0]
    bm = min(128 if bn == 64 else 64, triton.next_power_of_2(m))
    split = 2 if bn == 16 and k >= 2048 and k % (2 * bk) == 0 else 1
    return bm, bn, bk, 8 if bm * bn >= 128 * 64 else 4, 3, split


def dequantize_tile(n: int, k: int, group: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, warps) of the dequantize kernel: 16 rows of the widest K tile on
    8 warps (the sweep on the 270M's weights: 1.7-3.2 us each), or for a weight of BIG_W
    elements or more 256 columns on 2 warps where they fit, 64 codes a thread in wide
    loads (the sweep on E2B's and 31B's dense layers: 17-20% less time)."""
    if n * k >= BIG_W and k % 256 == 0 and 256 % group == 0:
        return 16, 256, 2
    return 16, k_tiles(k, group)[0], 8


def takes_dense(m: int, w: QWeight, dtype: torch.dtype) -> bool:
    """Whether a pass of m rows multiplies w dequantized (cuBLAS, or the gelu epilogue on
    the dense copy) rather than packed."""
    n, k = w.shape
    return m >= LARGE_M and n * k <= LARGE_W and dtype != torch.float32
