"""Tiny random Gemma 3 checkpoints in compressed-tensors W4A16 form, written by the
compressed-tensors library itself (the CPU and the GPU tests read them)."""

from __future__ import annotations

import torch
from compressed_tensors import ModelCompressor, QuantizationConfig
from compressed_tensors.quantization import (
    QuantizationArgs,
    QuantizationScheme,
    apply_quantization_config,
)
from compressed_tensors.quantization.utils import calculate_qparams
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from .tiny import VOCAB, WINDOW


def write_checkpoint(path, rng, strategy="group", group=32, symmetric=True, layers=6):
    """A random tiny Gemma 3 (bf16, random norms), quantized and saved by compressed-
    tensors: min/max scales and zero points from its own calculate_qparams, packed by
    its own ModelCompressor, the quantization_config written by its update_config."""
    torch.manual_seed(int(rng.integers(2**31)))
    cfg = Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, sliding_window=WINDOW,
        max_position_embeddings=4096, query_pre_attn_scalar=64, tie_word_embeddings=True)
    model = Gemma3ForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0, 0.3 if "norm" in name else 0.1 if "embed" in name else 0.05)
    model = model.to(torch.bfloat16)
    args = QuantizationArgs(num_bits=4, type="int", symmetric=symmetric, strategy=strategy,
                            group_size=group)
    apply_quantization_config(model, QuantizationConfig(
        config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=args)},
        ignore=["lm_head"]), show_progress=False)
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "weight_scale"):
                w = module.weight.float()
                w = w.unflatten(-1, (-1, group)) if strategy == "group" else w[:, None]
                scale, zero = calculate_qparams(w.amin(-1), w.amax(-1), args)
                module.weight_scale.copy_(scale.reshape(module.weight_scale.shape))
                if hasattr(module, "weight_zero_point"):
                    module.weight_zero_point.copy_(zero.reshape(module.weight_zero_point.shape))
    compressor = ModelCompressor.from_pretrained_model(model, "pack-quantized")
    compressor.compress_model(model)
    model.save_pretrained(path)
    compressor.update_config(path)
    return path
