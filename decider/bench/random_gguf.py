"""Random Gemma 3 models written as GGUF files: tiny ones for exact-math tests, real shapes
(SHAPES) for speed, which does not depend on weight values. gguf 0.19 quantizes
Q4_0/Q4_1/Q5_0/Q8_0 but not the K types: those are written as
random raw blocks, every byte random except the fp16 scales (kept finite and small).
Q5_K is here only to test its refusal."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

T = gguf.GGMLQuantizationType
# byte offsets of each block's fp16 scale fields
FP16_FIELDS = {T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q8_0: (0,), T.Q4_K: (0, 2),
               T.Q6_K: (208,), T.Q5_K: (0, 2)}


def random_blocks(qtype: T, n: int, rng: np.random.Generator, scale: float = 0.05) -> np.ndarray:
    """n random raw blocks [n, block bytes] of a quantized type."""
    _, size = gguf.GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, (n, size), dtype=np.uint8)
    for at in FP16_FIELDS[qtype]:
        b[:, at:at + 2] = rng.uniform(-scale, scale, (n, 1)).astype(np.float16).view(np.uint8)
    return b


def random_tensor(qtype: T, rows: int, cols: int, rng: np.random.Generator,
                  std: float = 0.05) -> np.ndarray:
    """A [rows, cols] tensor in qtype's storage form: dense floats, gguf-quantized random
    normals, or random raw K-type blocks (scales sized so weights are about `std`)."""
    x = rng.normal(0, std, (rows, cols)).astype(np.float32)
    if qtype == T.F32:
        return x
    if qtype in (T.Q4_K, T.Q5_K, T.Q6_K):
        block, _ = gguf.GGML_QUANT_SIZES[qtype]
        # typical |weight| = |d * scale * code|: Q4_K ~ d * 32 * 8, Q5_K ~ d * 32 * 16,
        # Q6_K ~ d * 64 * 16
        step = {T.Q4_K: std / 250, T.Q5_K: std / 500, T.Q6_K: std / 1000}[qtype]
        return random_blocks(qtype, rows * cols // block, rng, step).reshape(rows, -1)
    return gguf.quants.quantize(x, qtype)


# Real Gemma 3 text shapes (layers, hidden, heads, kv_heads, head_dim, ffn, vocab, window)
SHAPES = {
    "gemma-3-270m": dict(layers=18, hidden=640, heads=4, kv_heads=1, head_dim=256, ffn=2048,
                         vocab=262144, window=512, n_ctx_train=32768),
    "gemma-3-1b": dict(layers=26, hidden=1152, heads=4, kv_heads=1, head_dim=256, ffn=6912,
                       vocab=262144, window=512, n_ctx_train=32768),
}
# The tensor types of the Q4_K_M file gemma-3-270m ships as
Q4_K_M = {"token_embd": T.Q8_0, "attn_q": T.Q5_0, "attn_k": T.Q5_0, "attn_v": T.Q8_0,
          "attn_output": T.Q4_K, "ffn_gate": T.Q5_0, "ffn_up": T.Q5_0, "ffn_down": T.Q6_K}


def write_tiny_gemma3(path: Path, rng: np.random.Generator, *, layers: int = 6,
                      hidden: int = 256, heads: int = 4, kv_heads: int = 2, head_dim: int = 64,
                      ffn: int = 512, vocab: int = 384, window: int = 16,
                      n_ctx_train: int = 4096, types: dict[str, T] | None = None,
                      tokenizer_from: Path | None = None, synthetic_vocab: bool = False
                      ) -> Path:
    """A random Gemma 3 text model in GGUF. Every 6th layer is full attention (as in
    llama.cpp); norm weights are stored with the +1 folded in, as llama.cpp's converter
    writes Gemma norms. `types` maps a tensor suffix (attn_q, ffn_down, token_embd, ...)
    to its GGML type; the defaults mix Q4_0, Q4_K, Q5_0, Q6_K, Q8_0 and F32.
    tokenizer_from: a GGUF whose tokenizer (of `vocab` tokens) to copy, or synthetic_vocab:
    a made-up one, so that llama.cpp loads the model too (it refuses a GGUF without a
    tokenizer). Neither: no tokenizer (the torch engines score token ids without one)."""
    types = {"token_embd": T.Q8_0, "attn_q": T.Q5_0, "attn_k": T.Q4_0, "attn_v": T.Q8_0,
             "attn_output": T.Q4_K, "ffn_gate": T.Q4_1, "ffn_up": T.Q5_0, "ffn_down": T.Q6_K,
             **(types or {})}
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    w.add_sliding_window(window)
    if tokenizer_from is not None:
        _copy_tokenizer(w, Path(tokenizer_from), vocab)
    elif synthetic_vocab:
        synthetic_tokenizer(w, vocab)
    else:
        w.add_bos_token_id(2)

    def add(name: str, kind: str, rows: int, cols: int) -> None:
        qtype = types.get(kind, T.F32)
        data = random_tensor(qtype, rows, cols, rng, std=0.1 if kind == "token_embd" else 0.05)
        w.add_tensor(name, data, raw_dtype=None if qtype == T.F32 else qtype)

    def norm(name: str, n: int) -> None:  # 1 + w, w ~ N(0, 0.3)
        w.add_tensor(name, (1 + rng.normal(0, 0.3, n)).astype(np.float32))

    add("token_embd.weight", "token_embd", vocab, hidden)
    norm("output_norm.weight", hidden)
    for i in range(layers):
        p = f"blk.{i}."
        add(p + "attn_q.weight", "attn_q", heads * head_dim, hidden)
        add(p + "attn_k.weight", "attn_k", kv_heads * head_dim, hidden)
        add(p + "attn_v.weight", "attn_v", kv_heads * head_dim, hidden)
        add(p + "attn_output.weight", "attn_output", hidden, heads * head_dim)
        add(p + "ffn_gate.weight", "ffn_gate", ffn, hidden)
        add(p + "ffn_up.weight", "ffn_up", ffn, hidden)
        add(p + "ffn_down.weight", "ffn_down", hidden, ffn)
        for n, size in (("attn_norm", hidden), ("post_attention_norm", hidden),
                        ("ffn_norm", hidden), ("post_ffw_norm", hidden),
                        ("attn_q_norm", head_dim), ("attn_k_norm", head_dim)):
            norm(f"{p}{n}.weight", size)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def synthetic_tokenizer(w: gguf.GGUFWriter, vocab: int) -> None:
    """A SentencePiece-style vocabulary laid out as Gemma's: <pad> <eos> <bos> <unk>, the
    256 byte tokens, then the word boundary and made-up words. Enough for llama.cpp to
    load the model; text tokenizes into word boundaries and bytes."""
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    if vocab < len(specials) + len(bytes_):
        raise ValueError(f"a synthetic vocabulary needs at least 260 tokens, got {vocab}")
    # a space is the word boundary itself; every other character goes by its bytes
    n_words = vocab - len(specials) - len(bytes_) - 1
    words = ["\u2581"] + [f"\u2581w{i}" for i in range(n_words)]
    T_ = gguf.TokenType
    w.add_tokenizer_model("llama")
    w.add_token_list(specials + bytes_ + words)
    w.add_token_scores([0.0] * vocab)
    w.add_token_types([T_.CONTROL] * 3 + [T_.UNKNOWN] + [T_.BYTE] * 256
                      + [T_.NORMAL] * len(words))
    w.add_pad_token_id(0)
    w.add_eos_token_id(1)
    w.add_bos_token_id(2)
    w.add_unk_token_id(3)


def _copy_tokenizer(w: gguf.GGUFWriter, source: Path, vocab: int) -> None:
    fields = {k: f for k, f in gguf.GGUFReader(str(source)).fields.items()
              if k.startswith("tokenizer.")}
    n = len(fields["tokenizer.ggml.tokens"].data)
    if n != vocab:
        raise ValueError(f"{source}'s tokenizer has {n} tokens, the model {vocab}")
    for key, field in fields.items():
        sub = field.types[1] if len(field.types) > 1 else None
        w.add_key_value(key, field.contents(), field.types[0], sub)
