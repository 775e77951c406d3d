"""What scripts/bench_kernels.py sweeps: the shapes it times the kernels on (Gemma 3
270M and 1B, Gemma 4 E2B's KV-shared layers and head) and the tiles it tries for each."""

from __future__ import annotations

import itertools

import triton

HIDDEN, Q, KV, FFN, HEAD_DIM, WINDOW = 640, 4 * 256, 256, 2048, 256, 512
# the engine's matmuls (q, k, v fused; gate, up fused) in the real 270M file's types
LINEARS = {"qkv": (HIDDEN, Q + 2 * KV, (8, 32)), "o": (Q, HIDDEN, (4, 32)),
           "gate_up": (HIDDEN, 2 * FFN, (8, 32)), "down": (FFN, HIDDEN, (8, 16))}
ROWS = (64, 128, 256, 512, 1024, 2048)  # the graphs' pass sizes up to cuBLAS's
# Gemma 4 E2B's KV-shared layers (Q4_0, double-wide MLP), at the rows their graphs hold
# (a graph of n tokens: n / 8, at least 16): part "qmatmul-e2b"
# (their Q4_0 as the engine holds it: symmetric codes, fp16 scales: "4s")
E2B_LINEARS = {"e2b q": (1536, 2048, ("4s", 32)), "e2b o": (2048, 1536, ("4s", 32)),
               "e2b gate_up": (1536, 2 * 12288, ("4s", 32)),
               "e2b down": (12288, 1536, ("4s", 32))}
# the dense layers of E2B and 31B in Q4_0, dequantized for passes past LARGE_M: part
# "dequantize-large" (a 31B request waits on their copies as long as on cuBLAS)
LARGE_LINEARS = {f"{shape} {name}": (k, n, ("4s", 32)) for shape, (hidden, q, kv, ffn) in
                 (("e2b", (1536, 2048, 256, 6144)), ("31b", (5376, 8192, 4096, 21504)))
                 for name, (k, n) in (("qkv", (hidden, q + 2 * kv)), ("o", (q, hidden)),
                                      ("gate_up", (hidden, 2 * ffn)), ("down", (ffn, hidden)))}
# ... and 31B's gate/up in the other types the loader takes (Q8_0; Q4_K: offsets)
LARGE_LINEARS |= {f"31b gate_up {kind}": (5376, 43008, (bits, 32)) for kind, bits in
                  (("q8", 8), ("q4k", 4))}
ALL_LINEARS = {**LINEARS, **E2B_LINEARS, **LARGE_LINEARS}  # by name, for the compiling workers
DEQ_PARTS = {"dequantize": LINEARS, "dequantize-large": LARGE_LINEARS}
# qmatmul tiles: BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, split-K
TILES = [(bm, bn, bk, w, 3, s) for bm, bn, bk, w, s in itertools.product(
    (16, 32, 64, 128), (16, 32, 64, 128), (64, 128, 256), (4, 8), (1, 2, 4, 5, 8, 16))
    if bm * bk <= 128 * 128 and bn * bk <= 128 * 128 and (w == 4 or bm * bn >= 64 * 64)]
# the head's logsumexp at 16 rows: one K slice (part "head-e2b")
HEAD_TILES = [(16, bn, bk, w, st, 1) for bn, bk, w, st in itertools.product(
    (64, 128, 256), (64, 128, 256), (4, 8), (2, 3)) if bn * bk <= 128 * 128]
QMATMUL_PARTS = {"qmatmul": (LINEARS, ROWS), "qmatmul-e2b": (E2B_LINEARS, (16, 32, 64, 128))}
# attention: BLOCK_M, BLOCK_N, warps, stages; for full attention also with a long block's
# keys split over programs (splits, min key blocks each)
ATT_TILES = list(itertools.product((16, 32, 64, 128), (16, 32, 64, 128), (4, 8), (1, 2, 3)))
ATT_SPLIT_TILES = [t + s for t in ATT_TILES if t[3] > 1 for s in ((2, 8), (2, 16), (3, 8))]
# (sequences, each): the three tile bands (16-row blocks up to 512 tokens, 64 rows up
# to 2048, 128 past it) and the batch's packed sequences
TOKENS = {"128": (1, 128), "512": (1, 512), "1024": (1, 1024), "2048": (1, 2048),
          "4096": (1, 4096), "8192": (1, 8192), "128x256": (128, 256)}
