"""Write a tiny random Gemma 3 GGUF that keeps a real model's tokenizer.

The engine's time vanishes next to the service's own (2 layers, hidden 64), so a
benchmark against a daemon serving it measures decider, not the model:

    python -m decider.bench.tiny_model SOURCE.gguf OUT.gguf
"""

from __future__ import annotations

import sys

import numpy as np
from gguf import GGUFReader, GGUFWriter

HIDDEN, FF, HEADS, HEAD_DIM, LAYERS = 64, 128, 2, 32, 2
COPIED = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
          "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.bos_token_id",
          "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
          "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
          "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_space_prefix")


def write_tiny(source: str, out: str) -> None:
    src = GGUFReader(source)
    rng = np.random.default_rng(0)
    w = GGUFWriter(out, "gemma3")
    w.add_context_length(32768)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(1)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    w.add_sliding_window(512)
    for key in COPIED:
        types = src.fields[key].types  # [type] or [ARRAY, item type]
        w.add_key_value(key, src.fields[key].contents(), types[0],
                        sub_type=types[1] if len(types) > 1 else None)
    n_vocab = len(src.fields["tokenizer.ggml.tokens"].data)

    def t(name: str, *shape: int, scale: float = 0.02) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    t("token_embd.weight", n_vocab, HIDDEN)
    t("output_norm.weight", HIDDEN, scale=0.1)
    for i in range(LAYERS):
        b = f"blk.{i}."
        for norm in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            t(b + norm + ".weight", HIDDEN, scale=0.1)
        t(b + "attn_q_norm.weight", HEAD_DIM, scale=0.1)
        t(b + "attn_k_norm.weight", HEAD_DIM, scale=0.1)
        t(b + "attn_q.weight", HEADS * HEAD_DIM, HIDDEN)
        t(b + "attn_k.weight", HEAD_DIM, HIDDEN)
        t(b + "attn_v.weight", HEAD_DIM, HIDDEN)
        t(b + "attn_output.weight", HIDDEN, HEADS * HEAD_DIM)
        t(b + "ffn_gate.weight", FF, HIDDEN)
        t(b + "ffn_up.weight", FF, HIDDEN)
        t(b + "ffn_down.weight", HIDDEN, FF)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    write_tiny(*sys.argv[1:3])
