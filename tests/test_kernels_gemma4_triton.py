"""The kernels Gemma 4 adds, against their torch references in the Triton interpreter on
the CPU (fp32 operands, small shapes drawn fresh each run, as test_kernels_triton.py):
the layer scalar and the unnormed stream in add_rms_norm, V's weightless norm beside
q/k norm + RoPE, proportional RoPE tables, gelu times the per-layer input, the softcap
(alone and inside the head's logsumexp), the per-layer inputs from a packed or dense
table; then a whole Gemma 4 engine call on the interpreted kernels against the reference."""

from __future__ import annotations

import pytest
import torch

from decider.bench.random_gemma4 import SHAPES
from decider.kernels import embed, embed_triton, fused, fused_triton
from decider.kernels import qmatmul as qm
from decider.kernels import qmatmul_tiles as tiles
from decider.kernels import qmatmul_triton as qmt
from helpers.interpreted import triton  # noqa: F401 (first: it turns the interpreter on)
from helpers.qweights import close, random_qweight
from helpers.trees import draw


def test_add_rms_norm_with_the_layer_scalar_and_without_a_next_norm():
    t, n = draw(1, 9), 40
    x, y = torch.randn(t, n), torch.randn(t, n)
    w1, w2, s = torch.randn(n), torch.randn(n), torch.rand(1) + 0.3
    for w_next, scale in ((w2, s), (None, None), (None, s)):
        for got, want in zip(fused_triton.add_rms_norm(x, y, w1, w_next, 1e-6, scale),
                             fused.add_rms_norm(x, y, w1, w_next, 1e-6, scale), strict=True):
            close(got, want)
    stream, h = fused.add_rms_norm(x, y, w1, None, 1e-6, s)
    close(stream, (x + fused.rms_norm(y, w1, 1e-6)) * s)  # the scalar on the whole stream
    assert torch.equal(h, stream)


@pytest.mark.parametrize("t", [3, 300, 1100])
def test_add_rms_norm_on_rows_as_wide_as_31bs(t):
    """31B's 5,376 columns take wider tiles than the swept rows (more warps, fewer rows a
    program): each token's row still normed whole."""
    n = 5376
    x, y = torch.randn(t, n), torch.randn(t, n)
    w1, w2 = torch.randn(n), torch.randn(n)
    for got, want in zip(fused_triton.add_rms_norm(x, y, w1, w2, 1e-6),
                         fused.add_rms_norm(x, y, w1, w2, 1e-6), strict=True):
        close(got, want)


