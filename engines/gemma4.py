"""Gemma 4 text model (E2B, E4B, 31B) in plain PyTorch, on packed GGUF weights; its
configuration: engines/gemma4_config.py. Where Gemma 4 differs from Gemma 3, each a silent
wrong logit if missed:
- norms multiply by the stored w (no 1 + w), and V gets a weightless RMSNorm;
- attention is not scaled (1.0);
- full layers rotate only the first pairs of frequencies of their whole head
  ("proportional" RoPE, encoded in GGUF as rope_freqs: 1 rotates, 1e30 does not);
- after each layer's MLP, per-layer inputs (PLE) enter through a gated projection and
  its norm, then `layer_scalar` scales the whole residual stream;
- the last `shared_kv_layers` layers compute no K/V: they read those of the last earlier
  layer of their kind, and have no cache;
- full layers of 31B have no V projection: V is the weightless norm of the raw K;
- the logits are softcapped, 30 tanh(x / 30), before any logsumexp.
"""

from __future__ import annotations

import torch
from torch import nn

from decider.kernels.attention import attend
from decider.kernels.embed import embed_rms_norm, per_layer_inputs
from decider.kernels.fused import add_rms_norm, gelu_times, qk_norm_rope_, rope_tables
from decider.kernels.pass_layout import END, IDS, LO_FULL, LO_SLIDE, POS

from .dense_weights import DenseWeights
from .gemma4_config import Gemma4Config
from .gguf_weights import GGUFModel
from .kv_cache import KVCache
from .layers import Linear, TextModel, fp32, stored


class Block(nn.Module):
    def __init__(self, cfg: Gemma4Config, i: int, t: dict, dtype: torch.dtype) -> None:
        super().__init__()
        self.cfg, self.index, self.sliding = cfg, i, cfg.sliding(i)
        self.head_dim, self.kv_heads, self.donor = cfg.head_dim(i), cfg.kv_heads[i], cfg.donor(i)
        p = f"blk.{i}."
        w = lambda n: t[p + n + ".weight"]  # noqa: E731
        # a shared layer projects q only; K = V projects k twice: its copy is the raw V
        kv = [] if not cfg.has_kv(i) else [w("attn_k"), w("attn_k")] if cfg.k_eq_v[i] \
            else [w("attn_k"), w("attn_v")]
        self.qkv = Linear([w("attn_q"), *kv], dtype)
        self.o = Linear([w("attn_output")], dtype)
        self.gate_up = Linear([w("ffn_gate"), w("ffn_up")], dtype, interleave=True)
        self.down = Linear([w("ffn_down")], dtype)
        norms = ["attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm", "attn_q_norm"]
        norms += ["attn_k_norm"] if cfg.has_kv(i) else []
        if cfg.ple:
            self.ple_gate = Linear([w("inp_gate")], dtype)
            self.ple_proj = Linear([w("proj")], dtype)
            norms.append("post_norm")
        for n in norms:
            self.register_buffer(n, fp32(w(n)))
        scalar = t.get(p + "layer_output_scale.weight")
        self.register_buffer("layer_scalar", None if scalar is None else fp32(scalar).view(1))

    def forward(self, x, h, norm_next, meta, rope, shared: dict, cache: KVCache | None,
                dense: dict[str, torch.Tensor], ple: torch.Tensor | None,
                rows: tuple[torch.Tensor, torch.Tensor] | None = None):
        """x: the residual stream [T, hidden], h: its attn_norm; returns the stream after
        this layer and its norm by norm_next, and this layer's (k, v) when it has its
        own (else None). shared: the (k, v) of earlier layers of this pass, by layer;
        cache: the prefix before these tokens (the donor's, for a shared layer); ple:
        this layer's per-layer inputs [T, P]. rows: (tokens, their positions) when x
        holds those tokens of the pass alone (a shared layer's queries)."""
        cfg = self.cfg
        t, hq, hkv, d = len(x), cfg.heads, self.kv_heads, self.head_dim
        tokens, pos = rows or (None, meta[POS])
        heads = self.qkv(h, dense.get("qkv")).view(t, -1, d)
        own = heads.shape[1] > hq
        qk_norm_rope_(heads, hq, self.attn_q_norm, self.attn_k_norm if own else self.attn_q_norm,
                      pos, *rope, cfg.eps, n_v=hkv if own else 0)
        q = heads[:, :hq]
        k, v = (heads[:, hq:hq + hkv], heads[:, hq + hkv:]) if own else shared[self.donor]
        cached = cache.read(self.donor) if cache is not None else None
        a = attend(q, k, v, meta[LO_SLIDE if self.sliding else LO_FULL], meta[END], 1.0,
                   cache=cached, q_pos=meta[POS], window=cfg.window if self.sliding else None,
                   rows=tokens)
        x, h = add_rms_norm(x, self.o(a.view(t, hq * d), dense.get("o")),
                            self.post_attention_norm, self.ffn_norm, cfg.eps)
        y = self.down(self.gate_up.gelu(h, dense.get("gate_up")), dense.get("down"))
        if ple is not None:  # the gate reads the stream itself, not a norm of it
            x, stream = add_rms_norm(x, y, self.post_ffw_norm, None, cfg.eps)
            g = gelu_times(self.ple_gate(stream, dense.get("ple_gate")), ple)
            y = self.ple_proj(g, dense.get("ple_proj"))
            x, h = add_rms_norm(x, y, self.post_norm, norm_next, cfg.eps, self.layer_scalar)
        else:
            x, h = add_rms_norm(x, y, self.post_ffw_norm, norm_next, cfg.eps, self.layer_scalar)
        return x, h, (k, v) if own else None


