"""Tiny random Gemma 4 text models for the tests, each switching on some of the ways
Gemma 4 differs from Gemma 3, as GGUF files (decider/bench/random_gemma4.py) and as
compressed-tensors W4A16 checkpoints in Google's QAT layout (written by transformers and
compressed-tensors themselves). Every layout follows llama.cpp's KV donors (the last two
non-shared layers sliding, then full), so llama.cpp loads the same files."""

from __future__ import annotations

import numpy as np

from decider.bench.random_gemma4 import QAT_Q4_0, layer_kinds

VOCAB, WINDOW = 384, 16
CONFIGS = {
    # E2B's layout: full every 5th layer, KV shared by the last half, per-layer inputs,
    # the shared layers' MLP twice as wide, one KV head
    "e2b-like": dict(layers=10, pattern=5, kv_heads=1, shared_kv=5, ple=32, double_wide=True),
    # 31B's: full every 6th layer, K = V there with fewer KV heads, an untied head
    "31b-like": dict(layers=12, pattern=6, kv_heads=2, kv_heads_full=1, k_eq_v=True,
                     untied_head=True),
    # E4B's: every 6th, sharing and PLE, Google's QAT Q4_0 tensors; the shared layers keep
    # K/V tensors they must not use
    "e4b-like": dict(layers=12, pattern=6, kv_heads=2, shared_kv=6, ple=32,
                     shared_kv_tensors=True, types=QAT_Q4_0),
}


def kv_bytes(spec: dict, n_ctx: int, itemsize: int = 4) -> int:
    """The KV cache the engine must allocate for a spec, computed from the spec alone:
    keys and values of every non-shared layer, a window of slots if it slides, and one
    spare slot (where a CUDA graph's padding tokens write)."""
    kinds = layer_kinds(spec["layers"], spec["pattern"])
    first_shared = spec["layers"] - spec.get("shared_kv", 0)
    total = 0
    for sliding in kinds[:first_shared]:
        slots = (min(WINDOW, n_ctx) if sliding else n_ctx) + 1
        heads = spec["kv_heads"] if sliding else spec.get("kv_heads_full") or spec["kv_heads"]
        total += 2 * slots * heads * (64 if sliding else 128) * itemsize
    return total


def hf_config(spec: dict):
    """transformers' Gemma4TextConfig of a spec (write_gemma4's defaults otherwise)."""
    from transformers import Gemma4TextConfig

    kinds = layer_kinds(spec["layers"], spec["pattern"])
    return Gemma4TextConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512,
        num_hidden_layers=spec["layers"], num_attention_heads=4,
        num_key_value_heads=spec["kv_heads"], head_dim=64, global_head_dim=128,
        num_global_key_value_heads=spec.get("kv_heads_full"),
        attention_k_eq_v=spec.get("k_eq_v", False), sliding_window=WINDOW,
        layer_types=["sliding_attention" if s else "full_attention" for s in kinds],
        num_kv_shared_layers=spec.get("shared_kv", 0),
        hidden_size_per_layer_input=spec.get("ple", 0), vocab_size_per_layer_input=VOCAB,
        use_double_wide_mlp=spec.get("double_wide", False), final_logit_softcapping=30.0,
        max_position_embeddings=4096, tie_word_embeddings=not spec.get("untied_head"))


def write_checkpoint(path, spec: dict, rng: np.random.Generator, *, ple_4bit: bool = False,
                     embeddings_4bit: bool = False):
    """A random tiny Gemma 4 in Google's QAT layout: bf16, every Linear (the untied
    lm_head too) symmetric int4 in groups of 32, packed and configured by compressed-
    tensors; the per-layer table bf16, or 4-bit as well (ple_4bit: the "emb4" repacks);
    embeddings_4bit: the token embedding too, so that a head equal to it shares its codes."""
    import torch
    from compressed_tensors.quantization import QuantizationArgs
    from transformers import Gemma4ForCausalLM

    from .checkpoints import quantize_and_save

    torch.manual_seed(int(rng.integers(2**31)))
    model = Gemma4ForCausalLM(hf_config(spec))
    with torch.no_grad():
        for name, p in model.named_parameters():
            d = p.shape[0]
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                p.normal_(1, 0.3).mul_(d ** -0.25)  # as decider/bench/random_gemma4.py draws them
            elif "norm" in name:
                p.normal_(1, 0.3)
            else:
                p.normal_(0, 0.5 if "per_layer" in name and "embed" in name
                          else 0.1 if "embed" in name or "lm_head" in name else 0.05)
        for layer in model.model.layers:
            layer.layer_scalar.uniform_(0.3, 1.5)
    if embeddings_4bit:  # the head stored equal to the embedding, as a tied model's
        model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.clone())
    model = model.to(torch.bfloat16)
    args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group",
                            group_size=32)
    targets = ["Linear"] + (["re:.*embed_tokens_per_layer$"] if ple_4bit else []) \
        + (["re:.*embed_tokens$"] if embeddings_4bit else [])
    quantize_and_save(model, path, args, targets, [])
    return path
