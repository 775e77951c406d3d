"""Triton kernels on CUDA with bf16/fp16 activations, on Gemma 3 270M/1B shapes, against
the torch references run in fp32 on the same (rounded) inputs.

Tolerance: the kernels round the dequantized weight (qmatmul) or the softmax weights
(attention) to the activation dtype before tl.dot, and round the output (2^-9 relative
in bf16). That arithmetic emulated in torch on these shapes errs by up to 4e-3 of the
largest output (qmatmul) and 3.3e-3 (attention, mostly the output rounding): the
tolerance is 1e-2 of the largest output plus 1e-2 relative.
"""

from __future__ import annotations

import os

import pytest
import torch

# every test draws from torch's global generator: seeded by the rng fixture
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("rng")]
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("TRITON_INTERPRET=1 in this process: the kernels would not compile",
                allow_module_level=True)

from decider.kernels import (  # noqa: E402
    arrivals,
    embed,
    fused,
)
from decider.kernels import qmatmul as qm  # noqa: E402
from decider.kernels.attention import attend  # noqa: E402
from decider.kernels.attention_triton import attention_triton  # noqa: E402
from decider.kernels.columns import columns  # noqa: E402
from decider.kernels.qmatmul_triton import qmatmul_triton  # noqa: E402
from helpers.trees import forest_inputs, random_job  # noqa: E402

DEV = "cuda"


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.isfinite().all()
    want = want.to(got.device)
    torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2 * float(want.abs().max()))


def random_qweight(n: int, k: int, bits: int | str, group: int) -> qm.QWeight:
    """bits 4: codes with offsets and fp32 scales (Q4_K), "4s": symmetric codes and fp16
    scales (Q4_0, Gemma 4's QAT weights as the engine holds them), 8: int8 codes."""
    scale = torch.rand(n, k // group, device=DEV) * 0.02 + 0.002
    if bits in (4, "4s"):
        codes = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=DEV)
        if bits == "4s":
            return qm.QWeight(codes, scale.half(), None, group, 4)
        return qm.QWeight(codes, scale, -8 * scale, group, 4)
    codes = torch.randint(-128, 128, (n, k), dtype=torch.int8, device=DEV)
    return qm.QWeight(codes, scale, None, group, 8)


QUANTS = {"q4-g32": (4, 32), "q4_0-g32": ("4s", 32), "q8-g32": (8, 32), "q6k-g16": (8, 16)}
# (K, N): 270M q/gate-up/down (hidden 640, q 4x256, ffn 2048), 1B q/gate-up/down
# (hidden 1152, ffn 6912), Gemma 4 E2B's KV-shared layers' o/gate-up/down (q 8x256,
# the double-wide MLP of 2 x 12288: the tiles of weights of 2^24 elements or more) and
# per-layer input gate and projection (K slices of a narrow weight)
SHAPES = [(640, 1024), (640, 2048), (2048, 640), (1152, 1024), (1152, 6912), (6912, 1152),
          (2048, 1536), (1536, 24576), (12288, 1536), (1536, 256), (256, 1536)]