# query heads a KV head and head dim: the 270M's; Gemma 4 E2B's sliding and full layers
ATT_SHAPES = {"4x256": (4, 256), "8x256": (8, 256), "8x512": (8, 512)}
# one request's graph; the batch; a KV-shared layer's queries, the last 16 tokens of one
# request (sequences, each[, query tokens])
E2B_TOKENS = {"256": (1, 256), "128x230": (128, 230), "16 of 230": (1, 230, 16)}
# few queries against a pass's keys: 16-128 rows, keys split 2-8 ways
ROWS_SPLIT_TILES = [(bm, bn, w, st, sp, 1) for bm, bn, w, st, sp in itertools.product(
    (16, 32, 64), (16, 32, 64), (4, 8), (1, 2, 3), (2, 4, 8))]
# part: (shape, passes, windows, tiles, split tiles for full attention and for few query
# tokens); head dim 512 takes no tile past 64 (shared memory)
ATT_PARTS = {"attention": ("4x256", TOKENS, (None, WINDOW), ATT_TILES, ATT_SPLIT_TILES),
             "attention-e2b-sliding": ("8x256", E2B_TOKENS, (WINDOW,), ATT_TILES,
                                       ROWS_SPLIT_TILES),
             "attention-e2b-full": ("8x512", E2B_TOKENS, (None,),
                                    [t for t in ATT_TILES if max(t[:2]) <= 64],
                                    [t for t in ROWS_SPLIT_TILES if t[0] <= 32])}
# fused norms and RoPE: token rows per program, warps; pass sizes
FUSED_TILES = list(itertools.product((1, 2, 4, 8, 16), (1, 2, 4, 8)))
FUSED_TOKENS = (128, 512, 2048, 8192)
# add_rms_norm on Gemma 4's rows (E2B, E4B, 31B): part "norms-wide", up to 16 warps
WIDE_HIDDEN = (1536, 2560, 5376)
WIDE_TILES = list(itertools.product((1, 2, 4, 8), (2, 4, 8, 16)))
# large passes (dequantized weights): the four linears of the 270M and the 1B
DENSE_LINEARS = {f"{name} {shape}": (k, n) for shape, (hidden, ffn) in
                 (("270m", (HIDDEN, FFN)), ("1b", (1152, 6912)))
                 for name, (k, n) in (("qkv", (hidden, Q + 2 * KV)), ("o", (Q, hidden)),
                                      ("gate_up", (hidden, 2 * ffn)), ("down", (ffn, hidden)))}
DENSE_ROWS = (1024, 2048, 4096, 8192, 32768)
DENSE_TILES = [(bm, bn, 64, w, s, split) for bm, bn, w, s, split in itertools.product(
    (64, 128), (64, 128, 256), (4, 8), (3, 4), (1, 2, 4))
    if s * (bm + bn) * 64 * 2 <= 200 << 10 and (w == 8 or bm * bn <= 128 * 128)]
# dequantize (passes past LARGE_M): BLOCK_N, BLOCK_K, warps
DEQ_TILES = list(itertools.product((16, 32, 64, 128), (32, 64, 128, 256), (2, 4, 8)))


def fits(tile, m: int, k: int, group: int) -> bool:
    """Whether a qmatmul tile takes M rows of K in groups of `group` (K tiles that divide
    each slice and hold whole groups; no M tile past the rows)."""
    bm, bn, bk, _, _, split = tile
    return (k % (split * bk) == 0 and (bk % group == 0 or group % bk == 0)
            and bm <= max(16, triton.next_power_of_2(m)) and (split == 1 or m <= 1024))


def forms(linears: dict) -> dict:
    """One linear's name per (K, bits, group): what a compiled kernel depends on."""
    return {(k, bits, group): name for name, (k, n, (bits, group)) in linears.items()}
