"""Triton kernels against the torch references, in the Triton interpreter on the CPU
(attention: test_kernels_attention_triton.py).

fp32 operands only: the interpreter's bf16 tl.dot is wrong. Shapes are small and drawn
fresh each run inside each case's regime (the ids say which). Tolerance: fp32 sums in
another order, 1e-4 relative to the largest output (measured: below 1e-6). gelu is
checked against float64: torch's fp32 tanh form loses digits to 1 + tanh(z) for very
negative gates (2 in 3000 draws of one case missed the bound that way).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from decider.kernels import (
    arrivals,
    embed,
    embed_triton,
    fused,
    fused_triton,
)
from decider.kernels import qmatmul as qm
from decider.kernels import qmatmul_tiles as tiles
from decider.kernels import qmatmul_triton as qmt
from decider.kernels.columns import columns
from decider.kernels.columns_triton import columns_triton
from decider.kernels.qmatmul_triton import dequantize_triton, qmatmul_triton
from helpers.interpreted import triton
from helpers.qweights import close, random_qweight
from helpers.trees import draw, random_job

# every test draws from torch's global generator: seeded by the rng fixture
pytestmark = pytest.mark.usefixtures("rng")


# (bits, group, M range, N range, groups along K): M <= 16 takes the 16-row tile, more rows
# tiles of half of them up to 128; N ranges are ragged against the 16-64-wide tiles.
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
    # the engine's tiles for a few rows: 256-wide K tiles, two K slices from K = 2048
    "8bit-g16-M40-K2048": (8, 16, (17, 100), (1, 40), (128, 128)),
    "4bit-g32-M64-K1024": (4, 32, (33, 64), (1, 40), (32, 32)),
}


@pytest.mark.parametrize("case", QMATMUL_CASES)
def test_qmatmul_matches_the_reference(case):
    bits, group, ms, ns, gs = QMATMUL_CASES[case]
    m, n, k = draw(*ms), draw(*ns), group * draw(*gs)
    w = random_qweight(n, k, bits, group)
    x = torch.randn(m, k)
    close(qmatmul_triton(x, w), qm.qmatmul(x, w))
    gate_up = random_qweight(2 * n, k, bits, group)  # gelu in the epilogue: pairs of rows
    y = qm.qmatmul(x.double(), gate_up)  # float64: fp32's 1 + tanh cancels for gate << 0
    close(qmt.qmatmul_gelu_triton(x, gate_up).double(),
          torch.nn.functional.gelu(y[:, 0::2], approximate="tanh") * y[:, 1::2])


def test_dense_matmul_matches_torch_plain_and_with_gelu():
    """The matmul of large passes on the weight dequantized for them: ragged M and N
    against the built-in tiles, K in whole tiles of 64."""
    m, n, k = draw(129, 300), 2 * draw(65, 150), 64 * draw(1, 4)
    x, w = torch.randn(m, k), torch.randn(n, k)
    close(qmt.matmul_dense_triton(x, w), x @ w.T)
    y = x.double() @ w.double().T
    close(qmt.matmul_dense_triton(x, w, gelu=True).double(),
          torch.nn.functional.gelu(y[:, 0::2], approximate="tanh") * y[:, 1::2])
    with pytest.raises(ValueError, match=r"w must be \[N, "):
        qmt.matmul_dense_triton(x, w[:, 1:])


def test_a_dense_copy_of_the_wrong_shape_or_dtype_is_refused():
    """A large pass multiplies the copy it is given (made ahead by the engine): one that
    does not match the packed weight is an error, not a wrong product."""
    w = random_qweight(64, 128, 8, 32)
    x = torch.randn(tiles.LARGE_M, 128, dtype=torch.float16)
    assert tiles.takes_dense(len(x), w, x.dtype)
    for bad in (torch.zeros(64, 96, dtype=torch.float16), torch.zeros(64, 128)):
        with pytest.raises(ValueError, match=r"dense must be \[64, 128\] in torch.float16"):
            qmatmul_triton(x, w, dense=bad)
        with pytest.raises(ValueError, match=r"dense must be \[64, 128\]"):
            qmt.qmatmul_gelu_triton(x, w, dense=bad)


@pytest.mark.parametrize("hidden,q,kv,ffn", [(640, 1024, 256, 2048), (1152, 1024, 256, 6912),
                                           (2560, 2048, 1024, 10240), (3840, 4096, 2048, 15360),
                                           (5376, 4096, 2048, 21504),
                                           (1536, 4096, 1024, 12288), (2560, 4096, 2048, 10240),
                                           (5376, 16384, 4096, 21504)],
                         ids=["270m", "1b", "4b", "12b", "27b", "gemma-4-e2b", "gemma-4-e4b",
                              "gemma-4-31b"])
def test_tile_choice_launches_on_every_gemma_shape(hidden, q, kv, ffn):
    """Every projection of each Gemma 3 and 4 size (Gemma 4's largest full-layer and
    double-wide MLP forms), at every pass size the graphs capture and
    in both activation widths: the built-in tiles are ones the launcher accepts (K tiles
    that divide K and its slices, whole groups, split-K only within its counts)."""
    linears = {"qkv": (hidden, q + 2 * kv), "o": (q, hidden), "gate_up": (hidden, 2 * ffn),
               "down": (ffn, hidden), "ple_gate": (hidden, 256), "ple_proj": (256, hidden),
               "ple_model_proj": (hidden, 35 * 256)}  # Gemma 4's per-layer inputs
    for (k, n), group, bits in itertools.product(linears.values(), (16, 32, 128), (4, 8)):
        for m, itemsize in itertools.product([1, 16, 17, 64, 128, 1024, 8192], (2, 4)):
            bm, bn, bk, _, _, split = tiles.choose(m, n, k, group, bits, itemsize)
            assert k % (split * bk) == 0 and (bk % group == 0 or group % bk == 0)
            assert split == 1 or triton.cdiv(m, bm) * triton.cdiv(n, bn) <= tiles.MAX_TILES


def test_the_dequantize_tile_fits_every_k_of_whole_groups():
    """Small and large weights (the wide tile from BIG_W elements) of every K up to
    16,384 made of whole groups: the K tile divides K and holds whole groups."""
    for group in (16, 32, 128):
        for k in range(group, 16385, group):
            for n in (1, tiles.BIG_W // k + 1):
                tiles.check_k_tile(k, tiles.dequantize_tile(n, k, group)[1], group)


# (embedding, activation dtype, tokens): packed 4-bit with offsets and 8-bit codes, a
# dense table; one token a program up to 256 tokens, four past them (no bf16: the
# interpreter does not round to it as the GPU does; tests/gpu checks it)
EMBEDDINGS = {"4bit-g32-fp32": ("q4", torch.float32, 5),
              "8bit-g16-fp16": ("q8", torch.float16, 300),
              "dense-fp16": ("dense", torch.float16, 7), "4bit-g32-fp16": ("q4", torch.float16, 1)}


@pytest.mark.parametrize("case", EMBEDDINGS)
def test_embed_rms_norm_matches_the_reference(case):
    kind, dtype, t = EMBEDDINGS[case]
    w = {"q4": lambda: random_qweight(50, 96, 4, 32),
         "q8": lambda: random_qweight(50, 96, 8, 16),
         "dense": lambda: torch.randn(50, 96).to(dtype)}[kind]()
    ids = torch.randint(0, 50, (t,), dtype=torch.int32)
    scale, norm = torch.tensor(96 ** 0.5, dtype=dtype), torch.rand(96) + 0.5
    x, h = embed_triton.embed_rms_norm_triton(w, ids, scale, norm, 1e-6)
    want_x, want_h = embed.embed_rms_norm(w, ids, scale, norm, 1e-6)  # CPU tensors: torch
    assert x.dtype == torch.float32 and h.dtype == dtype
    assert torch.equal(x, want_x)  # the same two roundings to the activation dtype
    torch.testing.assert_close(h.float(), want_h.float(), rtol=1e-2 if dtype != torch.float32
                               else 1e-5, atol=1e-5)


def test_qmatmul_reads_strided_rows_and_row_subsets():
    w = random_qweight(90, 128, 4, 32)
    x = torch.randn(7, 200)[:, 40:168]  # row stride 200
    index = torch.tensor([89, 3, 3, 50], dtype=torch.int32)  # label rows of a head
    close(qmatmul_triton(x, w.rows(index)), qm.qmatmul(x, w.rows(index)))
    close(qmatmul_triton(x, w, rows=index), qm.qmatmul(x, w.rows(index)))  # read in the kernel
    with pytest.raises(ValueError, match="rows must be int32"):
        qmatmul_triton(x, w, rows=index.long())


# (bits, group, M, N, K, tiles): split-K slices of one and of several K tiles, ragged M
# and N against the tiles
SPLIT_K_CASES = {
    "4bit-g32-split2": (4, 32, 20, 70, 256, (16, 32, 64, 4, 3, 2)),
    "8bit-g16-split4-two-tiles-a-slice": (8, 16, 33, 50, 512, (32, 16, 32, 4, 3, 4)),
    "8bit-g32-split5-wide-tile": (8, 32, 5, 40, 640, (16, 16, 128, 4, 3, 5)),
}


@pytest.mark.parametrize("case", SPLIT_K_CASES)
def test_split_k_sums_the_slices_in_a_fixed_order_and_leaves_the_counts_zero(case):
    bits, group, m, n, k, tiles = SPLIT_K_CASES[case]
    w = random_qweight(n, k, bits, group)
    x = torch.randn(m, k)
    got = qmatmul_triton(x, w, blocks=tiles)
    close(got, qm.qmatmul(x, w))
    assert torch.equal(qmatmul_triton(x, w, blocks=tiles), got)  # whichever slice is last
    assert not arrivals.counts(x.device).any()


def test_qmatmul_and_dequantize_refuse_tiles_that_do_not_divide_k():
    w = random_qweight(8, 192, 8, 32)
    with pytest.raises(ValueError, match="K tile 64 does not divide K=192 / split 2"):
        qmatmul_triton(torch.randn(2, 192), w, blocks=(16, 16, 64, 4, 3, 2))
    with pytest.raises(ValueError, match="K tile 128 does not divide K=192 / split 1"):
        dequantize_triton(w, torch.float32, (16, 128, 4))
    with pytest.raises(ValueError, match="K tile 48 does not divide K=192 / split 1 in "
                       "groups of 32"):
        dequantize_triton(w, torch.float32, (16, 48, 4))  # groups across two tiles


def test_qmatmul_refuses_a_wrong_shape_and_empty_m_is_empty():
    w = random_qweight(8, 64, 8, 32)
    with pytest.raises(ValueError, match=r"\[M, 64\]"):
        qmatmul_triton(torch.randn(2, 32), w)
    assert qmatmul_triton(torch.randn(0, 64), w).shape == (0, 8)


@pytest.mark.parametrize("tile", [None, (1, 4), (4, 2)], ids=str)
def test_fused_kernels_match_the_references(tile):
    """Each kernel at the built-in rows per program and at forced ones (9 and 7 tokens:
    the last block of 4 ragged)."""
    x, y = torch.randn(9, 40), torch.randn(9, 40)
    w1, w2 = torch.randn(40), torch.randn(40)
    close(fused_triton.rms_norm(x, w1, 1e-6, tile=tile), fused.rms_norm(x, w1, 1e-6))
    for got, want in zip(fused_triton.add_rms_norm(x, y, w1, w2, 1e-6, tile=tile),
                         fused.add_rms_norm(x, y, w1, w2, 1e-6), strict=True):
        close(got, want)
    gu = torch.randn(5, 2 * 1500)  # two column blocks
    close(fused_triton.gelu_mul(gu), fused.gelu_mul(gu))
    heads = torch.randn(7, 4 + 1 + 1, 32)
    want = heads.clone()
    wq, wk = torch.randn(32), torch.randn(32)
    pos = torch.tensor([0, 5, 6, 6, 7, 30, 2])
    cos, sin = fused.rope_tables(40, 32, 10_000.0)
    fused.qk_norm_rope_(want[:, :5], 4, wq, wk, pos, cos, sin, 1e-6)
    fused_triton.qk_norm_rope_(heads[:, :5], 4, wq, wk, pos, cos, sin, 1e-6, tile=tile)
    close(heads, want)  # the sixth head (v) untouched


def test_qmatmul_writes_into_a_column_slice():
    w = random_qweight(40, 64, 8, 32)
    x = torch.randn(5, 64)
    out = torch.full((5, 100), 7.0)
    qmatmul_triton(x, w, out[:, 30:70])
    close(out[:, 30:70], qm.qmatmul(x, w))
    assert (out[:, :30] == 7).all() and (out[:, 70:] == 7).all()


@pytest.mark.parametrize("bits,group", [(4, 32), (8, 16), (4, 128)])
@pytest.mark.parametrize("tile", [None, (16, 256, 2)], ids=["built-in", "large-weights"])
def test_dequantize_kernel_is_exact(bits, group, tile):
    """The large-M path's dequantize: fp32 products of the same words, bit for bit, on
    the built-in tile and on the one large weights take (rows ragged against both)."""
    w = random_qweight(70, 512, bits, group)
    assert torch.equal(dequantize_triton(w, torch.float32, tile), qm.dequantize(w))


@pytest.mark.parametrize("m,k", [(1, 64), (20, 64), (20, 2560)])
def test_logsumexp_head_never_writing_the_logits(m, k):
    """Ragged column blocks; a hidden size past 2048 (Gemma 3 4B), where the plain
    matmul's tiles split K, which the logsumexp's pairs cannot."""
    w = random_qweight(1000, k, 8, 32)  # 16 column blocks, the last ragged
    x = torch.randn(m, k)
    close(qmt.qmatmul_logsumexp(x, w), qm.qmatmul_logsumexp(x, w))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_norms_keep_an_fp32_residual_stream_beside_low_precision_sublayers(dtype):
    """The engine's bf16 layout: the stream fp32, sublayer outputs and norms in dtype."""
    x, y = torch.randn(9, 40), torch.randn(9, 40).to(dtype)
    w1, w2 = torch.rand(40) + 0.5, torch.rand(40) + 0.5  # |norm(y) * w| < 8
    got = fused_triton.add_rms_norm(x, y, w1, w2, 1e-6)
    want = fused.add_rms_norm(x, y, w1, w2, 1e-6)
    assert (got[0].dtype, got[1].dtype) == (torch.float32, dtype) == (want[0].dtype,
                                                                       want[1].dtype)
    # the interpreter and torch may round norm(y) to dtype one unit apart: 2^-5 below 8
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.float(), w.float(), rtol=1e-2, atol=2 ** -5)
    h = fused_triton.rms_norm(x, w1, 1e-6, dtype)
    assert h.dtype == dtype
    torch.testing.assert_close(h.float(), fused.rms_norm(x, w1, 1e-6, dtype).float(),
                               rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("budget", [10_000, 300, 40])
def test_columns_kernel_expands_packed_passes_as_the_reference(budget, rng):
    """Every pass of a random plan (packed trees, cache-writing chunks, branches read
    after them; hundreds of chains in the largest), padded by 0-300 tokens: the kernel's
    columns equal the reference's, across several 256-token programs."""

    from decider.engines.passes import lay_out

    window = int(rng.integers(1, 40))
    jobs = [random_job(rng) for _ in range(40)]
    for p in lay_out(jobs, budget, window).passes:
        packed = torch.from_numpy(p.pack())
        size = p.tokens + draw(0, 300)
        assert torch.equal(columns_triton(packed, size, window), columns(packed, size, window))


def test_whole_engine_calls_on_the_triton_kernels_match_the_reference(monkeypatch, tmp_path, rng):
    """The Triton engine's score() with every operation on the Triton kernels (CPU tensors,
    interpreted, fp32): packed token trees, a job too long for one pass going through the
    KV cache in chunks, label rows, the full-vocabulary logsumexp; the projections in
    gemma-3-270m's packed forms (q, k, v and gate, up joined: the fused epilogues run).
    Within the CPU path's 1e-3 of the transformers reference."""
    from decider.bench.random_gguf import Q4_K_M, write_tiny_gemma3
    from decider.engines import ScoreJob
    from helpers.tiny import VOCAB, rand_branch, rand_ids

    path = write_tiny_gemma3(tmp_path / "m.gguf", rng, layers=2, window=16, vocab=VOCAB,
                             types=Q4_K_M)
    jobs = [ScoreJob((2, *rand_ids(rng, n)), (rand_branch(rng, 3), rand_branch(rng, 2)))
            for n in (5, 20, 70)]  # 70: through the cache in 48-token chunks
    assert_on_the_triton_kernels_it_matches_the_reference(path, jobs, monkeypatch)


def assert_on_the_triton_kernels_it_matches_the_reference(path, jobs, monkeypatch) -> None:
    """The Triton engine's score() on `path` with every operation on the Triton kernels
    (CPU tensors, interpreted, fp32, 48-token passes) within 1e-3 of the reference."""
    from decider.engines import load_engine
    from decider.kernels import dispatch
    from helpers.tiny import max_diff

    reference = load_engine("reference", path, 256)
    monkeypatch.setattr(dispatch, "triton", lambda x: True)
    engine = load_engine("triton", path, 256, device="cpu", n_batch=48)
    try:
        for got, want in zip(engine.score(jobs), reference.score(jobs), strict=True):
            assert max_diff(got, want) < 1e-3
    finally:
        engine.close()
        reference.close()
