"""Packed GGUF tensors dequantize bit for bit as gguf's own dequantize does.

One difference is allowed: the sign of an exact zero. Q4_0 dequantizes as d * (q - 8)
in gguf and as q * d + (-8 d) packed; at q = 8 with d < 0 that is -0.0 against +0.0,
the same number in every sum."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from decider.bench.random_gguf import T, random_blocks, write_tiny_gemma3
from decider.engines.gguf_weights import GGUFModel, pack

TYPES = [T.Q4_0, T.Q4_1, T.Q4_K, T.Q5_0, T.Q6_K, T.Q8_0]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-equal, with +0.0 == -0.0 (see above)."""
    a, b = a + np.float32(0), b + np.float32(0)  # -0.0 + 0.0 = +0.0; exact otherwise
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_random_raw_blocks_dequantize_bit_exactly(qtype, rng):
    rows, cols = 6, 512
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    raw = random_blocks(qtype, rows * cols // block, rng).reshape(rows, -1)
    packed = pack(raw, qtype, rows, "w")
    assert packed.kind == ("q4" if qtype in (T.Q4_0, T.Q4_1, T.Q4_K) else "q8")
    assert same_bits(packed.dequantize(), gguf.quants.dequantize(raw, qtype))


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q8_0], ids=lambda t: t.name)
def test_gguf_quantized_tensors_dequantize_bit_exactly(qtype, rng):
    x = rng.normal(0, 1, (8, 256)).astype(np.float32)
    raw = gguf.quants.quantize(x, qtype)
    assert same_bits(pack(raw, qtype, 8, "w").dequantize(), gguf.quants.dequantize(raw, qtype))


def test_dense_tensors_stay_dense(rng):
    x = rng.normal(0, 1, (4, 64)).astype(np.float32)
    assert pack(x, T.F32, 4, "w") is x or np.array_equal(pack(x, T.F32, 4, "w"), x)
    h = x.astype(np.float16)
    assert pack(h, T.F16, 4, "w").dtype == np.float16
    bf16 = (x.view(np.uint32) >> 16).astype(np.uint16)  # truncated to bf16, stored as bytes
    got = pack(bf16.view(np.uint8), T.BF16, 4, "w").reshape(4, 64)
    assert same_bits(got, gguf.quants.dequantize(bf16.view(np.uint8), T.BF16).reshape(4, 64))


def test_a_type_it_cannot_hold_exactly_is_refused_by_name():
    raw = np.zeros((2, 176), dtype=np.uint8)  # one Q5_K block per row
    with pytest.raises(ValueError, match=r"'blk\.3\.ffn_up\.weight' has GGML type Q5_K"):
        pack(raw, T.Q5_K, 2, "blk.3.ffn_up.weight")


def test_a_written_model_reads_back_bit_exactly(tmp_path, rng):
    path = write_tiny_gemma3(tmp_path / "tiny.gguf", rng, layers=1)
    model = GGUFModel.read(path)
    assert model.arch == "gemma3" and model.meta["gemma3.attention.sliding_window"] == 16
    for t in gguf.GGUFReader(str(path)).tensors:
        w = model.tensors[t.name]
        got = w if isinstance(w, np.ndarray) else w.dequantize()
        assert same_bits(got, gguf.quants.dequantize(t.data, t.tensor_type)), t.name
