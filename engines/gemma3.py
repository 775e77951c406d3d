"""Gemma 3 text model in plain PyTorch, on packed GGUF weights.

The config comes from GGUF metadata plus what GGUF does not carry, as llama.cpp fills it
in: every 6th layer is full attention, the others slide; local RoPE base 10000; queries
scaled by head_dim^-0.5 (27B: (hidden / heads)^-0.5). GGUF norm weights already hold
Gemma's 1 + w (llama.cpp's converter adds the 1; transformers' GGUF loader takes it off
again), so norms here multiply by the stored weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from decider.kernels.attention import attend
from decider.kernels.embed import embed_rms_norm
from decider.kernels.fused import add_rms_norm, qk_norm_rope_, rope_tables
from decider.kernels.pass_layout import END, IDS, LO_FULL, LO_SLIDE, POS

from .dense_weights import DenseWeights
from .gguf_weights import GGUFModel
from .kv_cache import KVCache
from .layers import Linear, TextModel, fp32

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


class Block(nn.Module):
    def __init__(self, cfg: Gemma3Config, i: int, t: dict, dtype: torch.dtype) -> None:
        super().__init__()
        self.cfg, self.index, self.sliding = cfg, i, cfg.sliding(i)
        p = f"blk.{i}."
        self.qkv = Linear([t[p + n + ".weight"] for n in ("attn_q", "attn_k", "attn_v")], dtype)
        self.o = Linear([t[p + "attn_output.weight"]], dtype)
        self.gate_up = Linear([t[p + n + ".weight"] for n in ("ffn_gate", "ffn_up")], dtype,
                              interleave=True)
        self.down = Linear([t[p + "ffn_down.weight"]], dtype)
        for n in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm",
                  "attn_q_norm", "attn_k_norm"):
            self.register_buffer(n, fp32(t[p + n + ".weight"]))

    def forward(self, x, h, norm_next, meta, rope, cache: KVCache | None, write: bool,
                dense: dict[str, torch.Tensor]):
        """x: the residual stream [T, hidden], h: its attn_norm; returns the stream after
        this layer and its norm by norm_next (the next layer's attn_norm, or the final
        norm). meta [5, T]: kernels/columns.py's rows; rope: (cos, sin) tables of this
        layer's kind. cache: the prefix before these tokens, which write=True extends with
        them. dense: the linears' weights already dequantized, by name (dense_weights.py)."""
        cfg = self.cfg
        t, hq, hkv, d = len(x), cfg.heads, cfg.kv_heads, cfg.head_dim
        pos = meta[POS]
        heads = self.qkv(h, dense.get("qkv")).view(t, hq + 2 * hkv, d)
        qk_norm_rope_(heads[:, :hq + hkv], hq, self.attn_q_norm, self.attn_k_norm, pos, *rope,
                      cfg.eps)
        q, k, v = heads[:, :hq], heads[:, hq:hq + hkv], heads[:, hq + hkv:]
        cached = cache.read(self.index) if cache is not None else None
        a = attend(q, k, v, meta[LO_SLIDE if self.sliding else LO_FULL], meta[END],
                   cfg.query_pre_attn_scalar ** -0.5, cache=cached, q_pos=pos,
                   window=cfg.window if self.sliding else None)
        if write:
            cache.write(self.index, k, v, pos)
        x, h = add_rms_norm(x, self.o(a.view(t, hq * d), dense.get("o")),
                            self.post_attention_norm, self.ffn_norm, cfg.eps)
        y = self.down(self.gate_up.gelu(h, dense.get("gate_up")), dense.get("down"))
        return add_rms_norm(x, y, self.post_ffw_norm, norm_next, cfg.eps)


class Gemma3(TextModel):
    config_class = Gemma3Config

    def __init__(self, model: GGUFModel, dtype: torch.dtype = torch.float32,
                 n_ctx: int | None = None) -> None:
        self.cfg = cfg = Gemma3Config.from_gguf(model)
        super().__init__(dtype, cfg.hidden)
        t = model.tensors
        self._set_head(t["token_embd.weight"], None, None)  # the head is tied
        self.blocks = nn.ModuleList(Block(cfg, i, t, dtype) for i in range(cfg.layers))
        self.dense = DenseWeights(self.blocks, dtype)  # made again by to(), on the device
        self.register_buffer("norm", fp32(t["output_norm.weight"]))
        n = n_ctx or cfg.n_ctx_train
        for name, tables in (("local", rope_tables(n, cfg.head_dim, cfg.rope_local)),
                             ("global", rope_tables(n, cfg.head_dim, cfg.rope_global,
                                                    cfg.rope_global_scale))):
            self.register_buffer(f"cos_{name}", tables[0])
            self.register_buffer(f"sin_{name}", tables[1])

    def _moved(self, device) -> None:
        self.dense = DenseWeights(self.blocks, self.dtype)

    def kv_layout(self) -> list[tuple[bool, int, int] | None]:
        """Per layer its cache: (sliding, kv heads, head dim)."""
        c = self.cfg
        return [(c.sliding(i), c.kv_heads, c.head_dim) for i in range(c.layers)]

    def forward(self, meta: torch.Tensor, cache: KVCache | None = None,
                write: bool = False, rows: torch.Tensor | None = None) -> torch.Tensor:
        """meta int32 [5, T] (kernels/columns.py: ids, pos, lo_full, lo_slide, end) ->
        final-normed hidden states [T, hidden], or of the tokens `rows` (int32) alone.
        No host sync: a CUDA graph can hold it (cache None)."""
        ids = meta[IDS]
        x, h = embed_rms_norm(self.embedding, ids, self.embed_scale, self.blocks[0].attn_norm,
                              self.cfg.eps)
        rope = {True: (self.cos_local, self.sin_local), False: (self.cos_global, self.sin_global)}
        dense = self.dense.layers([len(ids)] * len(self.blocks), ids.device)
        for i, (block, weights) in enumerate(zip(self.blocks, dense)):
            norm_next = self.blocks[i + 1].attn_norm if i + 1 < len(self.blocks) else self.norm
            x, h = block(x, h, norm_next, meta, rope[block.sliding], cache, write, weights)
        return h if rows is None else h.index_select(0, rows)
