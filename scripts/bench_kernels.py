"""Sweep the Triton kernels' tiles on CUDA (shapes and tiles: bench_shapes.py); print medians.

    python scripts/bench_kernels.py [PART ...]   # default: qmatmul attention fused

Parts: qmatmul, qmatmul-e2b, head-e2b, attention, attention-e2b-sliding,
attention-e2b-full, fused, norms-wide, dequantize, dequantize-large, dense. Each timing
replays a CUDA graph of back-to-back calls as the engine's graphs run them (no host
launch cost), weights cycling past the L2 cache; fp16 activations. qmatmul: packed
weights at the graphs' pass sizes against cuBLAS on the dense weight (the floor) and the
built-in tiles (gate_up also with gelu*up in the epilogue); head-e2b: the
full-vocabulary logsumexp; attention: one KV head and its query heads (the 270M's; E2B's
sliding and full layers) on causal passes, against SDPA on equal-length sequences;
fused: norms and RoPE; norms-wide: add_rms_norm on Gemma 4's rows; dequantize (-large:
E2B's and 31B's dense layers): GB/s a weight; dense: past LARGE_M rows on the
dequantized weight, cuBLAS against the Triton tiles. Tiles compile in parallel processes
first; no network. decider must import (installed, or laid out by
scripts/layout_package.sh).
"""

from __future__ import annotations

import multiprocessing
import sys

import torch
import torch.nn.functional as F
import triton
from bench_shapes import (
    ALL_LINEARS,
    ATT_PARTS,
    ATT_SHAPES,
    DENSE_LINEARS,
    DENSE_ROWS,
    DENSE_TILES,
    DEQ_PARTS,
    DEQ_TILES,
    FFN,
    FUSED_TILES,
    FUSED_TOKENS,
    HEAD_DIM,
    HEAD_TILES,
    HIDDEN,
    QMATMUL_PARTS,
    TILES,
    WIDE_HIDDEN,
    WIDE_TILES,
    Q,
    fits,
    forms,
)
from graph_timing import graph_ms, rank, tile_us

from decider.kernels import attention_triton as att
from decider.kernels import fused as fu
from decider.kernels import fused_triton as fut
from decider.kernels import qmatmul as qm
from decider.kernels import qmatmul_tiles as tiles
from decider.kernels import qmatmul_triton as qmt

DENSE_BLOCKS = tiles.DENSE_BLOCKS
DEV = "cuda"
DTYPE = torch.float16  # the engine's activations on CUDA
L2_BYTES = 64 << 20  # cycle through more weight bytes than the H200's 50 MB L2
def random_qweight(n: int, k: int, bits: int | str, group: int):
    """bits 4: with offsets and fp32 scales (Q4_K), "4s": symmetric, fp16 scales (Q4_0)."""
    scale = torch.rand(n, k // group, device=DEV) * 0.02
    if bits in (4, "4s"):
        codes = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=DEV)
        if bits == "4s":
            return qm.QWeight(codes, scale.half(), None, group, 4)
        return qm.QWeight(codes, scale, -8 * scale, group, 4)
    codes = torch.randint(-128, 128, (n, k), dtype=torch.int8, device=DEV)
    return qm.QWeight(codes, scale, None, group, 8)


def compile_some(jobs: list) -> int:
    """Run each job once on small inputs (in a worker process): fills the disk cache of
    compiled kernels. Tiles that do not fit the chip fail here and again when timed."""
    done = 0
    for kernel, name, tile in jobs:
        try:
            if kernel == "qmatmul":
                k, n, (bits, group) = ALL_LINEARS[name]
                qmt.qmatmul_triton(torch.randn(tile[0], k, device=DEV, dtype=DTYPE),
                                   random_qweight(n, k, bits, group), blocks=tile)
            elif kernel == "head":
                qmt.qmatmul_logsumexp(torch.randn(16, 1536, device=DEV, dtype=DTYPE),
                                      random_qweight(1024, 1536, "4s", 32), blocks=tile)
            elif kernel == "fused":
                fused_calls(64, tile)[name]()
            elif kernel == "norm-wide":  # name: the row's width
                fused_calls(64, tile, name)["add_rms_norm"]()
            elif kernel == "dense":
                k, n = DENSE_LINEARS[name]
                x = torch.randn(tile[0], k, device=DEV, dtype=DTYPE)
                qmt.matmul_dense_triton(x, torch.randn(n, k, device=DEV, dtype=DTYPE),
                                        gelu="gate_up" in name, blocks=tile)
            elif kernel == "dequantize":  # a kernel per (K, bits, group): few rows do
                k, _, (bits, group) = ALL_LINEARS[name]
                qmt.dequantize_triton(random_qweight(64, k, bits, group), DTYPE, tile)
            else:  # name: query heads a KV head, head dim
                group, d = ATT_SHAPES[name]
                q = torch.randn(64, group, d, device=DEV, dtype=DTYPE)
                kv = torch.randn(64, 1, d, device=DEV, dtype=DTYPE)
                lo = torch.zeros(64, device=DEV, dtype=torch.int32)
                att.attention_triton(q, kv, kv, lo, lo + 64, 0.1, blocks=tile)
                rows = torch.arange(48, 64, device=DEV, dtype=torch.int32)  # few queries
                att.attention_triton(q[48:], kv, kv, lo, lo + 64, 0.1, blocks=tile, rows=rows)
            done += 1
        except Exception:  # noqa: BLE001 - out of shared memory or registers
            pass
    torch.cuda.synchronize()
    return done


