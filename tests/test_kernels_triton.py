"""Triton kernels against the torch references, in the Triton interpreter on the CPU.

fp32 operands only: the interpreter's bf16 tl.dot is wrong. Shapes are small and drawn
fresh each run inside each case's regime (the ids say which). Tolerance: fp32 sums in
another order, 1e-4 relative to the largest output (measured: below 1e-6).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

# The interpreter must be on before triton is first imported: triton.language decorates
# its own helpers (tl.zeros, ...) at import. A process that already imported it compiled
# (GPU tests first) cannot run these.
if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("triton was imported without TRITON_INTERPRET=1 in this process: "
                "run this file in its own pytest process", allow_module_level=True)
os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton", reason="triton is not installed (the gpu extra)")

from decider.kernels import qmatmul as qm  # noqa: E402
from decider.kernels.attention import attention, position_mask, tree_visible  # noqa: E402
from decider.kernels.attention_triton import attention_triton  # noqa: E402
from decider.kernels.qmatmul_triton import qmatmul_triton  # noqa: E402


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    tol = 1e-4 * float(want.abs().max())
    torch.testing.assert_close(got, want, rtol=1e-4, atol=tol)


def random_qweight(n: int, k: int, bits: int, group: int) -> qm.QWeight:
    scale = torch.rand(n, k // group) * 0.1 + 0.01
    if bits == 4:
        codes = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
        return qm.QWeight(codes, scale, -8 * scale + torch.randn_like(scale) * 0.01, group, 4)
    codes = torch.randint(-128, 128, (n, k), dtype=torch.int8)
    return qm.QWeight(codes, scale, None, group, 8)


def draw(lo: int, hi: int) -> int:
    return int(torch.randint(lo, hi + 1, ()))


# (bits, group, M range, N range, groups along K): M=1 and small M take the 16-row tile,
# M > 64 the 128-row one; N ranges are ragged against the 64/128-wide tiles.
QMATMUL_CASES = {
    "4bit-g32-M1-raggedN": (4, 32, (1, 1), (1, 63), (2, 2)),
    "4bit-g32-M16-manygroups": (4, 32, (2, 16), (65, 200), (5, 9)),
    "4bit-g16-M64": (4, 16, (17, 64), (30, 140), (3, 11)),
    "8bit-g32-M1": (8, 32, (1, 1), (100, 300), (4, 8)),
    "8bit-g16-M128": (8, 16, (65, 150), (129, 200), (2, 9)),
    "8bit-g32-M200": (8, 32, (129, 200), (1, 40), (1, 12)),
    # W4A16 group 128: one K tile per group (M <= 16), two (M > 16)
    "4bit-g128-M1": (4, 128, (1, 1), (1, 100), (1, 3)),
    "4bit-g128-M40-split": (4, 128, (17, 40), (1, 100), (1, 3)),
}


@pytest.mark.parametrize("case", QMATMUL_CASES)
def test_qmatmul_matches_the_reference(case):
    bits, group, ms, ns, gs = QMATMUL_CASES[case]
    m, n, k = draw(*ms), draw(*ns), group * draw(*gs)
    w = random_qweight(n, k, bits, group)
    x = torch.randn(m, k)
    close(qmatmul_triton(x, w), qm.qmatmul(x, w))


def test_qmatmul_reads_strided_rows_and_row_subsets():
    w = random_qweight(90, 128, 4, 32)
    x = torch.randn(7, 200)[:, 40:168]  # row stride 200
    rows = w.rows(torch.tensor([89, 3, 3, 50]))  # label rows of a head
    close(qmatmul_triton(x, rows), qm.qmatmul(x, rows))


def test_qmatmul_refuses_a_wrong_shape_and_empty_m_is_empty():
    w = random_qweight(8, 64, 8, 32)
    with pytest.raises(ValueError, match=r"\[M, 64\]"):
        qmatmul_triton(torch.randn(2, 32), w)
    assert qmatmul_triton(torch.randn(0, 64), w).shape == (0, 8)


def packed_batch(q_lens: list[int], cached: list[int], hq: int, hkv: int, d: int):
    """Sequences of new tokens q_lens[b], each after a cached prefix of cached[b] keys held
    in ring order (slots rotated); keys of sequence b: its prefix, then its new tokens."""
    q_pos, k_pos, seq_q, seq_k = [], [], [], []
    for b, (n, c) in enumerate(zip(q_lens, cached)):
        shift = draw(0, max(c - 1, 0))
        q_pos.append(torch.arange(c, c + n))
        k_pos.append(torch.cat([torch.arange(c).roll(shift), torch.arange(c, c + n)]))
        seq_q.append(torch.full((n,), b))
        seq_k.append(torch.full((c + n,), b))
    q_pos, k_pos, seq_q, seq_k = (torch.cat(x) for x in (q_pos, k_pos, seq_q, seq_k))
    cu = [torch.tensor([0, *torch.tensor(x).cumsum(0).tolist()], dtype=torch.int32)
          for x in (q_lens, [n + c for n, c in zip(q_lens, cached)])]
    t, s = len(q_pos), len(k_pos)
    q, k, v = torch.randn(t, hq, d), torch.randn(s, hkv, d), torch.randn(s, hkv, d)
    return q, k, v, cu, q_pos, k_pos, seq_q[:, None] == seq_k[None, :]


# (query lengths, cached prefix lengths, Hq, Hkv, D, window): windows below and above
# the sequence lengths; 70-token sequences span two 64-query blocks and several key blocks.
ATTENTION_CASES = {
    "causal-gqa4-d256": ([5, 70, 33], [0, 0, 0], 4, 1, 256, None),
    "window16-gqa4-d256": ([5, 70, 33], [0, 0, 0], 4, 1, 256, 16),
    "window1000-gqa1-d64": ([40, 1, 70], [0, 0, 0], 2, 2, 64, 1000),
    "window7-gqa1-d64": ([70, 9], [0, 0], 2, 2, 64, 7),
    "cached-prefix-gqa4-d256": ([3, 50], [40, 90], 4, 1, 256, None),
    "cached-ring-window32-gqa2-d72": ([20, 6], [32, 32], 4, 2, 72, 32),
}


@pytest.mark.parametrize("case", ATTENTION_CASES)
def test_attention_matches_the_reference(case):
    q_lens, cached, hq, hkv, d, window = ATTENTION_CASES[case]
    q_lens = [n + draw(0, 3) for n in q_lens]
    q, k, v, (cu_q, cu_k), q_pos, k_pos, same = packed_batch(q_lens, cached, hq, hkv, d)
    scale = d ** -0.5
    mask = position_mask(q_pos, k_pos, same, window)
    got = attention_triton(q, k, v, cu_q, cu_k, q_pos, k_pos, scale, window)
    close(got, attention(q, k, v, mask, scale))


@pytest.mark.parametrize("window", [None, 6])
def test_attention_token_trees_after_a_cached_prefix(window):
    """Branch passes: each sequence's new tokens form a random forest (a token sees its
    ancestors, at depth positions after the prefix) behind a cached prefix."""
    q_lens, cached = [9, 70, 1], [5, 40, 3]
    q, k, v, (cu_q, cu_k), q_pos, k_pos, same = packed_batch(q_lens, cached, 4, 1, 64)
    t, s = same.shape
    tree, vis = torch.zeros(t, t, dtype=torch.bool), same.clone()
    for b, (n, c) in enumerate(zip(q_lens, cached)):
        parents = [-1] + [draw(-1, i - 1) for i in range(1, n)]
        depth = [0] * n
        for i, p in enumerate(parents):
            depth[i] = depth[p] + 1 if p >= 0 else 0
        qs, ks = int(cu_q[b]), int(cu_k[b]) + c
        q_pos[qs:qs + n] = k_pos[ks:ks + n] = c + torch.tensor(depth)
        tree[qs:qs + n, qs:qs + n] = vis[qs:qs + n, ks:ks + n] = tree_visible(parents)
    got = attention_triton(q, k, v, cu_q, cu_k, q_pos, k_pos, 0.125, window, tree)
    close(got, attention(q, k, v, position_mask(q_pos, k_pos, vis, window), 0.125))


def test_attention_refuses_heads_that_do_not_group():
    q, k, v, (cu_q, cu_k), q_pos, k_pos, _ = packed_batch([4], [0], 3, 2, 64)
    with pytest.raises(ValueError, match="multiple"):
        attention_triton(q, k, v, cu_q, cu_k, q_pos, k_pos, 0.1)


@pytest.mark.parametrize("window", [None, 2])
@pytest.mark.parametrize("d", [64, 256])
def test_attention_block_edges(d, window):
    """Block skipping at its boundaries (64- and 32-key blocks): a last query whose own key
    opens a key block, and (window 2) a key block whose last key is the oldest one the
    first query of the next query block still sees."""
    q, k, v, (cu_q, cu_k), q_pos, k_pos, same = packed_batch([65, 33, 64], [0, 0, 0], 2, 1, d)
    got = attention_triton(q, k, v, cu_q, cu_k, q_pos, k_pos, 0.125, window)
    close(got, attention(q, k, v, position_mask(q_pos, k_pos, same, window), 0.125))
