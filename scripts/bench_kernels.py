"""Time the Triton kernels on CUDA against torch, on Gemma 3 270M shapes; print medians.

    python scripts/bench_kernels.py

qmatmul (bf16 activations, packed weights) against torch dequantize-then-matmul in bf16,
and against a bf16 matmul of a weight already dense (the floor a dequantizing kernel
chases); attention (bf16, 4 query heads, 1 KV head, head dim 256) against
F.scaled_dot_product_attention on equal-length causal sequences. Times are
triton.testing.do_bench medians in ms; ratio = torch / triton (above 1: Triton faster).
Loads the kernels from this checkout, so the package need not be installed; no network.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

KERNELS = Path(__file__).resolve().parent.parent / "kernels"


def load_kernels():
    """kernels/ as a private package (it uses relative imports)."""
    spec = importlib.util.spec_from_file_location(
        "_bench_kernels", KERNELS / "__init__.py", submodule_search_locations=[str(KERNELS)])
    sys.modules["_bench_kernels"] = pkg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pkg)
    return (importlib.import_module("_bench_kernels.qmatmul"),
            importlib.import_module("_bench_kernels.qmatmul_triton"),
            importlib.import_module("_bench_kernels.attention_triton"))


qm, qmt, att = load_kernels()
DEV = "cuda"
HIDDEN, Q, KV, FFN, HEAD_DIM, WINDOW = 640, 4 * 256, 256, 2048, 256, 512
# the engine's matmuls (q, k, v fused; gate, up fused) in the real 270M file's types
LINEARS = {"qkv": (HIDDEN, Q + 2 * KV, (8, 32)), "o": (Q, HIDDEN, (4, 32)),
           "gate_up": (HIDDEN, 2 * FFN, (8, 32)), "down": (FFN, HIDDEN, (8, 16))}
TOKENS = {"128": (1, 128), "2048": (1, 2048), "128x256": (128, 256)}  # (sequences, each)
# qmatmul tiles tried by the sweep: BLOCK_M, BLOCK_N, BLOCK_K, warps, stages
TILES = [(16, 64, 128, 4, 3), (32, 64, 64, 4, 3), (64, 64, 64, 4, 3), (64, 128, 64, 4, 3),
         (128, 64, 64, 4, 3), (128, 128, 64, 8, 3), (128, 128, 32, 8, 4),
         (128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (64, 256, 32, 4, 4)]


def ms(fn) -> float:
    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def random_qweight(n: int, k: int, bits: int, group: int):
    scale = torch.rand(n, k // group, device=DEV) * 0.02
    if bits == 4:
        codes = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=DEV)
        return qm.QWeight(codes, scale, -8 * scale, group, 4)
    codes = torch.randint(-128, 128, (n, k), dtype=torch.int8, device=DEV)
    return qm.QWeight(codes, scale, None, group, 8)


def bench_qmatmul(rows: list) -> None:
    for name, (k, n, (bits, group)) in LINEARS.items():
        w = random_qweight(n, k, bits, group)
        dense = qm.dequantize(w, torch.bfloat16)
        for label, (seqs, each) in TOKENS.items():
            x = torch.randn(seqs * each, k, device=DEV, dtype=torch.bfloat16)
            t = ms(lambda: qmt.qmatmul_triton(x, w))
            deq = ms(lambda: x @ qm.dequantize(w, torch.bfloat16).T)
            mm = ms(lambda: x @ dense.T)
            best, tile = min((ms(lambda b=b: qmt.qmatmul_triton(x, w, blocks=b)), b)
                             for b in TILES if k % b[2] == 0 and b[2] % group == 0)
            rows.append((f"qmatmul {bits}-bit g{group} {name} [{n}x{k}]", label, t,
                         f"dequant+mm {deq:.4f} ({deq / t:.2f}x)",
                         f"dense mm {mm:.4f} ({mm / t:.2f}x); best tile {tile}: {best:.4f}"))
    head = random_qweight(262144, HIDDEN, 8, 32)  # the tied head's logsumexp, fp32
    for m in (1, 128):
        x = torch.randn(m, HIDDEN, device=DEV)
        t = ms(lambda: qmt.qmatmul_triton(x, head))
        rows.append(("qmatmul head fp32 [262144x640]", str(m), t, "", ""))


def bench_attention(rows: list) -> None:
    hq, hkv, scale = Q // HEAD_DIM, KV // HEAD_DIM, HEAD_DIM ** -0.5
    for label, (seqs, each) in TOKENS.items():
        t = seqs * each
        q = torch.randn(t, hq, HEAD_DIM, device=DEV, dtype=torch.bfloat16)
        k, v = (torch.randn(t, hkv, HEAD_DIM, device=DEV, dtype=torch.bfloat16) for _ in "kv")
        i = torch.arange(t, device=DEV, dtype=torch.int32)
        start = i - i % each  # packed chains of `each` tokens
        end = start + each
        # SDPA sees [B, H, L, D] with K/V repeated to the query heads (outside the timing)
        qb, kb, vb = (x.view(seqs, each, -1, HEAD_DIM).transpose(1, 2) for x in (q, k, v))
        kb, vb = (x.repeat_interleave(hq // hkv, 1) for x in (kb, vb))
        sdpa = ms(lambda: F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=scale))
        for window in (None, WINDOW):
            lo = start if window is None else torch.maximum(start, i - window + 1)
            tri = ms(lambda lo=lo: att.attention_triton(q, k, v, lo, end, scale))
            rows.append((f"attention {hq}q/{hkv}kv d{HEAD_DIM} window {window}", label, tri,
                         f"sdpa causal {sdpa:.4f} ({sdpa / tri:.2f}x)", ""))


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("needs CUDA")
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    rows: list = []
    bench_qmatmul(rows)
    bench_attention(rows)
    table = [("kernel", "tokens", "triton ms", "torch ms (torch/triton)", "")]
    table += [(name, label, f"{t:.4f}", a, b) for name, label, t, a, b in rows]
    widths = [max(len(r[i]) for r in table) for i in range(5)]
    for r in table:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


if __name__ == "__main__":
    main()