def precompile(parts: list[str], workers: int = 12) -> None:
    jobs = [("qmatmul", name, t) for part, (linears, _) in QMATMUL_PARTS.items()
            if part in parts for (k, bits, group), name in forms(linears).items()
            for t in TILES if fits(t, 1024, k, group)]
    jobs += [("head", "", t) for t in HEAD_TILES if "head-e2b" in parts]
    jobs += [("attention", name, t) for part, (name, _, _, some, splits) in ATT_PARTS.items()
             if part in parts for t in some + splits]
    jobs += [("fused", name, t) for t in FUSED_TILES for name in ("add_rms_norm", "qk_norm_rope")
             if "fused" in parts]
    jobs += [("norm-wide", hidden, t) for hidden in WIDE_HIDDEN for t in WIDE_TILES
             if "norms-wide" in parts]
    jobs += [("dequantize", name, t) for part, linears in DEQ_PARTS.items() if part in parts
             for name in forms(linears).values() for t in DEQ_TILES]
    # one K per form compiles the plain kernel; gate_up's the gelu epilogue too
    jobs += [("dense", name, t) for name in DENSE_LINEARS for t in DENSE_TILES
             if "dense" in parts]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(workers) as pool:
        done = sum(pool.map(compile_some, [jobs[i::workers] for i in range(workers)]))
    print(f"compiled {done} of {len(jobs)} tiles", flush=True)


