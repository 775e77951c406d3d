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
from torch import nn

from decider.kernels.attention import attend
from decider.kernels.columns import END, IDS, LO_FULL, LO_SLIDE, POS
from decider.kernels.fused import add_rms_norm, gelu_mul, qk_norm_rope_, rope_tables
from decider.kernels.qmatmul import (QWeight, embed_rms_norm, qmatmul, qmatmul_gelu,
                                     qmatmul_logsumexp)

from . import DTYPES
from .dense_weights import DenseWeights
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


def activation_dtype(name: str) -> torch.dtype:
    """The torch dtype an engine's `dtype` option names."""
    if name not in DTYPES:
        from decider.errors import ConfigError

        raise ConfigError(f"dtype must be {', '.join(DTYPES[:-1])} or {DTYPES[-1]}, "
                          f"got {name!r}")
    return getattr(torch, name)


class Linear(nn.Module):
    """y = x @ [W_1; W_2; ...].T: one projection, or several side by side (q, k, v) in one
    output; interleaved (gate, up), the rows of two alternate instead (output column 2i
    from the first, 2i + 1 from the second: fused.gelu_mul's layout, which a matmul tile
    can finish in its epilogue). Packed parts of one form are joined into one weight at
    load (one matmul); parts that differ each write their own columns."""

    def __init__(self, weights: list[Packed | np.ndarray], dtype: torch.dtype,
                 interleave: bool = False) -> None:
        super().__init__()
        if interleave and len(weights) != 2:
            raise ValueError(f"interleaving takes two projections, got {len(weights)}")
        self.interleave = interleave
        self.parts = [_join(weights, interleave)] if _joinable(weights) else weights
        self.parts = [qweight(w) if isinstance(w, Packed) else
                      torch.from_numpy(np.array(w, np.float32)).to(dtype) for w in self.parts]
        self.out_features = sum(w.shape[0] for w in self.parts)

    def to(self, device):  # QWeight is not a module: move the parts by hand
        self.parts = [w.to(device) for w in self.parts]
        return self

    def nbytes(self) -> int:
        return sum(map(_nbytes, self.parts))

    def forward(self, x: torch.Tensor, dense: torch.Tensor | None = None) -> torch.Tensor:
        """dense: the one packed part already dequantized (engines/dense_weights.py)."""
        if len(self.parts) == 1:
            return _matmul(x, self.parts[0], dense=dense)
        out = torch.empty(len(x), self.out_features, dtype=x.dtype, device=x.device)
        if self.interleave:
            pairs = out.view(len(x), -1, 2)
            for j, w in enumerate(self.parts):
                pairs[:, :, j] = _matmul(x, w)
            return out
        at = 0
        for w in self.parts:
            _matmul(x, w, out[:, at:at + w.shape[0]])
            at += w.shape[0]
        return out

    def gelu(self, x: torch.Tensor, dense: torch.Tensor | None = None) -> torch.Tensor:
        """gelu_tanh(gate) * up [T, F] of an interleaved (gate, up) projection: in the
        packed matmul's epilogue when both are one packed weight."""
        if len(self.parts) == 1 and isinstance(self.parts[0], QWeight):
            return qmatmul_gelu(x, self.parts[0], dense)
        return gelu_mul(self(x))


def _nbytes(w: QWeight | torch.Tensor) -> int:
    return w.nbytes() if isinstance(w, QWeight) else w.numel() * w.element_size()


def _matmul(x: torch.Tensor, w: QWeight | torch.Tensor, out: torch.Tensor | None = None,
            dense: torch.Tensor | None = None):
    if isinstance(w, QWeight):
        return qmatmul(x, w, out, dense)
    return torch.matmul(x, w.T) if out is None else out.copy_(torch.matmul(x, w.T))


def _joinable(ws: list[Packed | np.ndarray]) -> bool:
    if all(not isinstance(w, Packed) for w in ws):
        return True
    return all(isinstance(w, Packed) and (w.kind, w.group) == (ws[0].kind, ws[0].group)
               for w in ws)


def _join(ws: list[Packed | np.ndarray], interleave: bool) -> Packed | np.ndarray:
    """One weight of the parts' rows: one part after another, or alternating."""
    if len(ws) == 1:
        return ws[0]

    def rows(arrays: list[np.ndarray]) -> np.ndarray:
        if interleave:
            return np.stack(arrays, 1).reshape(-1, *arrays[0].shape[1:])
        return np.concatenate(arrays)

    if not isinstance(ws[0], Packed):
        return rows([np.asarray(w, np.float32) for w in ws])
    offset = None if ws[0].offset is None else rows([w.offset for w in ws])
    return Packed(ws[0].kind, rows([w.codes for w in ws]), rows([w.scale for w in ws]), offset,
                  ws[0].group, "+".join(w.source for w in ws))


