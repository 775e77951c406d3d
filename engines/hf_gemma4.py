"""Gemma 4 checkpoints (model_type gemma4_text, or gemma4 with a text_config) in GGUF's
terms, as llama.cpp's converter writes them: norms as stored (Gemma 4 multiplies by w),
head dims and KV heads per layer kind, the MLP width per layer, the layer kinds, KV
sharing, per-layer inputs, the proportional RoPE of full layers as rope_freqs factors,
the final softcap. transformers fills in the defaults; from 5.15 its heads are per layer
(`per_layer_config[i]`), before that `global_head_dim` and `num_global_key_value_heads`.
The K/V tensors that shared layers do not use, which checkpoints may hold, are left out;
the audio and vision towers too. A mixture-of-experts checkpoint (26B-A4B) is refused:
this engine has no expert router or expert matmuls."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .hf_config import HF_NAMES, HFText, refuse, text_section

LAYER_NAMES = {**HF_NAMES, "per_layer_input_gate": "inp_gate", "per_layer_projection": "proj",
               "post_per_layer_input_norm": "post_norm", "layer_scalar": "layer_output_scale"}
GLOBAL_NAMES = {"embed_tokens": "token_embd", "norm": "output_norm",
                "embed_tokens_per_layer": "per_layer_token_embd",
                "per_layer_model_projection": "per_layer_model_proj",
                "per_layer_projection_norm": "per_layer_proj_norm"}
_UNUSED_ON_SHARED = ("self_attn.k_proj", "self_attn.v_proj", "self_attn.k_norm")


class Gemma4HF(HFText):
    arch = "gemma4"
    family = "Gemma4"
    norm_shift = 0.0
    tied = False  # QAT checkpoints store their own lm_head; kept where it differs

    def __init__(self, raw: dict, path: Path) -> None:
        super().__init__(raw, path)
        from transformers import Gemma4TextConfig

        text = text_section(raw, path, ("gemma4", "gemma4_text"))
        try:
            self.tc = tc = Gemma4TextConfig(**text)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path / 'config.json'}: transformers refuses the config: {e}") \
                from e
        if tc.enable_moe_block:
            raise ValueError(
                "config.json enable_moe_block is true: a mixture-of-experts Gemma 4 "
                "(26B-A4B); the triton engine has no expert router and no grouped expert "
                "matmuls yet; serve its GGUF with engine 'llama'")
        self.kinds = [k == "sliding_attention" for k in tc.layer_types]
        self.attention = [_layer_attention(tc, i, s) for i, s in enumerate(self.kinds)]
        self.first_shared = tc.num_hidden_layers - tc.num_kv_shared_layers
        self.k_eq_v = bool(tc.attention_k_eq_v)
        self.ple = tc.hidden_size_per_layer_input or 0
        self.check_config()

    def ffn(self, layer: int) -> int:
        wide = self.tc.use_double_wide_mlp and layer >= self.first_shared
        return self.tc.intermediate_size * (2 if wide else 1)

    def dims(self, sliding: bool) -> tuple[int, int]:
        """(head dim, kv heads) of the layers of one kind."""
        return next(a for a, s in zip(self.attention, self.kinds, strict=True) if s == sliding)

    def check_config(self) -> None:
        tc = self.tc
        for sliding in (True, False):
            dims = self.dims(sliding)
            if any(a != dims for a, s in zip(self.attention, self.kinds) if s == sliding):
                refuse("per_layer_config", "head dims differing within a layer kind",
                       "one head dim and KV head count per kind", "Gemma 4")
        local, full = (tc.rope_parameters[k] for k in ("sliding_attention", "full_attention"))
        if local.get("rope_type", "default") != "default" or \
                local.get("partial_rotary_factor", 1.0) != 1.0:
            refuse("rope_parameters.sliding_attention", local, "default RoPE on the whole head",
                   "Gemma 4")
        if full.get("rope_type", "default") not in ("default", "proportional") or \
                full.get("factor", 1.0) != 1.0:
            refuse("rope_parameters.full_attention", full, "proportional (or default) RoPE, "
                   "factor 1", "Gemma 4")
        for key, want in (("hidden_activation", "gelu_pytorch_tanh"), ("attention_bias", False),
                          ("vocab_size_per_layer_input", tc.vocab_size)):
            if getattr(tc, key) != want:
                refuse(key, getattr(tc, key), want, "Gemma 4")
        if tc.use_bidirectional_attention == "all":
            refuse("use_bidirectional_attention", "all", "causal text attention", "Gemma 4")

    def rotated(self) -> int:
        full = self.tc.rope_parameters["full_attention"]
        half = self.dims(False)[0] // 2
        if full.get("rope_type", "default") != "proportional":
            return half
        return int(full.get("partial_rotary_factor", 1.0) * half)

    def meta(self) -> dict[str, object]:
        tc, g = self.tc, "gemma4."
        (d_swa, _), (d_full, _) = self.dims(True), self.dims(False)
        meta: dict[str, object] = {
            "general.architecture": "gemma4",
            g + "context_length": tc.max_position_embeddings,
            g + "embedding_length": tc.hidden_size,
            g + "block_count": tc.num_hidden_layers,
            g + "feed_forward_length": [self.ffn(i) for i in range(tc.num_hidden_layers)],
            g + "attention.head_count": tc.num_attention_heads,
            g + "attention.head_count_kv": [kv for _, kv in self.attention],
            g + "attention.key_length": d_full, g + "attention.value_length": d_full,
            g + "attention.key_length_swa": d_swa, g + "attention.value_length_swa": d_swa,
            g + "rope.dimension_count": d_full, g + "rope.dimension_count_swa": d_swa,
            g + "attention.layer_norm_rms_epsilon": tc.rms_norm_eps,
            g + "attention.sliding_window": tc.sliding_window,
            g + "attention.sliding_window_pattern": self.kinds,
            g + "attention.shared_kv_layers": tc.num_kv_shared_layers,
            g + "embedding_length_per_layer_input": self.ple,
            g + "rope.freq_base": tc.rope_parameters["full_attention"]["rope_theta"],
            g + "rope.freq_base_swa": tc.rope_parameters["sliding_attention"]["rope_theta"],
        }
        if tc.final_logit_softcapping:
            meta[g + "final_logit_softcapping"] = tc.final_logit_softcapping
        if tc.bos_token_id is not None:
            meta["tokenizer.ggml.bos_token_id"] = tc.bos_token_id
        return meta

    def extra_tensors(self) -> dict:
        half, turns = self.dims(False)[0] // 2, self.rotated()
        return {"rope_freqs.weight": np.array([1.0] * turns + [1e30] * (half - turns),
                                              np.float32)}

    def layer_name(self, layer: int, rest: str) -> str | None:
        return f"blk.{layer}.{LAYER_NAMES[rest]}" if rest in LAYER_NAMES else None

    def unused(self, layer: int, rest: str) -> bool:
        """The K/V tensors of a shared layer, which reads an earlier layer's."""
        return layer >= self.first_shared and rest in _UNUSED_ON_SHARED

    def global_name(self, rest: str) -> str | None:
        return GLOBAL_NAMES.get(rest)

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        tc, h = self.tc, self.tc.hidden_size
        n, p = tc.num_hidden_layers, self.ple
        shapes: dict = {"token_embd": (tc.vocab_size, h), "output_norm": (h,)}
        if p:
            shapes |= {"per_layer_token_embd": (tc.vocab_size, n * p),
                       "per_layer_model_proj": (n * p, h), "per_layer_proj_norm": (p,)}
        for i, ((d, kv), sliding) in enumerate(zip(self.attention, self.kinds, strict=True)):
            b, q, f = f"blk.{i}.", tc.num_attention_heads * d, self.ffn(i)
            shapes |= {b + "attn_q": (q, h), b + "attn_output": (h, q), b + "attn_q_norm": (d,),
                       b + "ffn_gate": (f, h), b + "ffn_up": (f, h), b + "ffn_down": (h, f),
                       b + "layer_output_scale": (1,)}
            if i < self.first_shared:
                shapes |= {b + "attn_k": (kv * d, h), b + "attn_k_norm": (d,)}
                if sliding or not self.k_eq_v:
                    shapes[b + "attn_v"] = (kv * d, h)
            for norm in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
                shapes[b + norm] = (h,)
            if p:
                shapes |= {b + "inp_gate": (p, h), b + "proj": (h, p), b + "post_norm": (h,)}
        return shapes


def _layer_attention(tc, layer: int, sliding: bool) -> tuple[int, int]:
    """(head dim, KV heads) of one layer as transformers builds it."""
    per_layer = getattr(tc, "per_layer_config", None)
    if per_layer is not None:  # transformers >= 5.15
        c = per_layer[layer]
        return int(c.head_dim), int(c.num_key_value_heads)
    if sliding:
        return int(tc.head_dim), int(tc.num_key_value_heads)
    kv = tc.num_global_key_value_heads if tc.attention_k_eq_v else None
    return int(tc.global_head_dim), int(kv or tc.num_key_value_heads)
