"""A Hugging Face text model's config.json and tensor names in GGUF's terms, so that a
checkpoint directory becomes what GGUFModel.read gives for the same model in a .gguf
file (the model code reads only the latter).

One mapping per architecture, picked by model_type: the text config with transformers'
defaults filled in (as the reference engine fills them), the GGUF metadata keys
llama.cpp's converter writes, the tensor names, the norm shift (Gemma 3's GGUF norms
hold 1 + w, Gemma 4's w), the tensor shapes the config gives, and the facts the model
code derives rather than reads, checked against the checkpoint (a disagreement is
refused, naming the key and both values). Gemma 4 is in hf_gemma4.py.
"""

from __future__ import annotations

from pathlib import Path

# the text model's prefixes in the causal-LM and multimodal layouts
TEXT_PREFIXES = ("model.language_model.", "language_model.model.", "model.")
# the other towers of multimodal checkpoints, left out
OTHER_TOWERS = tuple(p + t for p in ("", "model.") for t in (
    "vision_tower.", "multi_modal_projector.", "audio_tower.", "embed_vision.", "embed_audio."))
# the last part of a module name that is an nn.Linear
LINEARS = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
           "per_layer_input_gate", "per_layer_projection", "per_layer_model_projection",
           "lm_head"}
# transformers parameter (after "layers.N.") -> GGUF tensor (after "blk.N."), Gemma 3's
HF_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
GLOBAL_NAMES = {"embed_tokens": "token_embd", "norm": "output_norm"}


def refuse(key: str, got, want, arch: str = "Gemma 3") -> None:
    raise ValueError(f"config.json {key} is {got!r}, but this engine's {arch} uses {want!r}")


def text_section(raw: dict, path: Path, kinds: tuple[str, str]) -> dict:
    """The text config of a causal-LM (kinds[1]) or multimodal (kinds[0] with a
    text_config) config.json, without its model_type and quantization_config."""
    kind = raw.get("model_type")
    if kind == kinds[0] and isinstance(raw.get("text_config"), dict):
        text = dict(raw["text_config"])
    elif kind == kinds[1]:
        text = {k: v for k, v in raw.items() if k != "quantization_config"}
    else:
        raise ValueError(f"{path / 'config.json'}: model_type is {kind!r}; supported: "
                         f"{kinds[1]!r}, or {kinds[0]!r} with a text_config")
    text.pop("model_type", None)
    return text


class HFText:
    """One architecture's mapping (the base: Gemma 3's names and classes)."""

    arch = ""
    family = ""  # transformers' class name prefix
    norm_shift = 0.0  # added to HF's norm weights to give GGUF's
    tied = True  # a stored lm_head must equal the embedding

    def __init__(self, raw: dict, path: Path) -> None:
        self.path = path

    def meta(self) -> dict[str, object]:
        raise NotImplementedError

    def layer_name(self, layer: int, rest: str) -> str | None:
        """GGUF name of a layer tensor (after "layers.N."); None: not one this engine reads."""
        return f"blk.{layer}.{HF_NAMES[rest]}" if rest in HF_NAMES else None

    def global_name(self, rest: str) -> str | None:
        return GLOBAL_NAMES.get(rest)

    def unused(self, layer: int, rest: str) -> bool:
        """Whether a layer tensor the checkpoint holds goes unread (left out)."""
        return False

    def classes(self, module: str) -> tuple[str, ...]:
        """The module's class names as compressed-tensors matches targets against them."""
        last = module.rsplit(".", 1)[-1]
        if last in ("embed_tokens", "embed_tokens_per_layer"):
            return (f"{self.family}TextScaledWordEmbedding", "Embedding", "Module")
        if last in LINEARS:
            return ("Linear", "Module")
        return (f"{self.family}RMSNorm", "Module")

    def extra_tensors(self) -> dict:
        """Tensors GGUF holds that a checkpoint does not (Gemma 4's rope_freqs)."""
        return {}

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        raise NotImplementedError

    def check(self, model) -> None:
        """The read model against what the checkpoint's config says."""


