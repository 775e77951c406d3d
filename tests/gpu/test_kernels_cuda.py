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

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("TRITON_INTERPRET=1 in this process: the kernels would not compile",
                allow_module_level=True)

from decider.kernels import qmatmul as qm  # noqa: E402
from decider.kernels.attention import attention, position_mask, tree_visible  # noqa: E402
from decider.kernels.attention_triton import attention_triton  # noqa: E402
from decider.kernels.qmatmul_triton import qmatmul_triton  # noqa: E402

DEV = "cuda"


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.isfinite().all()
    torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2 * float(want.abs().max()))


def random_qweight(n: int, k: int, bits: int, group: int) -> qm.QWeight:
    scale = torch.rand(n, k // group, device=DEV) * 0.02 + 0.002
    if bits == 4:
        codes = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=DEV)
        return qm.QWeight(codes, scale, -8 * scale, group, 4)
    codes = torch.randint(-128, 128, (n, k), dtype=torch.int8, device=DEV)
    return qm.QWeight(codes, scale, None, group, 8)


QUANTS = {"q4-g32": (4, 32), "q8-g32": (8, 32), "q6k-g16": (8, 16)}
# (K, N): 270M q/gate-up/down (hidden 640, q 4x256, ffn 2048), 1B q/gate-up/down
# (hidden 1152, ffn 6912).
SHAPES = [(640, 1024), (640, 2048), (2048, 640), (1152, 1024), (1152, 6912), (6912, 1152)]