DTYPES = [torch.float16, torch.bfloat16]  # the engine's default on CUDA, and the option


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", [1, 4, 64, 100, 4096])
@pytest.mark.parametrize("k,n", SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("quant", QUANTS)
def test_qmatmul_on_gemma_shapes(quant, k, n, m, dtype):
    w = random_qweight(n, k, *QUANTS[quant])
    x = torch.randn(m, k, device=DEV).to(dtype)
    close(qmatmul_triton(x, w), qm.qmatmul(x.float(), w))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", [1, 100, 500, 2048, 8200])
@pytest.mark.parametrize("k,n", [(640, 4096), (1152, 13824), (1536, 24576), (2560, 20480)],
                         ids=str)
def test_qmatmul_gelu_on_gate_up_shapes(k, n, m, dtype):
    """gelu(gate) * up in the epilogue (fp32, before any rounding) of the packed matmul,
    from LARGE_M of the matmul on the dequantized weight in DENSE_GELU_ROWS, outside them
    cuBLAS then gelu_mul: against the reference on the same interleaved weight (the 270M's,
    the 1B's, E2B's double-wide one and E4B's)."""
    from decider.kernels.qmatmul_triton import qmatmul_gelu_triton

    w = random_qweight(n, k, 8, 32)
    x = torch.randn(m, k, device=DEV).to(dtype)
    close(qmatmul_gelu_triton(x, w), qm.qmatmul_gelu(x.float().cpu(), w.to("cpu")))


@pytest.mark.parametrize("tiles", [(32, 32, 64, 4, 3, 2), (64, 16, 128, 4, 3, 5),
                                   (128, 64, 64, 8, 3, 10)], ids=str)
def test_qmatmul_split_k_is_deterministic_and_leaves_the_counts_zero(tiles):
    """Many programs of one tile race to be last: the sum must not depend on which."""
    w = random_qweight(1536, 640, 8, 32)
    x = torch.randn(120, 640, device=DEV).bfloat16()
    got = qmatmul_triton(x, w, blocks=tiles)
    close(got, qm.qmatmul(x.float(), w))
    for _ in range(20):
        assert torch.equal(qmatmul_triton(x, w, blocks=tiles), got)
    assert not arrivals.counts(x.device).any()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tokens", [1, 120, 2000])
@pytest.mark.parametrize("quant", ["q4-g32", "q8-g32"])
def test_embed_rms_norm_on_gemma3_shapes(quant, tokens, dtype):
    w = random_qweight(8192, 640, *QUANTS[quant])
    ids = torch.randint(0, 8192, (tokens,), device=DEV, dtype=torch.int32)
    scale, norm = torch.tensor(640 ** 0.5, dtype=dtype, device=DEV), torch.rand(640, device=DEV)
    x, h = embed.embed_rms_norm(w, ids, scale, norm, 1e-6)
    want_x, want_h = embed.embed_rms_norm(w.to("cpu"), ids.cpu(), scale.cpu(), norm.cpu(), 1e-6)
    # the same roundings to the activation dtype; 4-bit codes' code * scale + offset is
    # one fused multiply-add on the GPU, two roundings in torch: a step apart in the
    # rounded weight, two at most once scaled and rounded again
    step = 0 if quant == "q8-g32" else 2 * torch.finfo(dtype).eps
    torch.testing.assert_close(x.cpu(), want_x, rtol=step, atol=0)
    close(h, want_h.float())


@pytest.mark.parametrize("m", [1, 16])
def test_qmatmul_full_vocabulary_head_and_label_rows(m):
    w = random_qweight(262144, 640, 8, 32)
    x = torch.randn(m, 640, device=DEV).bfloat16()
    close(qmatmul_triton(x, w), qm.qmatmul(x.float(), w))
    index = torch.randint(0, 262144, (37,), device=DEV, dtype=torch.int32)
    close(qmatmul_triton(x, w.rows(index)), qm.qmatmul(x.float(), w.rows(index)))
    close(qmatmul_triton(x, w, rows=index), qm.qmatmul(x.float(), w.rows(index)))
    few = index[:10]  # one N tile of 16, its K in slices
    close(qmatmul_triton(x, w, rows=few), qm.qmatmul(x.float(), w.rows(few)))
    want = torch.logsumexp(qm.qmatmul(x.float(), w), -1)
    # bf16 weight tiles in the dot: 7e-4 relative measured on logsumexps of about 120
    torch.testing.assert_close(qm.qmatmul_logsumexp(x, w), want, rtol=2e-3, atol=0.01)


@pytest.mark.parametrize("m", [300, 640])
def test_the_e2b_heads_softcapped_logsumexp_of_many_rows(m):
    """From LARGE_M rows the head's weight (E2B's, Q4_0) is dequantized in chunks (six
    here) and multiplied dense; 640 rows: the 128 requests of 5 questions."""
    w = random_qweight(262144, 1536, "4s", 32)
    x = torch.randn(m, 1536, device=DEV).half()
    logits = qm.qmatmul(x.float(), w)
    want = torch.logsumexp(30.0 * torch.tanh(logits / 30.0), -1)
    del logits
    # fp16-rounded weights (2^-11) against fp32: inside the bf16 head's bound above
    torch.testing.assert_close(qm.qmatmul_logsumexp(x, w, softcap=30.0), want, rtol=2e-3,
                               atol=0.01)


ATTENTION = {  # Gemma 3 270M/1B: 4 query heads, 1 KV head, head dim 256, window 512
    # (tree sizes, branchy, window, cached positions)
    "one-2048": ([2048], False, None, 0),  # full layers split long blocks' keys from 2048 rows
    "one-1000": ([1000], False, None, 0),
    "one-4000": ([4000], False, None, 0),
    "one-2048-window512": ([2048], False, 512, 0),
    "packed-window512": ([1, 100, 700, 1500, 256], False, 512, 0),
    "packed-causal": ([1, 100, 700, 1500, 256], False, None, 0),
    "trees-window512": ([300, 40, 700], True, 512, 0),
    "cached-prefix-trees": ([7, 40], True, None, 1000),
    "cached-ring-window512": ([7, 40], True, 512, 512),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ATTENTION)
def test_attention_on_gemma3_shapes(case, dtype):
    sizes, branchy, window, cached = ATTENTION[case]
    args, kwargs = forest_inputs(sizes, branchy, 4, 1, 256, window, cached, DEV, dtype)
    got = attention_triton(*args, 256 ** -0.5, **kwargs)
    close(got, attend(*fp32_cpu(args), 256 ** -0.5, **fp32_cpu(kwargs)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tokens", [256, 2048])
def test_attention_as_the_scores_grow_in_half_precision(tokens, dtype):
    """Keys growing along a chain: each row's max rises by a lot at some key blocks and by
    a little at others (the online softmax's rescaling), the scores reach far past fp16's
    range in exp, and most key blocks skip the mask."""
    args, kwargs = forest_inputs([tokens], False, 4, 1, 256, None, 0, DEV, dtype)
    q, k, v, lo, end = args
    k *= torch.linspace(0.1, 8.0, tokens, device=DEV, dtype=dtype)[:, None, None] ** 2
    got = attention_triton(*args, 256 ** -0.5, **kwargs)
    close(got, attend(*fp32_cpu(args), 256 ** -0.5, **fp32_cpu(kwargs)))


def fp32_cpu(x):
    """The same inputs as fp32 on the CPU: the torch reference's arithmetic."""
    if isinstance(x, dict):
        return {k: fp32_cpu(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(fp32_cpu(v) for v in x)
    if isinstance(x, torch.Tensor):
        return x.cpu().float() if x.is_floating_point() else x.cpu()
    return x


GEMMA4_FULL = {  # E2B's full layers: 8 query heads, 1 KV head, head dim 512
    "one-200": ([200], False, 0),  # up to 2048 rows: 16-row blocks
    "packed-causal": ([1, 100, 700, 256], False, 0),  # past them: 64-row blocks
    "cached-prefix-trees": ([7, 300], True, 1000),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", GEMMA4_FULL)
def test_attention_on_gemma4_full_layers(case, dtype):
    sizes, branchy, cached = GEMMA4_FULL[case]
    args, kwargs = forest_inputs(sizes, branchy, 8, 1, 512, None, cached, DEV, dtype)
    got = attention_triton(*args, 512 ** -0.5, **kwargs)
    close(got, attend(*fp32_cpu(args), 512 ** -0.5, **fp32_cpu(kwargs)))


@pytest.mark.parametrize("window", [None, 512])
def test_attention_of_a_shared_layers_few_queries(window):
    """A KV-shared layer of E2B in one request's graph: 16 query tokens of a 230-token pass
    (full layers split their keys 8 ways)."""
    d = 512 if window is None else 256
    args, kwargs = forest_inputs([230], False, 8, 1, d, window, 0, DEV, torch.float16)
    q, k, v, lo, end = args
    rows = torch.arange(214, 230, device=DEV, dtype=torch.int32)
    got = attention_triton(q[rows.long()], k, v, lo, end, 1.0, rows=rows, **kwargs)
    want = attend(*fp32_cpu(args), 1.0, **fp32_cpu(kwargs))[rows.long().cpu()]
    close(got, want)


def test_attention_head_dim_64_gqa_1():
    args, kwargs = forest_inputs([300, 45], True, 8, 8, 64, 128, 0, DEV, torch.bfloat16)
    close(attention_triton(*args, 0.125, **kwargs), attend(*fp32_cpu(args), 0.125,
                                                             **fp32_cpu(kwargs)))


def test_fp32_operands_skip_tf32():
    """fp32 activations take IEEE tl.dot: the fp32 CPU tolerance holds on the GPU too."""
    w = random_qweight(2048, 640, 4, 32)
    x = torch.randn(100, 640, device=DEV)
    want = qm.qmatmul(x.cpu(), w.to("cpu")).to(DEV)
    torch.testing.assert_close(qmatmul_triton(x, w), want, rtol=1e-4,
                               atol=1e-4 * float(want.abs().max()))
    args, kwargs = forest_inputs([300, 45], True, 4, 1, 256, 64, 100, DEV)
    got = attention_triton(*args, 0.0625, **kwargs)
    want = attend(*fp32_cpu(args), 0.0625, **fp32_cpu(kwargs)).to(DEV)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def norms_match(tokens: int, hidden: int, dtype: torch.dtype) -> None:
    """rms_norm and add_rms_norm on random rows against the fp32 torch reference."""
    x, y = (torch.randn(tokens, hidden, device=DEV).to(dtype) for _ in "xy")
    w1, w2 = torch.rand(hidden, device=DEV) + 0.5, torch.rand(hidden, device=DEV) + 0.5
    close(fused.rms_norm(x, w1, 1e-6), fused.rms_norm(x.cpu().float(), w1.cpu(), 1e-6).to(DEV))
    got = fused.add_rms_norm(x, y, w1, w2, 1e-6)
    want = fused.add_rms_norm(x.cpu().float(), y.cpu().float(), w1.cpu(), w2.cpu(), 1e-6)
    for g, w in zip(got, want, strict=True):
        close(g, w.to(DEV))


@pytest.mark.parametrize("tokens", [3, 300, 1100])
@pytest.mark.parametrize("hidden", [2560, 5376])
def test_the_norms_on_gemma4_e4b_and_31b_rows(hidden, tokens):
    """Rows wider than the swept ones take their own tiles (more warps, fewer rows)."""
    norms_match(tokens, hidden, torch.float16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_fused_kernels_on_gemma3_shapes(dtype):
    norms_match(700, 640, dtype)
    gu = torch.randn(700, 2 * 2048, device=DEV).to(dtype)
    close(fused.gelu_mul(gu), fused.gelu_mul(gu.cpu().float()).to(DEV))
    heads = torch.randn(700, 6, 256, device=DEV).to(dtype)
    want = heads.cpu().float()
    wq, wk = torch.rand(256, device=DEV) + 0.5, torch.rand(256, device=DEV) + 0.5
    pos = torch.randint(0, 32768, (700,), device=DEV)
    cos, sin = fused.rope_tables(32768, 256, 1e6)
    fused.qk_norm_rope_(want[:, :5], 4, wq.cpu(), wk.cpu(), pos.cpu(), cos, sin, 1e-6)
    fused.qk_norm_rope_(heads[:, :5], 4, wq, wk, pos, cos.to(DEV), sin.to(DEV), 1e-6)
    close(heads, want.to(DEV))


@pytest.mark.parametrize("budget", [32768, 2048, 100])
def test_columns_of_packed_passes_on_the_device(budget, rng):
    """Each pass of a plan of 300 random jobs, expanded on the GPU to a graph-like padded
    size, equals the CPU reference."""

    from decider.engines.passes import lay_out

    window = int(rng.integers(1, 600))
    for p in lay_out([random_job(rng) for _ in range(300)], budget, window).passes:
        packed = torch.from_numpy(p.pack())
        size = 1 << max(p.tokens - 1, 1).bit_length()
        assert torch.equal(columns(packed.to(DEV), size, window).cpu(),
                           columns(packed, size, window))

