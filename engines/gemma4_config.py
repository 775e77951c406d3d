"""Gemma 4's text-model configuration, read from GGUF metadata as llama.cpp's converter
writes it (a checkpoint directory is mapped to the same keys, engines/hf_config.py), never
assumed: the layer pattern (`attention.sliding_window_pattern`), head dims and KV heads
per layer kind, the MLP width per layer, KV sharing, per-layer inputs, the final softcap."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .gemma3 import LOCAL_ROPE_BASE  # llama.cpp's default for rope.freq_base_swa
from .gguf_weights import GGUFModel

NO_TURN = 1e20  # rope_freqs factors from here on keep a frequency pair still (1e30 written)


@dataclass(frozen=True, slots=True)
class Gemma4Config:
    vocab: int
    hidden: int
    heads: int
    kinds: tuple[bool, ...]  # per layer: sliding window (True) or full attention
    kv_heads: tuple[int, ...]  # per layer
    head_dims: tuple[int, int]  # (sliding, full)
    ffn: tuple[int, ...]  # per layer (twice as wide on shared layers with double-wide MLP)
    eps: float
    window: int
    rope_local: float
    rope_global: float
    rotated: int  # frequency pairs full layers rotate (the rest stay at angle 0)
    shared_kv: int  # the last this many layers read their K/V from earlier layers
    ple: int  # per-layer input width (0: none)
    k_eq_v: tuple[bool, ...]  # per layer: V is the raw K (no V projection)
    softcap: float | None
    n_ctx_train: int
    bos_id: int = 2

    @property
    def layers(self) -> int:
        return len(self.kinds)

    def sliding(self, layer: int) -> bool:
        return self.kinds[layer]

    def head_dim(self, layer: int) -> int:
        return self.head_dims[0 if self.kinds[layer] else 1]

    def has_kv(self, layer: int) -> bool:
        return layer < self.layers - self.shared_kv

    def donor(self, layer: int) -> int:
        """The layer whose keys and values `layer` attends to: itself, or for a shared
        layer the last non-shared layer of its kind."""
        if self.has_kv(layer):
            return layer
        first = self.layers - self.shared_kv
        return max(i for i in range(first) if self.kinds[i] == self.kinds[layer])

    def donors(self) -> set[int]:
        """The layers whose keys and values shared layers read (E2B: its last two
        non-shared layers; none without shared layers)."""
        return {self.donor(i) for i in range(self.layers - self.shared_kv, self.layers)}

    def __post_init__(self) -> None:
        n = self.layers
        if min(self.vocab, self.hidden, self.heads, n, self.window, *self.head_dims) < 1 \
                or not (len(self.kv_heads) == len(self.ffn) == len(self.k_eq_v) == n) \
                or any(self.heads % k for k in self.kv_heads) or not 0 <= self.shared_kv < n:
            raise ValueError(f"inconsistent Gemma 4 config: {self}")
        first = n - self.shared_kv
        for i in range(first, n):
            if not any(self.kinds[j] == self.kinds[i] for j in range(first)):
                raise ValueError(f"shared layer {i} has no earlier layer of its kind to "
                                 "read K/V from")

    @classmethod
    def from_gguf(cls, model: GGUFModel) -> Gemma4Config:
        if model.arch != "gemma4":
            raise ValueError(f"{model.path} is a {model.arch!r} model, not gemma4")
        m = {k.removeprefix("gemma4."): v for k, v in model.meta.items()}
        t = model.tensors
        if int(m.get("expert_count", 0) or 0) or any(".ffn_gate_inp." in n for n in t):
            raise ValueError(
                "this is a mixture-of-experts Gemma 4 (26B-A4B): the triton engine has no "
                "expert router and no grouped expert matmuls yet; serve it with engine "
                "'llama'")
        layers = int(m["block_count"])
        kinds = m.get("attention.sliding_window_pattern")
        if kinds is None or len(kinds) != layers:
            raise ValueError(f"{model.path}: gemma4.attention.sliding_window_pattern must give "
                             f"the kind of each of the {layers} layers, got {kinds!r}")
        kinds = tuple(bool(k) for k in kinds)
        head_dims = (int(m["attention.key_length_swa"]), int(m["attention.key_length"]))
        for key, want in (("attention.value_length_swa", head_dims[0]),
                          ("attention.value_length", head_dims[1]),
                          ("rope.dimension_count_swa", head_dims[0]),
                          ("rope.dimension_count", head_dims[1])):
            if int(m.get(key, want)) != want:
                raise ValueError(f"{model.path}: gemma4.{key} is {m[key]}, but this engine's "
                                 f"Gemma 4 needs {want} (the head dim)")
        shared = int(m.get("attention.shared_kv_layers", 0))
        k_eq_v = tuple(i < layers - shared and f"blk.{i}.attn_v.weight" not in t
                       for i in range(layers))
        softcap = m.get("final_logit_softcapping")
        return cls(
            vocab=t["token_embd.weight"].shape[0], hidden=int(m["embedding_length"]),
            heads=int(m["attention.head_count"]), kinds=kinds,
            kv_heads=_per_layer(m["attention.head_count_kv"], layers, "head_count_kv"),
            head_dims=head_dims,
            ffn=_per_layer(m["feed_forward_length"], layers, "feed_forward_length"),
            eps=float(m["attention.layer_norm_rms_epsilon"]),
            window=int(m["attention.sliding_window"]),
            rope_local=float(m.get("rope.freq_base_swa", LOCAL_ROPE_BASE)),
            rope_global=float(m["rope.freq_base"]),
            rotated=_rotated(t.get("rope_freqs.weight"), head_dims[1], model.path),
            shared_kv=shared, ple=int(m.get("embedding_length_per_layer_input", 0)),
            k_eq_v=k_eq_v, softcap=float(softcap) if softcap else None,
            n_ctx_train=int(m["context_length"]),
            bos_id=int(model.meta.get("tokenizer.ggml.bos_token_id", 2)),
        )


def _per_layer(value, layers: int, key: str) -> tuple[int, ...]:
    """A GGUF key that is one value for all layers or an array of one per layer."""
    if isinstance(value, (list, tuple)):
        if len(value) != layers:
            raise ValueError(f"gemma4.{key} has {len(value)} values for {layers} layers")
        return tuple(int(v) for v in value)
    return (int(value),) * layers


def _rotated(freqs, head_dim: int, path) -> int:
    """The frequency pairs full layers rotate, from the rope_freqs factors: 1 for each
    that turns, then 1e30 for each that does not (the converter's proportional RoPE)."""
    if freqs is None:
        return head_dim // 2
    f = np.asarray(freqs, np.float64)
    turns = int(np.sum(f < NO_TURN))
    if f.shape != (head_dim // 2,) or not np.all(f[:turns] == 1.0) or np.any(f[turns:] < NO_TURN):
        raise ValueError(f"{path}: rope_freqs.weight must be {head_dim // 2} factors, 1.0 for "
                         "the pairs that turn then 1e30 (proportional RoPE)")
    return turns