def bench_qmatmul(linears: dict, rows: tuple) -> None:
    print("qmatmul: per-call us in a graph; floor = cuBLAS on the dense weight; GB/s of "
          "packed weight read by the best tile")
    print(f"{'linear':24} {'M':>5} {'built-in':>9} {'best':>7} {'floor':>7} {'GB/s':>6}  "
          "best tiles")
    for name, (k, n, (bits, group)) in linears.items():
        w0 = random_qweight(n, k, bits, group)
        copies = [w0] + [random_qweight(n, k, bits, group)
                         for _ in range(max(L2_BYTES // w0.nbytes(), 1))]
        dense = [qm.dequantize(w, DTYPE) for w in copies[:max(
            L2_BYTES // (2 * n * k), 1)]]
        for m in rows:
            x = torch.randn(m, k, device=DEV, dtype=DTYPE)
            out = torch.empty(m, n, device=DEV, dtype=DTYPE)

            def calls(tile):
                return [lambda w=w: qmt.qmatmul_triton(x, w, out, blocks=tile) for w in copies]

            builtin = graph_ms(calls(None)) * 1e3
            floor = graph_ms([lambda d=d: torch.matmul(x, d.T, out=out) for d in dense]) * 1e3
            ranked, best = rank(calls, [t for t in TILES if fits(t, m, k, group)])
            print(f"{name} {bits}b g{group} [{n}x{k}]".ljust(24),
                  f"{m:5d} {builtin:9.1f} {ranked[0][0]:7.1f} {floor:7.1f} "
                  f"{w0.nbytes() / ranked[0][0] / 1e3:6.0f}  {best}", flush=True)
            if name.endswith("gate_up"):  # with gelu*up: in the fused epilogue, or a kernel after
                fused = graph_ms([lambda w=w: qmt.qmatmul_gelu_triton(x, w, ranked[0][1])
                                  for w in copies]) * 1e3
                plain = graph_ms([lambda w=w: qmt.qmatmul_gelu_triton(x, w)
                                  for w in copies]) * 1e3
                print(f"{'  + gelu*up':24} {m:5d} {plain:9.1f} {fused:7.1f}  (built-in, the "
                      "best tile above with gelu in its epilogue)", flush=True)


def bench_head() -> None:
    """Gemma 4 E2B's tied head (262,144 x 1,536 in Q4_0) at 16 rows: the full-vocabulary
    logsumexp, each tile's matmul and the combining kernel."""
    print("head-e2b: logsumexp of 16 rows, per-call us in a graph; GB/s of packed weight")
    copies = [random_qweight(262144, 1536, "4s", 32) for _ in range(2)]  # 226 MB each
    x = torch.randn(16, 1536, device=DEV, dtype=DTYPE)

    def calls(tile):
        return [lambda w=w: qmt.qmatmul_logsumexp(x, w, blocks=tile) for w in copies]

    builtin = tile_us(calls(None))
    ranked, best = rank(calls, HEAD_TILES)
    print(f"built-in {builtin:.1f}  best {ranked[0][0]:.1f} "
          f"({copies[0].nbytes() / ranked[0][0] / 1e3:.0f} GB/s)  {best}", flush=True)


def bench_attention(shape: str, tokens: dict, windows: tuple, candidates: list, splits: list
                    ) -> None:
    """One KV head and its query heads (ATT_SHAPES[shape]) on each of `tokens`' passes,
    (sequences, each[, the last n tokens alone as queries]) with each of `windows`, over
    `candidates` (full attention or few queries: `splits` too)."""
    hq, d = ATT_SHAPES[shape]
    print(f"attention {hq}q/1kv d{d}: per-call us in a graph")
    hkv, scale = 1, d ** -0.5
    for label, (seqs, each, *few) in tokens.items():
        t = seqs * each
        q = torch.randn(t, hq, d, device=DEV, dtype=DTYPE)
        k, v = (torch.randn(t, hkv, d, device=DEV, dtype=DTYPE) for _ in "kv")
        i = torch.arange(t, device=DEV, dtype=torch.int32)
        start = i - i % each  # packed chains of `each` tokens
        end = start + each
        # SDPA sees [B, H, L, D] with K/V repeated to the query heads (outside the timing)
        qb, kb, vb = (x.view(seqs, each, -1, d).transpose(1, 2) for x in (q, k, v))
        kb, vb = (x.repeat_interleave(hq // hkv, 1) for x in (kb, vb))
        rows, causal = None, {"is_causal": True}
        if few:  # the last queries alone: a causal mask aligned to the keys' end
            rows = i[t - few[0]:]
            q, qb = q[rows], qb[:, :, rows]
            causal = {"attn_mask": rows[:, None] >= i[None, :]}
        sdpa = graph_ms([lambda: F.scaled_dot_product_attention(
            qb, kb, vb, scale=scale, **causal)] * 20) * 1e3
        out = torch.empty_like(q)
        for window in windows:
            lo = start if window is None else torch.maximum(start, i - window + 1)

            def calls(tile, lo=lo, window=window):
                return [lambda: att.attention_triton(q, k, v, lo, end, scale, window=window,
                                                     out=out, blocks=tile, rows=rows)] * 20

            builtin = graph_ms(calls(None)) * 1e3
            ranked, best = rank(calls, candidates + (splits if window is None or few else []))
            print(f"{label:>8} window {str(window):4}: built-in {builtin:.1f}, best "
                  f"{ranked[0][0]:.1f}, SDPA causal {sdpa:.1f}  {best}", flush=True)


def fused_calls(t: int, tile, hidden: int = HIDDEN) -> dict:
    """The engine's fused steps on a pass of t tokens (fp32 residual stream of `hidden`,
    fp16 sublayers; q, k, v heads of one fused QKV output), each a call with `tile`."""
    x = torch.randn(t, hidden, device=DEV)
    y = torch.randn(t, hidden, device=DEV, dtype=DTYPE)
    w = torch.rand(hidden, device=DEV) + 0.5
    heads = torch.randn(t, Q // HEAD_DIM + 2, HEAD_DIM, device=DEV, dtype=DTYPE)
    wd = torch.rand(HEAD_DIM, device=DEV) + 0.5
    pos = torch.arange(t, device=DEV, dtype=torch.int32)
    cos, sin = (c.to(DEV) for c in fu.rope_tables(8192, HEAD_DIM, 1e6))
    return {"add_rms_norm": lambda: fut.add_rms_norm(x, y, w, w, 1e-6, tile=tile),
            "qk_norm_rope": lambda: fut.qk_norm_rope_(heads[:, :-1], Q // HEAD_DIM, wd, wd,
                                                      pos, cos, sin, 1e-6, tile=tile)}


def bench_fused() -> None:
    print("fused steps: per-call us in a graph; tiles (token rows per program, warps)")
    for t in FUSED_TOKENS:
        gu = torch.randn(t, 2 * FFN, device=DEV, dtype=DTYPE)
        gelu = graph_ms([lambda: fut.gelu_mul(gu)] * 20) * 1e3
        for name, builtin in fused_calls(t, None).items():
            def calls(tile, name=name):
                return [fused_calls(t, tile)[name]] * 20

            ranked, best = rank(calls, FUSED_TILES)
            ones = tile_us(calls((1, 4)))
            print(f"{t:5d} {name:13}: built-in {graph_ms([builtin] * 20) * 1e3:.1f}, one row "
                  f"a program {ones:.1f}, best {ranked[0][0]:.1f} (gelu*up {gelu:.1f})  {best}",
                  flush=True)


def bench_norms_wide() -> None:
    print("add_rms_norm on Gemma 4's rows: per-call us in a graph; tiles (token rows per "
          "program, warps)")
    for hidden in WIDE_HIDDEN:
        for t in FUSED_TOKENS:
            def calls(tile, hidden=hidden, t=t):
                return [fused_calls(t, tile, hidden)["add_rms_norm"]] * 20

            ranked, best = rank(calls, WIDE_TILES)
            builtin = tile_us(calls(None))
            moved = t * hidden * 12  # x and the stream in fp32, y and h in fp16
            print(f"{hidden:5d} x {t:5d}: built-in {builtin:.1f} ({moved / builtin / 1e3:.0f} "
                  f"GB/s), best {ranked[0][0]:.1f}  {best}", flush=True)


def bench_dense() -> None:
    print("dense matmul past LARGE_M (the weight dequantized to fp16): per-call us in a "
          "graph; cuBLAS against the Triton kernel's tiles")
    for name, (k, n) in DENSE_LINEARS.items():
        copies = [torch.randn(n, k, device=DEV, dtype=DTYPE) / k ** 0.5
                  for _ in range(max(L2_BYTES // (2 * n * k), 2))]
        for m in DENSE_ROWS:
            x = torch.randn(m, k, device=DEV, dtype=DTYPE)
            out = torch.empty(m, n, device=DEV, dtype=DTYPE)
            cublas = graph_ms([lambda d=d: torch.matmul(x, d.T, out=out) for d in copies]) * 1e3
            modes = [False, True] if "gate_up" in name else [False]
            for gelu in modes:
                def calls(tile, gelu=gelu):
                    return [lambda d=d: qmt.matmul_dense_triton(x, d, gelu, tile)
                            for d in copies]

                ranked, best = rank(calls, [t for t in DENSE_TILES if k % (t[2] * t[5]) == 0
                                            and (t[5] == 1 or m <= 8192)])
                base = cublas if not gelu else graph_ms([
                    lambda d=d: fut.gelu_mul(torch.matmul(x, d.T)) for d in copies]) * 1e3
                print(f"{name + (' +gelu' if gelu else ''):18} {m:6d} cuBLAS"
                      f"{' +gelu_mul' if gelu else ''} {base:8.1f}  triton "
                      f"{DENSE_BLOCKS[:5]} {tile_us(calls(None)):8.1f}  best "
                      f"{ranked[0][0]:8.1f}  "
                      f"{best}", flush=True)


def bench_dequantize(linears: dict) -> None:
    print("dequantize to fp16: per-call us in a graph (weights cycling past the L2), and "
          "GB/s of packed bytes read plus fp16 written")
    for name, (k, n, (bits, group)) in linears.items():
        copies = [random_qweight(n, k, bits, group)
                  for _ in range(max(L2_BYTES // (2 * n * k), 2))]
        moved = copies[0].nbytes() + 2 * n * k

        def calls(tile):
            return [lambda w=w: qmt.dequantize_triton(w, DTYPE, tile) for w in copies]

        builtin = tile_us(calls(None))
        ranked, best = rank(calls, DEQ_TILES)
        print(f"{name} {bits}b g{group} [{n}x{k}]".ljust(24), f"built-in {builtin:.1f} "
              f"({moved / builtin / 1e3:.0f} GB/s), best {ranked[0][0]:.1f} "
              f"({moved / ranked[0][0] / 1e3:.0f} GB/s)  {best}", flush=True)


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("needs CUDA")
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    parts = sys.argv[1:] or ["qmatmul", "attention", "fused"]
    precompile(parts)
    for part, (linears, rows) in QMATMUL_PARTS.items():
        if part in parts:
            bench_qmatmul(linears, rows)
    if "head-e2b" in parts:
        bench_head()
    for part, spec in ATT_PARTS.items():
        if part in parts:
            bench_attention(*spec)
    if "fused" in parts:
        bench_fused()
    for part, linears in DEQ_PARTS.items():
        if part in parts:
            bench_dequantize(linears)
    if "norms-wide" in parts:
        bench_norms_wide()
    if "dense" in parts:
        bench_dense()


if __name__ == "__main__":
    main()
