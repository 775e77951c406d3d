"""transformers models from GGUF terms, for the reference engine: the config built from
the model config this project reads (transformers' GGUF loader reads neither Gemma 3's
layer types, query_pre_attn_scalar and local RoPE base nor Gemma 4 at all) and the
state dict from dense GGUF tensors, named back (the inverse of hf_config's maps)."""

from __future__ import annotations

import numpy as np
import torch

from .gemma3 import SLIDING_PATTERN, Gemma3Config
from .gemma4_config import Gemma4Config
from .gguf_weights import GGUFModel
from .hf_config import GLOBAL_NAMES, HF_NAMES
from .hf_gemma4 import GLOBAL_NAMES as GEMMA4_GLOBALS
from .hf_gemma4 import LAYER_NAMES as GEMMA4_LAYERS


def gemma3(cfg: Gemma3Config, gg: GGUFModel):
    """(the causal LM class, its config, its state dict): Gemma 3's norms lose the + 1
    llama.cpp's converter folded in (transformers' Gemma 3 RMSNorm adds it back)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    full_rope = {"rope_type": "default", "rope_theta": cfg.rope_global}
    if cfg.rope_global_scale != 1.0:
        full_rope = {**full_rope, "rope_type": "linear", "factor": cfg.rope_global_scale}
    config = Gemma3TextConfig(
        vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=cfg.ffn,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads, head_dim=cfg.head_dim, rms_norm_eps=cfg.eps,
        sliding_window=cfg.window, query_pre_attn_scalar=cfg.query_pre_attn_scalar,
        max_position_embeddings=cfg.n_ctx_train, sliding_window_pattern=SLIDING_PATTERN,
        rope_parameters={"full_attention": full_rope, "sliding_attention": {
            "rope_type": "default", "rope_theta": cfg.rope_local}},
        bos_token_id=cfg.bos_id, tie_word_embeddings=True, attn_implementation="eager",
    )
    return Gemma3ForCausalLM, config, _state_dict(gg, GLOBAL_NAMES, HF_NAMES, shift=1.0)


def gemma4(cfg: Gemma4Config, gg: GGUFModel):
    """(the causal LM class, its config, its state dict) of a Gemma 4: norms as stored."""
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    first_shared = cfg.layers - cfg.shared_kv
    ffn = cfg.ffn[0]
    double = any(f != ffn for f in cfg.ffn)
    if any(f != (2 * ffn if double and i >= first_shared else ffn) for i, f in enumerate(cfg.ffn)):
        raise ValueError(f"MLP widths {cfg.ffn}: transformers' Gemma 4 holds one width, "
                         "twice it on the shared layers")
    kv = {s: {cfg.kv_heads[i] for i in range(cfg.layers) if cfg.kinds[i] == s}
          for s in (True, False)}
    if len(kv[True]) > 1 or len(kv[False]) > 1 or (kv[True] != kv[False] and not any(cfg.k_eq_v)):
        raise ValueError(f"KV heads {cfg.kv_heads}: transformers' Gemma 4 has one count per "
                         "layer kind, a second only with K = V")
    (kv_local,), (kv_full,) = kv[True] or {cfg.kv_heads[0]}, kv[False] or {cfg.kv_heads[0]}
    config = Gemma4TextConfig(
        vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=ffn,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
        num_key_value_heads=kv_local, head_dim=cfg.head_dims[0],
        global_head_dim=cfg.head_dims[1], num_global_key_value_heads=kv_full,
        attention_k_eq_v=any(cfg.k_eq_v), rms_norm_eps=cfg.eps, sliding_window=cfg.window,
        layer_types=["sliding_attention" if s else "full_attention" for s in cfg.kinds],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": cfg.rope_local},
            "full_attention": {"rope_type": "proportional", "rope_theta": cfg.rope_global,
                               "partial_rotary_factor": cfg.rotated / (cfg.head_dims[1] // 2)}},
        final_logit_softcapping=cfg.softcap, num_kv_shared_layers=cfg.shared_kv,
        use_double_wide_mlp=double, hidden_size_per_layer_input=cfg.ple,
        vocab_size_per_layer_input=cfg.vocab, max_position_embeddings=cfg.n_ctx_train,
        bos_token_id=cfg.bos_id, tie_word_embeddings="output.weight" not in gg.tensors,
        attn_implementation="eager",
    )
    if [t == "sliding_attention" for t in config.layer_types] != list(cfg.kinds):
        raise ValueError("transformers' Gemma 4 makes the last layer full attention; this "
                         "model's is sliding")
    sd = _state_dict(gg, GEMMA4_GLOBALS, GEMMA4_LAYERS, shift=0.0)
    for i in range(first_shared, cfg.layers):  # what a shared layer never reads
        for name in ("k_proj", "v_proj", "k_norm"):
            sd.pop(f"model.layers.{i}.self_attn.{name}.weight", None)
    return Gemma4ForCausalLM, config, sd


def _state_dict(gg: GGUFModel, globals_: dict[str, str], layers: dict[str, str], shift: float
                ) -> dict[str, torch.Tensor]:
    """transformers' parameters from dense GGUF tensors; `shift` taken off the norms."""
    to_hf_global = {g: hf for hf, g in globals_.items()}
    to_hf_layer = {g: hf for hf, g in layers.items()}
    sd = {}
    for name, array in gg.tensors.items():
        w = torch.from_numpy(np.array(array, np.float32))
        base = name.removesuffix(".weight")
        if base.endswith("norm"):
            w = w - shift
        if base == "rope_freqs":
            continue  # the proportional RoPE, in the config
        if base == "output":
            sd["lm_head.weight"] = w
        elif base in to_hf_global:
            sd[f"model.{to_hf_global[base]}.weight"] = w
        else:
            _, i, kind = base.split(".")
            hf = to_hf_layer[kind]
            sd[f"model.layers.{i}.{hf}" + ("" if hf == "layer_scalar" else ".weight")] = w
    return sd
