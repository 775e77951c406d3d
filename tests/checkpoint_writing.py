"""What the compressed-tensors tests of Gemma 3 and Gemma 4 share: quantizing a random
transformers model and saving it the way compressed-tensors does, and reading a
checkpoint again in the multimodal layout."""

from __future__ import annotations

import json

import numpy as np


def quantize_and_save(model, path, args, targets: list[str], ignore: list[str]) -> None:
    """compressed-tensors' own steps: the scheme applied to `targets`, min/max scales and
    zero points from its calculate_qparams, packed by its ModelCompressor, the
    quantization_config written by its update_config."""
    import torch
    from compressed_tensors import ModelCompressor, QuantizationConfig
    from compressed_tensors.quantization import QuantizationScheme, apply_quantization_config
    from compressed_tensors.quantization.utils import calculate_qparams

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


def assert_the_multimodal_layout_reads_the_same(path, dest, model_type: str,
                                                towers: list[str], ignore=None) -> None:
    """The checkpoint at `path` copied to `dest` as its multimodal model saves it (a
    text_config, tensors under model.language_model., the other towers' tensors beside
    them): read as the same GGUF-named tensors and metadata."""
    import torch
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