@pytest.mark.parametrize("m", [1, 4, 100, 4096])
@pytest.mark.parametrize("k,n", SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("quant", QUANTS)
def test_qmatmul_bf16_on_gemma3_shapes(quant, k, n, m):
    w = random_qweight(n, k, *QUANTS[quant])
    x = torch.randn(m, k, device=DEV).bfloat16()
    close(qmatmul_triton(x, w), qm.qmatmul(x.float(), w))


@pytest.mark.parametrize("m", [1, 300])
@pytest.mark.parametrize("quant", QUANTS)
def test_qmatmul_fp16(quant, m):
    w = random_qweight(2048, 640, *QUANTS[quant])
    x = torch.randn(m, 640, device=DEV).half()
    close(qmatmul_triton(x, w), qm.qmatmul(x.float(), w))


@pytest.mark.parametrize("m", [1, 16])
def test_qmatmul_full_vocabulary_head_and_label_rows(m):
    w = random_qweight(262144, 640, 8, 32)
    x = torch.randn(m, 640, device=DEV).bfloat16()
    close(qmatmul_triton(x, w), qm.qmatmul(x.float(), w))
    rows = w.rows(torch.randint(0, 262144, (37,), device=DEV))
    close(qmatmul_triton(x, rows), qm.qmatmul(x.float(), rows))


def batch(q_lens, cached, hq, hkv, d, dtype):
    """As in tests/test_kernels_triton.py: each sequence's keys are its cached prefix (ring
    order) then its new tokens."""
    q_pos, k_pos, seq_q, seq_k = [], [], [], []
    for b, (n, c) in enumerate(zip(q_lens, cached)):
        q_pos.append(torch.arange(c, c + n))
        k_pos.append(torch.cat([torch.arange(c).roll(c // 3), torch.arange(c, c + n)]))
        seq_q.append(torch.full((n,), b))
        seq_k.append(torch.full((c + n,), b))
    q_pos, k_pos, seq_q, seq_k = (torch.cat(x).to(DEV) for x in (q_pos, k_pos, seq_q, seq_k))
    cu = [torch.tensor([0, *torch.tensor(x).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
          for x in (q_lens, [n + c for n, c in zip(q_lens, cached)])]
    t, s = len(q_pos), len(k_pos)
    q = torch.randn(t, hq, d, device=DEV).to(dtype)
    k, v = (torch.randn(s, hkv, d, device=DEV).to(dtype) for _ in "kv")
    return q, k, v, cu, q_pos, k_pos, seq_q[:, None] == seq_k[None, :]


ATTENTION = {  # Gemma 3 270M/1B: 4 query heads, 1 KV head, head dim 256, window 512
    "one-2048": ([2048], [0], None),
    "one-2048-window512": ([2048], [0], 512),
    "varlen-window512": ([1, 100, 700, 1500, 256], [0] * 5, 512),
    "varlen-causal": ([1, 100, 700, 1500, 256], [0] * 5, None),
    "cached-prefix": ([7, 40], [1000, 300], None),
    "cached-ring-window512": ([7, 40], [512, 512], 512),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", ATTENTION)
def test_attention_on_gemma3_shapes(case, dtype):
    q_lens, cached, window = ATTENTION[case]
    q, k, v, (cu_q, cu_k), q_pos, k_pos, same = batch(q_lens, cached, 4, 1, 256, dtype)
    got = attention_triton(q, k, v, cu_q, cu_k, q_pos, k_pos, 256 ** -0.5, window)
    mask = position_mask(q_pos, k_pos, same, window)
    close(got, attention(q.float(), k.float(), v.float(), mask, 256 ** -0.5))


@pytest.mark.parametrize("window", [None, 512])
def test_attention_branch_trees_after_a_cached_prefix(window):
    """The engine's branch pass: per sequence, a question suffix chain then label paths
    branching from it, behind a cached prefix."""
    q_lens, cached = [12, 30], [700, 200]
    q, k, v, (cu_q, cu_k), q_pos, k_pos, same = batch(q_lens, cached, 4, 1, 256,
                                                      torch.bfloat16)
    t = len(q_pos)
    tree, vis = torch.zeros(t, t, dtype=torch.bool, device=DEV), same.clone()
    for b, (n, c) in enumerate(zip(q_lens, cached)):
        parents = [i - 1 for i in range(n // 2)] + [n // 2 - 1 - i % 2 for i in range(n - n // 2)]
        depth = [0] * n
        for i, p in enumerate(parents):
            depth[i] = depth[p] + 1 if p >= 0 else 0
        qs, ks = int(cu_q[b]), int(cu_k[b]) + c
        q_pos[qs:qs + n] = k_pos[ks:ks + n] = c + torch.tensor(depth, device=DEV)
        tree[qs:qs + n, qs:qs + n] = vis[qs:qs + n, ks:ks + n] = tree_visible(parents).to(DEV)
    got = attention_triton(q, k, v, cu_q, cu_k, q_pos, k_pos, 256 ** -0.5, window, tree)
    mask = position_mask(q_pos, k_pos, vis, window)
    close(got, attention(q.float(), k.float(), v.float(), mask, 256 ** -0.5))


def test_attention_head_dim_64_gqa_1():
    q, k, v, (cu_q, cu_k), q_pos, k_pos, same = batch([300, 45], [0, 0], 8, 8, 64,
                                                      torch.bfloat16)
    got = attention_triton(q, k, v, cu_q, cu_k, q_pos, k_pos, 0.125, 128)
    close(got, attention(q.float(), k.float(), v.float(),
                         position_mask(q_pos, k_pos, same, 128), 0.125))


def test_fp32_operands_skip_tf32():
    """fp32 activations take IEEE tl.dot: the fp32 CPU tolerance holds on the GPU too."""
    w = random_qweight(2048, 640, 4, 32)
    x = torch.randn(100, 640, device=DEV)
    want = qm.qmatmul(x, w)
    torch.testing.assert_close(qmatmul_triton(x, w), want, rtol=1e-4,
                               atol=1e-4 * float(want.abs().max()))
    q, k, v, (cu_q, cu_k), q_pos, k_pos, same = batch([300, 45], [0, 100], 4, 1, 256,
                                                      torch.float32)
    got = attention_triton(q, k, v, cu_q, cu_k, q_pos, k_pos, 0.0625, 64)
    want = attention(q, k, v, position_mask(q_pos, k_pos, same, 64), 0.0625)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