class Gemma3HF(HFText):
    arch = "gemma3"
    family = "Gemma3"
    norm_shift = 1.0  # fp32, as transformers' Gemma 3 RMSNorm computes 1 + w

    def __init__(self, raw: dict, path: Path) -> None:
        super().__init__(raw, path)
        from transformers import Gemma3TextConfig

        text = text_section(raw, path, ("gemma3", "gemma3_text"))
        try:
            self.tc = Gemma3TextConfig(**text)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path / 'config.json'}: transformers refuses the config: {e}") \
                from e

    def meta(self) -> dict[str, object]:
        """GGUF metadata keys (as llama.cpp's converter writes them) from the HF config."""
        tc = self.tc
        full = tc.rope_parameters["full_attention"]
        for key in ("sliding_window", "head_dim", "max_position_embeddings"):
            if getattr(tc, key) is None:
                raise ValueError(f"config.json {key} is null; this engine's Gemma 3 needs a value")
        meta: dict[str, object] = {
            "general.architecture": "gemma3",
            "gemma3.context_length": tc.max_position_embeddings,
            "gemma3.embedding_length": tc.hidden_size,
            "gemma3.block_count": tc.num_hidden_layers,
            "gemma3.feed_forward_length": tc.intermediate_size,
            "gemma3.attention.head_count": tc.num_attention_heads,
            "gemma3.attention.head_count_kv": tc.num_key_value_heads,
            "gemma3.attention.key_length": tc.head_dim,
            "gemma3.attention.value_length": tc.head_dim,
            "gemma3.attention.layer_norm_rms_epsilon": tc.rms_norm_eps,
            "gemma3.attention.sliding_window": tc.sliding_window,
            "gemma3.rope.freq_base": full["rope_theta"],
        }
        if full.get("rope_type", "default") == "linear":
            meta["gemma3.rope.scaling.type"] = "linear"
            meta["gemma3.rope.scaling.factor"] = full["factor"]
        if tc.bos_token_id is not None:
            meta["tokenizer.ggml.bos_token_id"] = tc.bos_token_id
        return meta

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        tc = self.tc
        h, q, kv, f = (tc.hidden_size, tc.num_attention_heads * tc.head_dim,
                       tc.num_key_value_heads * tc.head_dim, tc.intermediate_size)
        shapes: dict = {"token_embd": (tc.vocab_size, h), "output_norm": (h,)}
        for i in range(tc.num_hidden_layers):
            p = f"blk.{i}."
            shapes |= {p + "attn_q": (q, h), p + "attn_k": (kv, h), p + "attn_v": (kv, h),
                       p + "attn_output": (h, q), p + "ffn_gate": (f, h),
                       p + "ffn_up": (f, h), p + "ffn_down": (h, f)}
            for n in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
                shapes[p + n] = (h,)
            shapes[p + "attn_q_norm"] = shapes[p + "attn_k_norm"] = (tc.head_dim,)
        return shapes

    def check(self, model) -> None:
        """What Gemma3Config.from_gguf derives (or the model code assumes) against what
        the checkpoint says."""
        from .gemma3 import LOCAL_ROPE_BASE, SLIDING_PATTERN, Gemma3Config

        tc, cfg = self.tc, Gemma3Config.from_gguf(model)
        for i, kind in enumerate(tc.layer_types):
            want = "sliding_attention" if cfg.sliding(i) else "full_attention"
            if kind != want:
                refuse(f"layer_types[{i}]", kind,
                       f"{want} (every {SLIDING_PATTERN}th layer full attention)")
        if len(tc.layer_types) != cfg.layers:
            refuse("layer_types (length)", len(tc.layer_types), cfg.layers)
        local = tc.rope_parameters["sliding_attention"]
        if local.get("rope_type", "default") != "default":
            refuse("rope_parameters.sliding_attention.rope_type", local["rope_type"], "default")
        if float(local["rope_theta"]) != cfg.rope_local:
            refuse("rope_parameters.sliding_attention.rope_theta (rope_local_base_freq)",
                   local["rope_theta"], LOCAL_ROPE_BASE)
        full = tc.rope_parameters["full_attention"]
        if full.get("rope_type", "default") not in ("default", "linear"):
            refuse("rope_parameters.full_attention.rope_type (rope_scaling)", full["rope_type"],
                   "default or linear")
        if float(tc.query_pre_attn_scalar) != cfg.query_pre_attn_scalar:
            refuse("query_pre_attn_scalar", tc.query_pre_attn_scalar, cfg.query_pre_attn_scalar)
        if tc.vocab_size != cfg.vocab:
            refuse("vocab_size", tc.vocab_size, f"{cfg.vocab} (the embedding's rows)")
        for key, want in (("attn_logit_softcapping", None), ("final_logit_softcapping", None),
                          ("hidden_activation", "gelu_pytorch_tanh"), ("attention_bias", False),
                          ("use_bidirectional_attention", False), ("tie_word_embeddings", True)):
            got = getattr(tc, key, want)
            if got != want and not (want is False and got is None):
                refuse(key, got, want)
