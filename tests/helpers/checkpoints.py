"""Tiny random Gemma 3 checkpoints in compressed-tensors W4A16 form, written by the
compressed-tensors library itself (the CPU and the GPU tests read them), and the check
that a checkpoint reads the same in its multimodal model's layout."""

from __future__ import annotations

import json

import numpy as np
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


def quantize_and_save(model, path, args: QuantizationArgs, targets: list[str],
                      ignore: list[str]) -> None:
    """compressed-tensors' own steps: the scheme applied to `targets`, min/max scales and
    zero points from its calculate_qparams, packed by its ModelCompressor, the
    quantization_config written by its update_config."""
    apply_quantization_config(model, QuantizationConfig(
        config_groups={"group_0": QuantizationScheme(targets=targets, weights=args)},
        ignore=ignore), show_progress=False)
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "weight_scale"):
                w = module.weight.float()
                w = w.unflatten(-1, (-1, args.group_size)) if args.strategy == "group" \
                    else w[:, None]
                scale, zero = calculate_qparams(w.amin(-1), w.amax(-1), args)
                module.weight_scale.copy_(scale.reshape(module.weight_scale.shape))
                if hasattr(module, "weight_zero_point"):
                    module.weight_zero_point.copy_(zero.reshape(module.weight_zero_point.shape))
    compressor = ModelCompressor.from_pretrained_model(model, "pack-quantized")
    compressor.compress_model(model)
    model.save_pretrained(path)
    compressor.update_config(path)


def write_checkpoint(path, rng, strategy="group", group=32, symmetric=True, layers=6):
    """A random tiny Gemma 3 (bf16, random norms), quantized and saved by compressed-
    tensors (quantize_and_save)."""
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
    quantize_and_save(model, path, args, ["Linear"], ["lm_head"])
    return path


def assert_the_multimodal_layout_reads_the_same(path, dest, model_type: str,
                                                towers: list[str], ignore=None) -> None:
    """The checkpoint at `path` copied to `dest` as its multimodal model saves it (a
    text_config, tensors under model.language_model., the other towers' tensors beside
    them): read as the same GGUF-named tensors and metadata."""
    from safetensors.torch import load_file, save_file

    from decider.engines.checkpoints import read_model
    from decider.engines.gguf_weights import Packed

    stored = load_file(path / "model.safetensors")
    renamed = {k.replace("model.", "model.language_model.", 1): v for k, v in stored.items()}
    for tower in towers:
        renamed[tower] = torch.zeros(4, 4)
    save_file(renamed, dest / "model.safetensors")
    text = json.loads((path / "config.json").read_text())
    quant = text.pop("quantization_config")
    if ignore is not None:
        quant["ignore"] = ignore
    (dest / "config.json").write_text(json.dumps(
        {"model_type": model_type, "text_config": text, "quantization_config": quant}))
    a, b = read_model(path), read_model(dest)
    assert a.meta == b.meta and a.tensors.keys() == b.tensors.keys()
    for name, w in a.tensors.items():
        v = b.tensors[name]
        assert np.array_equal(w.dequantize() if isinstance(w, Packed) else w,
                              v.dequantize() if isinstance(v, Packed) else v)
