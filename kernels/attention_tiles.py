"""Which tiles the prefill attention kernel (attention_triton.py) takes for a pass: from
the H200 sweeps of scripts/bench_kernels.py (docs/experiments.md)."""

from __future__ import annotations

import torch

# BLOCK_M (query rows), BLOCK_N (keys), warps, stages, key splits, min key blocks a split
Blocks = tuple[int, int, int, int, int, int]


def choose(rows: int, block_d: int, dtype: torch.dtype, full: bool) -> Blocks:
    """The tiles for a pass of `rows` query rows (query tokens times the query heads of a
    KV head) at head dim `block_d` (padded to a power of two); `full`: full attention over
    the pass's own keys alone (no window, no cache), the one kind whose keys may split.

    From the H200 sweeps (head dim 256, 4 query heads a KV head, fp16):
    16-row query blocks up to 2048 rows (512 tokens: programs enough to fill the GPU), against
    128-key blocks up to 1024 rows (one causal sequence of 256 tokens 9.2 -> 8.4 us, of 128 5.9
    -> 5.8), 64 rows against 32-key blocks up to 8192, and past that 128 rows on 8 warps against
    64-key blocks, which read each key block for twice the queries (on one causal sequence of
    4096-8192 tokens 16-24% less time than the best 64-row tile, 8-10% less on sliding layers;
    docs/experiments.md). Full attention over the pass's own keys (one long causal sequence: the
    last query blocks read every key) splits a long block's keys from 2048 to 16384 rows: one
    causal sequence of 1000 tokens 42.5 -> 24.4 us, of 2000 61.2 -> 38.7, of 4000 137.8 -> 98.3.
    fp32 tiles are twice the bytes: half the keys, eight warps and two stages keep them in
    registers and shared memory. Head dim 512 (Gemma 4's full layers): on 8 warps, 16-row
    blocks against 64 keys up to 2048 rows (one pass of 256 tokens, 8 query heads: 21.9 ->
    14.5 us), their keys split 8 ways up to 128 rows (a KV-shared layer's 16 queries of a
    230-token pass: 15.1 -> 10.9 us; on sliding layers 8.6 -> 8.1, not taken), and 64 rows
    against 32 keys past 2048 (128 x 230 tokens 779.6 -> 475.3 us: the E2B sweep), within
    the shared memory; in fp32 16 x 16 tiles."""
    if block_d > 256:
        if dtype == torch.float32:
            return 16, 16, 8, 1, 1, 1
        if full and rows <= 128:
            return 16, 64, 8, 2, 8, 1
        return (16, 64, 8, 2, 1, 1) if rows <= 2048 else (64, 32, 8, 2, 1, 1)
    if dtype == torch.float32 and block_d > 128:
        return (16 if rows <= 1024 else 32 if rows <= 4096 else 64), 32, 8, 2, 1, 1
    if rows <= 1024:  # up to 256 tokens: all of a 128-token pass's keys in one block
        return 16, 128, 4, 2, 1, 1
    if rows <= 2048:
        return 16, 64, 4, 3, 1, 1
    if full and rows <= 4096:
        return 64, 32, 4, 3, 3, 8
    if full and rows <= 8192:
        return 64, 64, 4, 2, 2, 16
    if rows <= 8192:
        return 64, 32, 4, 3, 1, 1
    return 128, 64, 8, 2, (2 if full and rows <= 16384 else 1), 8