def qweight(w: Packed) -> QWeight:
    off = None if w.offset is None else torch.from_numpy(w.offset)
    return QWeight(torch.from_numpy(w.codes), torch.from_numpy(w.scale), off, w.group,
                   4 if w.kind == "q4" else 8)


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
            self.register_buffer(n, torch.from_numpy(np.array(t[p + n + ".weight"], np.float32)))

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
            cache.write(self.index, k, v)
        x, h = add_rms_norm(x, self.o(a.view(t, hq * d), dense.get("o")),
                            self.post_attention_norm, self.ffn_norm, cfg.eps)
        y = self.down(self.gate_up.gelu(h, dense.get("gate_up")), dense.get("down"))
        return add_rms_norm(x, y, self.post_ffw_norm, norm_next, cfg.eps)


class Gemma3(nn.Module):
    def __init__(self, model: GGUFModel, dtype: torch.dtype = torch.float32,
                 n_ctx: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg = Gemma3Config.from_gguf(model)
        self.dtype = dtype
        t = model.tensors
        emb = t["token_embd.weight"]
        # the tied head reads the same packed rows as the embedding
        self.embedding = qweight(emb) if isinstance(emb, Packed) else torch.from_numpy(
            np.array(emb, np.float32)).to(dtype)
        self.blocks = nn.ModuleList(Block(cfg, i, t, dtype) for i in range(cfg.layers))
        self.dense = DenseWeights(self.blocks, dtype)  # made again by to(), on the device
        self.register_buffer("norm", torch.from_numpy(np.array(t["output_norm.weight"],
                                                                np.float32)))
        # Gemma scales embeddings by sqrt(hidden), rounded to the activation dtype as in
        # transformers; the residual stream itself is kept in fp32 (the sublayers' inputs
        # and outputs are in `dtype`): bf16 rounding of the stream is the largest error
        # source otherwise, and it costs one [T, hidden] fp32 buffer
        self.embed_scale = torch.tensor(math.sqrt(cfg.hidden), dtype=dtype)
        n = n_ctx or cfg.n_ctx_train
        for name, tables in (("local", rope_tables(n, cfg.head_dim, cfg.rope_local)),
                             ("global", rope_tables(n, cfg.head_dim, cfg.rope_global,
                                                    cfg.rope_global_scale))):
            self.register_buffer(f"cos_{name}", tables[0])
            self.register_buffer(f"sin_{name}", tables[1])

    def to(self, device):  # QWeight is not a module: move it by hand
        super().to(device)
        for m in self.modules():
            if isinstance(m, Linear):
                m.to(device)
        self.embedding = self.embedding.to(device)  # packed or dense: not a module's tensor
        self.embed_scale = self.embed_scale.to(device)
        self.dense = DenseWeights(self.blocks, self.dtype)
        return self

    def weight_bytes(self) -> int:
        return (sum(m.nbytes() for m in self.modules() if isinstance(m, Linear))
                + _nbytes(self.embedding)
                + sum(_nbytes(x) for name, x in self.named_buffers() if "norm" in name))

    def forward(self, meta: torch.Tensor, cache: KVCache | None = None,
                write: bool = False) -> torch.Tensor:
        """meta int32 [5, T] (kernels/columns.py: ids, pos, lo_full, lo_slide, end) ->
        final-normed hidden states [T, hidden]. No host sync: a CUDA graph can hold it
        (cache None)."""
        ids = meta[IDS]
        x, h = embed_rms_norm(self.embedding, ids, self.embed_scale, self.blocks[0].attn_norm,
                              self.cfg.eps)
        rope = {True: (self.cos_local, self.sin_local), False: (self.cos_global, self.sin_global)}
        dense = self.dense.layers(len(ids), ids.device)
        for i, (block, weights) in enumerate(zip(self.blocks, dense)):
            norm_next = self.blocks[i + 1].attn_norm if i + 1 < len(self.blocks) else self.norm
            x, h = block(x, h, norm_next, meta, rope[block.sliding], cache, write, weights)
        return h

    def head(self, h: torch.Tensor, rows: torch.Tensor | None = None,
             out: torch.Tensor | None = None) -> torch.Tensor:
        """h [A, hidden] -> fp32 logits [A, len(rows)] of the tied output head (rows: int32,
        None for all), into `out` when given; h stays in the activation dtype, the products
        accumulate in fp32."""
        w = self.embedding
        n = w.shape[0] if rows is None else len(rows)
        if out is None:
            out = torch.empty(len(h), n, device=h.device)
        if isinstance(w, QWeight):
            return qmatmul(h, w, out, rows=rows)
        return torch.matmul(h.float(), (w if rows is None else w[rows]).float().T, out=out)

    def logsumexp(self, h: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """h [A, hidden] -> fp32 [A] (into `out` when given): logsumexp of the
        full-vocabulary logits."""
        if isinstance(self.embedding, QWeight):
            return qmatmul_logsumexp(h, self.embedding, out)
        return torch.logsumexp(self.head(h), dim=-1, out=out)