class Gemma4(TextModel):
    config_class = Gemma4Config

    def __init__(self, model: GGUFModel, dtype: torch.dtype = torch.float32,
                 n_ctx: int | None = None) -> None:
        self.cfg = cfg = Gemma4Config.from_gguf(model)
        super().__init__(dtype, cfg.hidden)
        t = model.tensors
        self._set_head(t["token_embd.weight"], t.get("output.weight"), cfg.softcap)
        self.blocks = nn.ModuleList(Block(cfg, i, t, dtype) for i in range(cfg.layers))
        self.donors = cfg.donors()  # the layers whose K/V a pass keeps to its end
        self.dense = DenseWeights(self.blocks, dtype)  # made again by to(), on the device
        self.register_buffer("norm", fp32(t["output_norm.weight"]))
        if cfg.ple:
            # the per-layer table stays in its stored form, gathered per token
            self.ple_table = stored(t["per_layer_token_embd.weight"], model.dtypes.get(
                "per_layer_token_embd.weight"))
            self.ple_model_proj = Linear([t["per_layer_model_proj.weight"]], dtype)
            self.register_buffer("ple_proj_norm", fp32(t["per_layer_proj_norm.weight"]))
        n = n_ctx or cfg.n_ctx_train
        local = rope_tables(n, cfg.head_dims[0], cfg.rope_local)
        full = rope_tables(n, cfg.head_dims[1], cfg.rope_global, rotated=cfg.rotated)
        for name, (cos, sin) in (("local", local), ("global", full)):
            self.register_buffer(f"cos_{name}", cos)
            self.register_buffer(f"sin_{name}", sin)

    def _moved(self, device) -> None:
        if self.cfg.ple:
            self.ple_table = self.ple_table.to(device)
        self.dense = DenseWeights(self.blocks, self.dtype)

    def _tables(self):
        return [self.ple_table] if self.cfg.ple else []

    def kv_layout(self) -> list[tuple[bool, int, int] | None]:
        """Per layer its cache: (sliding, kv heads, head dim); None for a shared layer."""
        c = self.cfg
        return [(c.sliding(i), c.kv_heads[i], c.head_dim(i)) if c.has_kv(i) else None
                for i in range(c.layers)]

    @property
    def prunes_rows(self) -> bool:
        return self.cfg.shared_kv > 0

    def forward(self, meta: torch.Tensor, cache: KVCache | None = None,
                write: bool = False, rows: torch.Tensor | None = None) -> torch.Tensor:
        """meta int32 [5, T] (kernels/columns.py: ids, pos, lo_full, lo_slide, end) ->
        final-normed hidden states [T, hidden], or of the tokens `rows` (int32, best
        ascending) alone: the layers that share earlier layers' K/V then compute those
        tokens only, as no later layer reads the others. cache: the prefix before these
        tokens, which write=True extends with them: at once for a layer no other reads,
        for a donor once the shared layers have read its cache as it was. Only the
        donors' K/V outlive their layer. No host sync: a CUDA graph can hold it (cache
        None)."""
        cfg = self.cfg
        ids = meta[IDS]
        x, h = embed_rms_norm(self.embedding, ids, self.embed_scale, self.blocks[0].attn_norm,
                              cfg.eps)
        ple = None
        if cfg.ple:
            proj = self.ple_model_proj(x.to(self.dtype))
            ple = per_layer_inputs(proj, self.ple_table, ids, self.ple_proj_norm, cfg.eps,
                                   cfg.hidden).view(len(ids), cfg.layers, cfg.ple)
        rope = {True: (self.cos_local, self.sin_local), False: (self.cos_global, self.sin_global)}
        shared: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # the donors' K/V
        first_shared = cfg.layers - cfg.shared_kv
        picked = None  # (tokens, positions) once the layers compute `rows` alone
        counts = [len(ids) if rows is None or i < first_shared else len(rows)
                  for i in range(cfg.layers)]
        dense = self.dense.layers(counts, ids.device)
        for i, (block, weights) in enumerate(zip(self.blocks, dense)):
            if i == first_shared and rows is not None:
                x, h = x.index_select(0, rows), h.index_select(0, rows)
                ple = None if ple is None else ple.index_select(0, rows)
                picked = (rows, meta[POS].index_select(0, rows))
            if not len(x):  # a pass that reads no token (a prefix chunk)
                continue
            norm_next = self.blocks[i + 1].attn_norm if i + 1 < len(self.blocks) else self.norm
            x, h, kv = block(x, h, norm_next, meta, rope[block.sliding], shared, cache, weights,
                             None if ple is None else ple[:, i], picked)
            if kv is not None and i in self.donors:
                shared[i] = kv
            elif kv is not None and write:
                cache.write(i, *kv, meta[POS])
        if write:  # after the shared layers read the donors' caches as they were
            for i, (k, v) in shared.items():
                cache.write(i, k, v, meta[POS])
        return h if picked is not None or rows is None else h.index_select(0, rows)
