"""Gemma 3 text model in plain PyTorch, on packed GGUF weights.

The config comes from GGUF metadata plus what GGUF does not carry, as llama.cpp fills it
in: every 6th layer is full attention, the others slide; local RoPE base 10000; queries
scaled by head_dim^-0.5 (27B: (hidden / heads)^-0.5). GGUF norm weights already hold
Gemma's 1 + w (llama.cpp's converter adds the 1; transformers' GGUF loader takes it off
again), so norms here multiply by the stored weight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from decider.kernels.attention import attention, position_mask
from decider.kernels.qmatmul import QWeight, embed, qmatmul

from .gguf_weights import GGUFModel, Packed
from .kv_cache import KVCache

SLIDING_PATTERN = 6  # layer i is full attention when (i + 1) % 6 == 0
LOCAL_ROPE_BASE = 10_000.0


@dataclass(frozen=True, slots=True)
class Gemma3Config:
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    eps: float
    window: int
    query_pre_attn_scalar: float
    rope_global: float
    rope_local: float = LOCAL_ROPE_BASE
    rope_global_scale: float = 1.0  # linear RoPE scaling of full-attention layers (4B and up)
    n_ctx_train: int = 32768
    bos_id: int = 2

    def __post_init__(self) -> None:
        if min(self.vocab, self.hidden, self.layers, self.heads, self.kv_heads, self.head_dim,
               self.ffn, self.window) < 1 or self.heads % self.kv_heads:
            raise ValueError(f"inconsistent Gemma 3 config: {self}")

    def sliding(self, layer: int) -> bool:
        return (layer + 1) % SLIDING_PATTERN != 0

    @classmethod
    def from_gguf(cls, model: GGUFModel) -> Gemma3Config:
        if model.arch != "gemma3":
            raise ValueError(f"{model.path} is a {model.arch!r} model, not gemma3")
        m = {k.removeprefix("gemma3."): v for k, v in model.meta.items()}
        scaling = m.get("rope.scaling.type", "none")
        if scaling not in ("none", "linear"):
            raise ValueError(f"{model.path}: RoPE scaling {scaling!r} is not supported")
        hidden, heads, layers = int(m["embedding_length"]), int(m["attention.head_count"]), \
            int(m["block_count"])
        head_dim = int(m.get("attention.key_length", hidden // heads))
        return cls(
            vocab=model.tensors["token_embd.weight"].shape[0],
            hidden=hidden, layers=layers, heads=heads,
            kv_heads=int(m["attention.head_count_kv"]), head_dim=head_dim,
            ffn=int(m["feed_forward_length"]), eps=float(m["attention.layer_norm_rms_epsilon"]),
            window=int(m["attention.sliding_window"]),
            query_pre_attn_scalar=hidden / heads if layers == 62 else head_dim,  # 27B: 62 layers
            rope_global=float(m["rope.freq_base"]),
            rope_global_scale=float(m.get("rope.scaling.factor", 1.0)) if scaling == "linear"
            else 1.0,
            n_ctx_train=int(m["context_length"]),
            bos_id=int(model.meta.get("tokenizer.ggml.bos_token_id", 2)),
        )


class QuantLinear(nn.Module):
    """y = x @ W.T on a packed weight: the module swapped in for a quantized nn.Linear."""

    def __init__(self, weight: QWeight) -> None:
        super().__init__()
        self.weight = weight
        self.out_features, self.in_features = weight.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return qmatmul(x, self.weight)


def linear(w: Packed | np.ndarray, dtype: torch.dtype) -> nn.Module:
    """A packed tensor becomes a QuantLinear; a dense one an nn.Linear in `dtype`."""
    if isinstance(w, Packed):
        return QuantLinear(qweight(w))
    lin = nn.Linear(w.shape[1], w.shape[0], bias=False)
    lin.weight = nn.Parameter(torch.from_numpy(np.array(w, dtype=np.float32)).to(dtype),
                              requires_grad=False)
    return lin


def qweight(w: Packed) -> QWeight:
    off = None if w.offset is None else torch.from_numpy(w.offset)
    return QWeight(torch.from_numpy(w.codes), torch.from_numpy(w.scale), off, w.group,
                   4 if w.kind == "q4" else 8)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm in fp32; `weight` already holds 1 + w."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight).to(x.dtype)


def rope(x: torch.Tensor, pos: torch.Tensor, base: float, scale: float) -> torch.Tensor:
    """Rotate-half RoPE: x [T, H, D] at positions pos [T]; angles in fp32."""
    d = x.shape[-1]
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d)) / scale
    freqs = pos.float()[:, None] * inv_freq.to(pos.device)[None]  # [T, D/2]
    emb = torch.cat([freqs, freqs], -1)[:, None]
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Block(nn.Module):
    def __init__(self, cfg: Gemma3Config, i: int, t: dict, dtype: torch.dtype) -> None:
        super().__init__()
        self.cfg, self.index, self.sliding = cfg, i, cfg.sliding(i)
        p = f"blk.{i}."
        self.q, self.k, self.v, self.o = (linear(t[p + n + ".weight"], dtype)
                                          for n in ("attn_q", "attn_k", "attn_v", "attn_output"))
        self.gate, self.up, self.down = (linear(t[p + n + ".weight"], dtype)
                                         for n in ("ffn_gate", "ffn_up", "ffn_down"))
        for n in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm",
                  "attn_q_norm", "attn_k_norm"):
            self.register_buffer(n, torch.from_numpy(np.array(t[p + n + ".weight"], np.float32)))

    def forward(self, x, pos, visible, cache: KVCache, write: bool) -> torch.Tensor:
        """x [T, hidden] at positions pos [T]; visible [T, T] among these tokens; they
        also see the cached tokens before them. write: store their K/V in the cache."""
        cfg = self.cfg
        h = rms_norm(x, self.attn_norm, cfg.eps)
        q = self.q(h).view(-1, cfg.heads, cfg.head_dim)
        k = self.k(h).view(-1, cfg.kv_heads, cfg.head_dim)
        v = self.v(h).view(-1, cfg.kv_heads, cfg.head_dim)
        base, scale = (cfg.rope_local, 1.0) if self.sliding else (cfg.rope_global,
                                                                  cfg.rope_global_scale)
        q = rope(rms_norm(q, self.attn_q_norm, cfg.eps), pos, base, scale)
        k = rope(rms_norm(k, self.attn_k_norm, cfg.eps), pos, base, scale)
        ck, cv, cpos = cache.read(self.index)
        keys, values = torch.cat([ck, k]), torch.cat([cv, v])
        vis = torch.cat([visible.new_ones(len(pos), len(cpos)), visible], 1)
        mask = position_mask(pos, torch.cat([cpos, pos]), vis, cfg.window if self.sliding else None)
        a = attention(q, keys, values, mask, cfg.query_pre_attn_scalar ** -0.5)
        if write:
            cache.write(self.index, pos, k, v)
        x = x + rms_norm(self.o(a.reshape(len(pos), -1)), self.post_attention_norm, cfg.eps)
        h = rms_norm(x, self.ffn_norm, cfg.eps)
        h = self.down(F.gelu(self.gate(h), approximate="tanh") * self.up(h))
        return x + rms_norm(h, self.post_ffw_norm, cfg.eps)


class Gemma3(nn.Module):
    def __init__(self, model: GGUFModel, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.cfg = cfg = Gemma3Config.from_gguf(model)
        self.dtype = dtype
        t = model.tensors
        emb = t["token_embd.weight"]
        # the tied head reads the same packed rows as the embedding
        self.embedding = qweight(emb) if isinstance(emb, Packed) else torch.from_numpy(
            np.array(emb, np.float32)).to(dtype)
        self.blocks = nn.ModuleList(Block(cfg, i, t, dtype) for i in range(cfg.layers))
        self.register_buffer("norm", torch.from_numpy(np.array(t["output_norm.weight"],
                                                                np.float32)))
        self.embed_scale = torch.tensor(math.sqrt(cfg.hidden), dtype=dtype)

    def to(self, device):  # QWeight is not a module: move it by hand
        super().to(device)
        for m in self.modules():
            if isinstance(m, QuantLinear):
                m.weight = m.weight.to(device)
        if isinstance(self.embedding, QWeight):
            self.embedding = self.embedding.to(device)
        self.embed_scale = self.embed_scale.to(device)
        return self

    def weight_bytes(self) -> int:
        tensors = [*self.parameters(), *self.buffers()]
        packed = [m.weight for m in self.modules() if isinstance(m, QuantLinear)]
        if isinstance(self.embedding, QWeight):
            packed.append(self.embedding)
        else:
            tensors.append(self.embedding)
        return sum(w.nbytes() for w in packed) + sum(x.numel() * x.element_size() for x in tensors)

    def forward(self, ids, pos, visible, cache: KVCache, write: bool) -> torch.Tensor:
        """ids, pos [T] -> final-normed hidden states [T, hidden]."""
        if isinstance(self.embedding, QWeight):
            x = embed(self.embedding, ids, self.dtype)
        else:
            x = self.embedding[ids]
        x = x * self.embed_scale
        for block in self.blocks:
            x = block(x, pos, visible, cache, write)
        return rms_norm(x, self.norm, self.cfg.eps)

    def head(self, h: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """h [A, hidden] -> logits [A, len(rows)] of the tied output head (all rows: None)."""
        w = self.embedding
        if isinstance(w, QWeight):
            return qmatmul(h, w if rows is None else w.rows(rows))
        return (h.to(w.dtype) @ (w if rows is None else w[rows]).T).to(h.dtype)
