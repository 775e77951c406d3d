"""Torch reference kernels against direct computations."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from decider.engines.random_gguf import T, random_blocks

from decider.engines.gemma3 import qweight
from decider.engines.gguf_weights import pack
from decider.kernels import qmatmul as qm
from decider.kernels.attention import attention, position_mask, tree_visible, varlen_visible

TYPES = [T.Q4_0, T.Q4_1, T.Q4_K, T.Q5_0, T.Q6_K, T.Q8_0]


def packed(qtype, rows, cols, rng):
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    raw = random_blocks(qtype, rows * cols // block, rng).reshape(rows, -1)
    return qweight(pack(raw, qtype, rows, "w")), gguf.quants.dequantize(raw, qtype)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequantize_reads_packed_words_exactly(qtype):
    w, ref = packed(qtype, 8, 512, np.random.default_rng())
    got = qm.dequantize(w).numpy() + np.float32(0)  # -0.0 -> +0.0 (see test_gguf_weights)
    assert np.array_equal(got.view(np.uint32), (ref + np.float32(0)).view(np.uint32))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_qmatmul_and_embed_match_the_dense_weight(qtype, monkeypatch):
    monkeypatch.setattr(qm, "CHUNK_ROWS", 16)  # 40 rows: three chunks
    rng = np.random.default_rng()
    w, ref = packed(qtype, 40, 256, rng)
    x = torch.randn(5, 256)
    # fp32 sums in another order: 1e-5 relative to the size of the products
    want = x @ torch.from_numpy(ref).T
    torch.testing.assert_close(qm.qmatmul(x, w), want, rtol=1e-5, atol=1e-5 * want.abs().max())
    ids = torch.tensor([3, 39, 3, 0])
    assert torch.equal(qm.embed(w, ids), torch.from_numpy(ref)[ids] + 0.0)
    sub = w.rows(torch.tensor([7, 2]))
    assert torch.equal(qm.dequantize(sub), torch.from_numpy(ref)[[7, 2]] + 0.0)


def naive_attention(q, k, v, allowed, scale):
    """One query, one head at a time, in float64."""
    t, hq, d = q.shape
    g = hq // k.shape[1]
    out = torch.zeros(t, hq, d, dtype=torch.float64)
    for i in range(t):
        keys = [j for j in range(k.shape[0]) if allowed(i, j)]
        for h in range(hq):
            s = torch.stack([q[i, h].double() @ k[j, h // g].double() for j in keys]) * scale
            out[i, h] = torch.softmax(s, 0) @ v[keys, h // g].double()
    return out.float()


def test_varlen_causal_sliding_gqa_attention_matches_a_naive_loop():
    lengths, window, scale = [5, 13, 9], 4, 0.3
    seq = torch.repeat_interleave(torch.arange(3), torch.tensor(lengths))
    pos = torch.cat([torch.arange(n) for n in lengths])
    q, k, v = torch.randn(27, 4, 16), torch.randn(27, 2, 16), torch.randn(27, 2, 16)
    for w in (None, window):
        mask = position_mask(pos, pos, varlen_visible(seq), w)
        got = attention(q, k, v, mask, scale)
        want = naive_attention(q, k, v, lambda i, j: bool(
            seq[i] == seq[j] and pos[j] <= pos[i] and (w is None or pos[i] - pos[j] < w)), scale)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # fp32 vs float64


def test_attention_matches_sdpa_per_sequence():
    q, k, v = torch.randn(300, 4, 32), torch.randn(300, 1, 32), torch.randn(300, 1, 32)
    pos = torch.arange(300)  # > BLOCK_Q: two query blocks
    got = attention(q, k, v, position_mask(pos, pos, varlen_visible(pos * 0), None), 0.2)
    want = F.scaled_dot_product_attention(q.transpose(0, 1), k.expand(-1, 4, -1).transpose(0, 1),
                                          v.expand(-1, 4, -1).transpose(0, 1), is_causal=True,
                                          scale=0.2).transpose(0, 1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_tree_visibility_is_self_and_ancestors():
    # 0 <- 1 <- 2, 1 <- 3 <- 4, and a second root 5
    vis = tree_visible([-1, 0, 1, 1, 3, -1])
    rows = [set(torch.nonzero(r).flatten().tolist()) for r in vis]
    assert rows == [{0}, {0, 1}, {0, 1, 2}, {0, 1, 3}, {0, 1, 3, 4}, {5}]