@pytest.mark.parametrize("rotated", [None, 4])
def test_q_k_norm_rope_and_the_weightless_v_norm(rotated):
    """q heads by w_q, k heads by w_k, both rotated (all pairs, or the first `rotated`
    of the whole head's frequencies); the v heads normed without a weight, unrotated."""
    t, hq, hkv, d = draw(1, 7), 4, 2, 32
    heads = torch.randn(t, hq + 2 * hkv, d)
    want = heads.clone()
    wq, wk = torch.randn(d), torch.randn(d)
    pos = torch.randint(0, 40, (t,))
    cos, sin = fused.rope_tables(40, d, 1e6, rotated=rotated)
    fused.qk_norm_rope_(want, hq, wq, wk, pos, cos, sin, 1e-6, n_v=hkv)
    fused_triton.qk_norm_rope_(heads, hq, wq, wk, pos, cos, sin, 1e-6, n_v=hkv)
    close(heads, want)
    v = heads[:, hq + hkv:]
    close(v.pow(2).mean(-1), torch.ones(t, hkv))  # unit RMS, no weight, no rotation
    assert cos.shape == sin.shape == (40, rotated or d // 2)  # the pairs that turn alone


def test_pairs_past_the_tables_stay_as_at_angle_zero():
    """Tables of the first 4 of 16 pairs rotate as whole-head tables whose other pairs
    are at angle 0 (cos 1, sin 0)."""
    t, d = draw(1, 7), 32
    heads = torch.randn(t, 6, d)
    wq, wk = torch.randn(d), torch.randn(d)
    pos = torch.randint(1, 40, (t,))
    cos, sin = fused.rope_tables(40, d, 1e6, rotated=4)
    whole = (torch.cat([cos, torch.ones(40, 12)], 1), torch.cat([sin, torch.zeros(40, 12)], 1))
    still = (torch.ones(40, 16), torch.zeros(40, 16))
    for rope in (fused.qk_norm_rope_, fused_triton.qk_norm_rope_):
        got, want, unturned = heads.clone(), heads.clone(), heads.clone()
        rope(got, 4, wq, wk, pos, cos, sin, 1e-6)
        rope(want, 4, wq, wk, pos, *whole, 1e-6)
        rope(unturned, 4, wq, wk, pos, *still, 1e-6)
        close(got, want)
        # pair i is dims i and 16 + i: 0-3 and 16-19 turn, the others stay
        assert not torch.allclose(got[..., :4], unturned[..., :4])
        close(got[..., 4:16], unturned[..., 4:16])
        close(got[..., 20:], unturned[..., 20:])
    for rope in (fused.qk_norm_rope_, fused_triton.qk_norm_rope_):
        with pytest.raises(ValueError, match="0 < P <= 16"):
            rope(heads, 4, wq, wk, pos, torch.ones(40, 17), torch.zeros(40, 17), 1e-6)


def test_gelu_times_and_the_softcap():
    g, m = torch.randn(5, 300), torch.randn(5, 600)[:, ::2].contiguous()
    close(fused_triton.gelu_times(g, m), fused.gelu_times(g, m))
    x = torch.randn(3, 2000) * 40
    close(fused_triton.softcap_(x.clone(), 30.0), fused.softcap_(x.clone(), 30.0))
    assert float(fused.softcap_(x.clone(), 30.0).abs().max()) < 30.0


@pytest.mark.parametrize("m", [1, 20])
def test_the_heads_logsumexp_of_softcapped_logits(m):
    w = random_qweight(1000, 64, 4, 32)
    x = torch.randn(m, 64) * 3
    want = qm.qmatmul_logsumexp(x, w, softcap=30.0)
    close(qmt.qmatmul_logsumexp(x, w, softcap=30.0), want)
    assert not torch.allclose(want, qm.qmatmul_logsumexp(x, w), atol=1e-2)


def test_the_heads_logsumexp_of_many_rows_multiplies_a_dequantized_copy(monkeypatch):
    """From LARGE_M rows of fp16 the weight is dequantized and multiplied dense, in
    chunks (three here, of 1,024, 1,024 and 952 rows: HEAD_CHUNK made small): the
    softcapped logsumexp as on the packed weight's tiles."""
    monkeypatch.setattr(qmt, "HEAD_CHUNK", 1024 * 64)
    w = random_qweight(3000, 64, 4, 32)
    x = (torch.randn(qmt.LARGE_M + 44, 64) * 3).half()
    got = qmt.qmatmul_logsumexp(x, w, softcap=30.0)
    # both round the weight to fp16 alike: only the sums' order differs
    close(got, qmt.qmatmul_logsumexp(x, w, softcap=30.0, blocks=(64, 64, 32, 4, 2, 1)))
    # against fp32 weights: fp16 rounding of each weight, 2^-11 relative at most
    torch.testing.assert_close(got, qm.qmatmul_logsumexp(x.float(), w, softcap=30.0),
                               rtol=1e-3, atol=0.0)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_large_pass_multiplies_every_linear_dequantized_but_never_a_head(shape):
    """From LARGE_M rows of fp16 each linear of the real shapes, up to 31B's gate/up
    (43,008 x 5,376), takes the dense copy; a vocabulary's head keeps its own chunked
    path (a copy of it would be 0.8 GB and more)."""
    s = SHAPES[shape]
    h, q = s["hidden"], s["heads"] * s["head_dim_full"]
    ffn = s["ffn"] * (2 if s.get("double_wide") else 1)
    def q4_0(n: int, k: int) -> qm.QWeight:  # never read: empty tensors of the real sizes
        return qm.QWeight(torch.empty(n, k // 2, dtype=torch.uint8),
                          torch.empty(n, k // 32, dtype=torch.float16), None, 32, 4)

    for n, k in ((q + 2 * s["kv_heads"] * s["head_dim"], h), (h, q), (2 * ffn, h), (h, ffn)):
        assert tiles.takes_dense(tiles.LARGE_M, q4_0(n, k), torch.float16), (shape, n, k)
        assert not tiles.takes_dense(tiles.LARGE_M - 1, q4_0(n, k), torch.float16)
    assert not tiles.takes_dense(tiles.LARGE_M, q4_0(s["vocab"], h), torch.float16)


@pytest.mark.parametrize("table", ["4bit-g32", "dense"])
def test_per_layer_inputs_from_a_packed_or_dense_table(table):
    t, layers, p, hidden = draw(1, 300), 3, 32, 48
    tab = random_qweight(50, layers * p, 4, 32) if table == "4bit-g32" \
        else torch.randn(50, layers * p)
    ids = torch.randint(0, 50, (t,), dtype=torch.int32)
    proj, norm = torch.randn(t, layers * p) * 4, torch.rand(p) + 0.5
    close(embed_triton.per_layer_inputs_triton(proj, tab, ids, norm, 1e-6, hidden),
          embed.per_layer_inputs(proj, tab, ids, norm, 1e-6, hidden))


def test_a_whole_gemma4_engine_call_on_the_triton_kernels_matches_the_reference(
        monkeypatch, tmp_path):
    """Per-layer inputs, a shared layer reading its donor (through the cache in chunks
    for the long job), the softcapped head; within the CPU path's 1e-3."""
    from test_kernels_triton import (
        assert_on_the_triton_kernels_it_matches_the_reference,
    )

    from decider.bench.random_gemma4 import write_gemma4
    from decider.engines import ScoreJob
    from helpers.seeds import seeded
    from helpers.tiny import VOCAB, rand_branch, rand_ids

    rng = seeded("whole-engine")
    path = write_gemma4(tmp_path / "m.gguf", rng, layers=4, kinds=[True, False, True, False],
                        shared_kv=2, hidden=128, ffn=256, ple=32, double_wide=True,
                        window=16, vocab=VOCAB)
    jobs = [ScoreJob((2, *rand_ids(rng, n)), (rand_branch(rng, 3),))
            for n in (5, 60)]  # 60: through the cache in 48-token chunks
    assert_on_the_triton_kernels_it_matches_the_reference(path, jobs, monkeypatch)


def symmetric_qweight(n: int, k: int, group: int = 32) -> qm.QWeight:
    """4-bit codes without an offset, fp16 scales: Q4_0 and QAT W4A16 as they are held."""
    scale = (torch.rand(n, k // group) * 0.1 + 0.01).half()
    return qm.QWeight(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8), scale, None,
                      group, 4)


@pytest.mark.parametrize("m", [1, 40])
def test_symmetric_4bit_weights_with_fp16_scales_match_the_reference(m):
    """(code - 8) * scale, the scale widened from fp16: the matmul (plain, gelu epilogue,
    the head's logsumexp), the dequantize kernel (bit for bit) and the embedding."""
    from decider.kernels.qmatmul_triton import dequantize_triton

    w, gate_up = symmetric_qweight(70, 128), symmetric_qweight(2 * 35, 128)
    x = torch.randn(m, 128)
    close(qmt.qmatmul_triton(x, w), qm.qmatmul(x, w))
    close(qmt.qmatmul_gelu_triton(x, gate_up), qm.qmatmul_gelu(x, gate_up))
    close(qmt.qmatmul_logsumexp(x, w, softcap=30.0), qm.qmatmul_logsumexp(x, w, softcap=30.0))
    assert torch.equal(dequantize_triton(w, torch.float32), qm.dequantize(w))
    assert torch.equal(qm.dequantize(w)[:, :2], ((torch.stack(
        [w.codes[:, 0] & 15, w.codes[:, 0] >> 4], -1).float() - 8) * w.scale[:, :1].float()))
    ids = torch.randint(0, 70, (m,), dtype=torch.int32)
    scale, norm = torch.tensor(128 ** 0.5), torch.rand(128) + 0.5
    for got, want in zip(embed_triton.embed_rms_norm_triton(w, ids, scale, norm, 1e-6),
                         embed.embed_rms_norm(w, ids, scale, norm, 1e-6), strict=True):
        close(got, want)
