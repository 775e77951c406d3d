"""Torch reference kernels against direct computations."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from decider.bench.random_gguf import T, random_blocks
from decider.engines.gguf_weights import pack
from decider.engines.layers import qweight
from decider.kernels import embed, fused
from decider.kernels import qmatmul as qm
from decider.kernels.attention import attend, pass_mask, tree_bounds
from helpers.trees import ancestors, draw, random_forest

# every test draws from torch's global generator: seeded by the rng fixture
pytestmark = pytest.mark.usefixtures("rng")

TYPES = [T.Q4_0, T.Q4_1, T.Q4_K, T.Q5_0, T.Q6_K, T.Q8_0]


def packed(qtype, rows, cols, rng):
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    raw = random_blocks(qtype, rows * cols // block, rng).reshape(rows, -1)
    return qweight(pack(raw, qtype, rows, "w")), gguf.quants.dequantize(raw, qtype)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequantize_reads_packed_words_exactly(qtype, rng):
    w, ref = packed(qtype, 8, 512, rng)
    got = qm.dequantize(w).numpy() + np.float32(0)  # -0.0 -> +0.0 (see test_gguf_weights)
    assert np.array_equal(got.view(np.uint32), (ref + np.float32(0)).view(np.uint32))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_qmatmul_and_embed_match_the_dense_weight(qtype, monkeypatch, rng):
    monkeypatch.setattr(qm, "CHUNK_ROWS", 16)  # 40 rows: three chunks
    w, ref = packed(qtype, 40, 256, rng)
    x = torch.randn(5, 256)
    # fp32 sums in another order: 1e-5 relative to the size of the products
    want = x @ torch.from_numpy(ref).T
    torch.testing.assert_close(qm.qmatmul(x, w), want, rtol=1e-5, atol=1e-5 * want.abs().max())
    ids = torch.tensor([3, 39, 3, 0])
    assert torch.equal(embed.embed(w, ids), torch.from_numpy(ref)[ids] + 0.0)
    sub = w.rows(torch.tensor([7, 2]))
    assert torch.equal(qm.dequantize(sub), torch.from_numpy(ref)[[7, 2]] + 0.0)


def test_half_precision_qmatmul_into_fp32_sums_in_fp32(rng):
    """The head's logits: fp16 activations and weights, products summed in fp32 (the
    kernel's accumulator), so a sum past fp16's range stays finite and exact."""
    w, ref = packed(T.Q8_0, 4, 256, rng)
    x = torch.full((2, 256), 60.0, dtype=torch.float16)
    w = qm.QWeight(w.codes, w.scale * 1000, None, w.group, w.bits)  # sums past 65504
    got = qm.qmatmul(x, w, torch.empty(2, 4))
    want = x.float() @ qm.dequantize(w, torch.float16).float().T
    assert want.abs().max() > 65504 and torch.equal(got, want)
    assert qm.qmatmul(x, w).dtype == torch.float16  # into x.dtype unless told


def test_qmatmul_gelu_is_gelu_times_up_of_interleaved_rows(rng):
    w, ref = packed(T.Q5_0, 48, 64, rng)  # rows 2i gate i, 2i + 1 up i
    x = torch.randn(7, 64)
    y = x @ torch.from_numpy(ref).T
    want = F.gelu(y[:, 0::2], approximate="tanh") * y[:, 1::2]
    torch.testing.assert_close(qm.qmatmul_gelu(x, w), want, rtol=1e-5,
                               atol=1e-5 * want.abs().max())


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


@pytest.mark.parametrize("window", [None, 1, 4])
@pytest.mark.parametrize("branchy", [False, True])
def test_pass_bounds_say_ancestors_inside_the_window(branchy, window):
    parents, pos = random_forest([draw(1, 12) for _ in range(4)], branchy)
    lo, end = tree_bounds(parents, pos, window)
    got = pass_mask(torch.from_numpy(lo), torch.from_numpy(end))
    for i in range(len(parents)):
        want = {j for j in ancestors(parents, i) if window is None or pos[i] - pos[j] < window}
        assert set(torch.nonzero(got[i]).flatten().tolist()) == want


def test_tree_attention_with_a_cached_prefix_matches_a_naive_loop():
    """GQA, sliding window: a forest of token trees after a cached prefix held in ring
    order (slots rotated, two empty)."""
    window, scale, n_cached = 5, 0.3, 9
    parents, pos = random_forest([7, 13, 1], branchy=True)
    pos = [p + n_cached for p in pos]
    lo, end = (torch.from_numpy(a) for a in tree_bounds(parents, pos, window))
    t = len(parents)
    cpos = torch.cat([torch.arange(n_cached).roll(3), torch.tensor([-1, -1])]).int()
    q = torch.randn(t, 4, 16)
    k, v, ck, cv = torch.randn(t, 2, 16), torch.randn(t, 2, 16), torch.randn(11, 2, 16), \
        torch.randn(11, 2, 16)
    got = attend(q, k, v, lo, end, scale, cache=(ck, cv, cpos), q_pos=torch.tensor(pos),
                 window=window)
    keys, values = torch.cat([ck, k]), torch.cat([cv, v])

    def allowed(i: int, j: int) -> bool:
        if j < 11:  # a cache slot
            return bool(cpos[j] >= 0 and pos[i] - cpos[j] < window)
        j -= 11
        return j in ancestors(parents, i) and pos[i] - pos[j] < window

    torch.testing.assert_close(got, naive_attention(q, keys, values, allowed, scale),
                               rtol=1e-5, atol=1e-5)  # fp32 vs float64


def test_attention_matches_sdpa_on_one_long_sequence():
    q, k, v = torch.randn(300, 4, 32), torch.randn(300, 1, 32), torch.randn(300, 1, 32)
    lo, end = (torch.from_numpy(a) for a in tree_bounds([-1, *range(299)], list(range(300)),
                                                         None))
    got = attend(q, k, v, lo, end, 0.2)  # > BLOCK_Q: two query blocks
    want = F.scaled_dot_product_attention(q.transpose(0, 1), k.expand(-1, 4, -1).transpose(0, 1),
                                          v.expand(-1, 4, -1).transpose(0, 1), is_causal=True,
                                          scale=0.2).transpose(0, 1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_fused_steps_match_their_plain_definitions():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm, apply_rotary_pos_emb

    x, y = torch.randn(6, 40), torch.randn(6, 40)
    w1, w2 = torch.randn(40), torch.randn(40)

    def hf_norm(v, w):  # transformers' Gemma RMSNorm holds w and multiplies by 1 + w
        norm = Gemma3RMSNorm(40, eps=1e-6)
        norm.weight.data = w - 1
        return norm(v)

    torch.testing.assert_close(fused.rms_norm(x, w1, 1e-6), hf_norm(x, w1))
    xs, h = fused.add_rms_norm(x, y, w1, w2, 1e-6)
    torch.testing.assert_close(xs, x + hf_norm(y, w1))
    torch.testing.assert_close(h, hf_norm(x + hf_norm(y, w1), w2))
    gu = torch.randn(5, 2 * 24)  # gate and up interleaved
    torch.testing.assert_close(fused.gelu_mul(gu), F.gelu(gu[:, 0::2], approximate="tanh")
                               * gu[:, 1::2])

    heads = torch.randn(7, 3 + 1 + 1, 16)  # q heads, k head, v head (left alone)
    wq, wk = torch.randn(16), torch.randn(16)
    pos = torch.tensor([0, 5, 6, 6, 7, 30, 2])
    cos, sin = fused.rope_tables(32, 16, 10_000.0, 2.0)
    want_v = heads[:, 4].clone()
    q, k = hf_norm(heads[:, :3], wq), hf_norm(heads[:, 3:4], wk)
    inv = 1.0 / (10_000.0 ** (torch.arange(0, 16, 2).float() / 16)) / 2.0
    ang = torch.cat([pos[:, None] * inv, pos[:, None] * inv], -1)
    q, k = apply_rotary_pos_emb(q, k, ang.cos(), ang.sin())  # [T, H, D], cos [T, D]
    fused.qk_norm_rope_(heads[:, :4], 3, wq, wk, pos, cos, sin, 1e-6)
    torch.testing.assert_close(heads[:, :3], q)
    torch.testing.assert_close(heads[:, 3:4], k)
    assert torch.equal(heads[:, 4], want_v)


@pytest.mark.parametrize("types", [(T.Q5_0, T.Q8_0), (T.Q4_1, T.Q5_0), (T.F32, T.F32)],
                         ids=["joined", "separate", "dense"])
def test_an_interleaved_projection_alternates_its_two_weights_rows(types, rng):
    """Linear(interleave=True): output column 2i from the first weight, 2i + 1 from the
    second, whether the two pack into one weight (one matmul), differ in form (one each)
    or are dense; .gelu is gelu_mul of that output."""
    from decider.engines.layers import Linear

    weights, dense = [], []
    for qtype in types:
        block, _ = gguf.GGML_QUANT_SIZES[qtype]
        raw = random_blocks(qtype, 24 * 64 // block, rng).reshape(24, -1) if qtype != T.F32 \
            else rng.standard_normal((24, 64)).astype(np.float32)
        weights.append(pack(raw, qtype, 24, "w") if qtype != T.F32 else raw)
        dense.append(torch.from_numpy(raw if qtype == T.F32
                                      else gguf.quants.dequantize(raw, qtype)))
    linear = Linear(weights, torch.float32, interleave=True)
    assert len(linear.parts) == (2 if types == (T.Q4_1, T.Q5_0) else 1)
    x = torch.randn(5, 64)
    want = torch.stack([x @ dense[0].T, x @ dense[1].T], -1).flatten(1)  # [5, 48]
    got = linear(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max())
    torch.testing.assert_close(linear.gelu(x), fused.gelu_mul(got))
