"""Random Gemma 4 text models written as GGUF files, as llama.cpp's converter lays them
out: tiny ones for exact-math tests (every Gemma 4 difference switchable), real shapes
(SHAPES) for speed. Norms are stored as w (Gemma 4 multiplies by w); the full layers'
proportional RoPE is the rope_freqs tensor (1 for a pair that turns, 1e30 for one that
does not). llama.cpp reads the K/V of shared layers from the last two non-shared layers
(the second to last sliding, the last full) and aborts on another layout, so the layer
kinds given must end their non-shared part that way (`check_llama_layout`)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from .random_gguf import T, random_blocks, random_tensor, synthetic_tokenizer

# Real Gemma 4 text shapes (transformers' converter table); pattern: every pattern-th
# layer (and the last) is full attention
SHAPES = {
    "gemma-4-e2b": dict(layers=35, pattern=5, hidden=1536, heads=8, kv_heads=1,
                        kv_heads_full=1, head_dim=256, head_dim_full=512, ffn=6144,
                        double_wide=True, shared_kv=20, ple=256, window=512, vocab=262144,
                        n_ctx_train=131072),
    "gemma-4-e4b": dict(layers=42, pattern=6, hidden=2560, heads=8, kv_heads=2,
                        kv_heads_full=2, head_dim=256, head_dim_full=512, ffn=10240,
                        shared_kv=18, ple=256, window=512, vocab=262144, n_ctx_train=131072),
    "gemma-4-31b": dict(layers=60, pattern=6, hidden=5376, heads=32, kv_heads=16,
                        kv_heads_full=4, head_dim=256, head_dim_full=512, ffn=21504,
                        k_eq_v=True, window=1024, vocab=262144, n_ctx_train=262144),
}
# Google's QAT GGUFs: Q4_0 weights and tables (norms and small tensors F32)
QAT_Q4_0 = {k: T.Q4_0 for k in ("token_embd", "attn_q", "attn_k", "attn_v", "attn_output",
                                "ffn_gate", "ffn_up", "ffn_down", "inp_gate", "proj",
                                "per_layer_token_embd", "per_layer_model_proj")}
# the tiny models' default mix: every packed type the engine holds, and dense tensors
MIXED = {"token_embd": T.Q8_0, "attn_q": T.Q4_0, "attn_k": T.Q5_0, "attn_v": T.Q8_0,
         "attn_output": T.Q4_K, "ffn_gate": T.Q4_1, "ffn_up": T.Q5_0, "ffn_down": T.Q6_K,
         "inp_gate": T.Q8_0, "proj": T.F32, "per_layer_token_embd": T.Q4_0,
         "per_layer_model_proj": T.F16}


def layer_kinds(layers: int, pattern: int) -> list[bool]:
    """True (sliding) for each layer but every pattern-th and the last (full)."""
    return [(i + 1) % pattern != 0 and i != layers - 1 for i in range(layers)]


def check_llama_layout(kinds: list[bool], shared_kv: int) -> None:
    """llama.cpp's KV donors: shared layers read layer n - 2 (sliding) or n - 1 (full)
    of the n non-shared ones."""
    n = len(kinds) - shared_kv
    if shared_kv and (n < 2 or not kinds[n - 2] or kinds[n - 1]):
        raise ValueError(f"llama.cpp needs non-shared layers ending sliding, full; got "
                         f"{kinds[:n]}")


def write_gemma4(path: Path, rng: np.random.Generator, *, layers: int = 10,
                 kinds: list[bool] | None = None, pattern: int = 5, hidden: int = 256,
                 heads: int = 4, kv_heads: int = 2, kv_heads_full: int | None = None,
                 head_dim: int = 64, head_dim_full: int = 128, ffn: int = 512,
                 double_wide: bool = False, shared_kv: int = 0, ple: int = 0,
                 k_eq_v: bool = False, rotated: float = 0.25, window: int = 16,
                 vocab: int = 384, n_ctx_train: int = 4096, softcap: float | None = 30.0,
                 types: dict[str, T] | None = None, untied_head: bool = False,
                 shared_kv_tensors: bool = False, experts: tuple[int, int, int] | None = None,
                 synthetic_vocab: bool = False, raw: bool = False) -> Path:
    """A random Gemma 4 text model in GGUF. kinds: each layer sliding (True) or full
    (default: every `pattern`-th and the last full); kv_heads_full, head_dim_full: the
    full layers' (KV heads default kv_heads); double_wide: shared layers' MLP twice as
    wide; ple: per-layer input width (0: none); k_eq_v: full layers without attn_v;
    rotated: the share of the full layers' frequency pairs that turn; types: GGML type
    by tensor suffix (MIXED by default, F32 for what it leaves out); untied_head: an
    output.weight of its own; shared_kv_tensors: shared layers keep k/v tensors they do
    not use (as checkpoints may); experts: (count, used, width) of a mixture of experts
    beside each layer's MLP (26B-A4B: llama.cpp only); synthetic_vocab: a made-up
    tokenizer (llama.cpp refuses a GGUF without one); raw: every quantized tensor random
    blocks instead of quantized normals (fast, for real shapes)."""
    kinds = layer_kinds(layers, pattern) if kinds is None else list(kinds)
    kv_full = kv_heads_full or kv_heads
    types = {**MIXED, **(types or {})}
    w = gguf.GGUFWriter(str(path), "gemma4")
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    first_shared = layers - shared_kv
    w.add_feed_forward_length([ffn * (2 if double_wide and i >= first_shared else 1)
                               for i in range(layers)])
    w.add_head_count(heads)
    w.add_head_count_kv([kv_heads if s else kv_full for s in kinds])
    w.add_key_length(head_dim_full)
    w.add_value_length(head_dim_full)
    w.add_key_length_swa(head_dim)
    w.add_value_length_swa(head_dim)
    w.add_rope_dimension_count(head_dim_full)
    w.add_rope_dimension_count_swa(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    w.add_rope_freq_base_swa(1e4)
    w.add_sliding_window(window)
    w.add_sliding_window_pattern(kinds)
    w.add_shared_kv_layers(shared_kv)
    w.add_embedding_length_per_layer_input(ple)
    if softcap:
        w.add_final_logit_softcapping(softcap)
    if experts:
        w.add_expert_count(experts[0])
        w.add_expert_used_count(experts[1])
        w.add_expert_feed_forward_length(experts[2])
    if synthetic_vocab:
        synthetic_tokenizer(w, vocab)
    else:
        w.add_bos_token_id(2)

    def add(name: str, kind: str, rows: int, cols: int, std: float = 0.05) -> None:
        qtype = types.get(kind, T.F32)
        if raw and qtype not in (T.F32, T.F16):
            block, _ = gguf.GGML_QUANT_SIZES[qtype]
            data = random_blocks(qtype, rows * cols // block, rng, 0.003).reshape(rows, -1)
        elif qtype == T.F16:
            data = rng.normal(0, std, (rows, cols)).astype(np.float16)
        else:
            data = random_tensor(qtype, rows, cols, rng, std=std)
        w.add_tensor(name, data, raw_dtype=None if qtype in (T.F32, T.F16) else qtype)

    def norm(name: str, n: int, scale: float = 1.0) -> None:
        """w ~ N(1, 0.3) * scale: Gemma 4 multiplies by w."""
        w.add_tensor(name, ((1 + rng.normal(0, 0.3, n)) * scale).astype(np.float32))

    add("token_embd.weight", "token_embd", vocab, hidden, 0.1)
    if untied_head:
        add("output.weight", "output", vocab, hidden, 0.1)
    norm("output_norm.weight", hidden)
    n_rot = int(rotated * head_dim_full / 2)
    freqs = [1.0] * n_rot + [1e30] * (head_dim_full // 2 - n_rot)
    w.add_tensor("rope_freqs.weight", np.array(freqs, np.float32))
    if ple:
        add("per_layer_token_embd.weight", "per_layer_token_embd", vocab, layers * ple, 0.5)
        add("per_layer_model_proj.weight", "per_layer_model_proj", layers * ple, hidden)
        norm("per_layer_proj_norm.weight", ple)
    for i, sliding in enumerate(kinds):
        p = f"blk.{i}."
        d, kv = (head_dim, kv_heads) if sliding else (head_dim_full, kv_full)
        add(p + "attn_q.weight", "attn_q", heads * d, hidden)
        if i < first_shared or shared_kv_tensors:
            add(p + "attn_k.weight", "attn_k", kv * d, hidden)
            if sliding or not k_eq_v:
                add(p + "attn_v.weight", "attn_v", kv * d, hidden)
            norm(p + "attn_k_norm.weight", d, d ** -0.25)
        f = ffn * (2 if double_wide and i >= first_shared else 1)
        add(p + "attn_output.weight", "attn_output", hidden, heads * d)
        add(p + "ffn_gate.weight", "ffn_gate", f, hidden)
        add(p + "ffn_up.weight", "ffn_up", f, hidden)
        add(p + "ffn_down.weight", "ffn_down", hidden, f)
        for n in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            norm(p + n + ".weight", hidden)
        # unscaled attention: trained q and k norms carry the D^-0.5 between them (random
        # weights of 1 would make every softmax an argmax, and the tests ill-conditioned)
        norm(p + "attn_q_norm.weight", d, d ** -0.25)
        w.add_tensor(p + "layer_output_scale.weight",
                     rng.uniform(0.3, 1.5, 1).astype(np.float32))
        if ple:
            add(p + "inp_gate.weight", "inp_gate", ple, hidden)
            add(p + "proj.weight", "proj", hidden, ple)
            norm(p + "post_norm.weight", hidden)
        if experts:
            _add_experts(w, rng, p, hidden, *experts, norm)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _add_experts(w: gguf.GGUFWriter, rng: np.random.Generator, p: str, hidden: int,
                 count: int, used: int, width: int, norm) -> None:
    """26B-A4B's mixture beside the MLP: a router (weights, an input scale, a scale per
    expert), the experts' fused gate/up and down weights, and the three extra norms."""
    del used  # in the metadata only
    f32 = lambda *shape, std=0.05: rng.normal(0, std, shape).astype(np.float32)  # noqa: E731
    w.add_tensor(p + "ffn_gate_inp.weight", f32(count, hidden, std=0.3))
    w.add_tensor(p + "ffn_gate_inp.scale", (1 + f32(hidden, std=0.2)))
    w.add_tensor(p + "ffn_gate_up_exps.weight", f32(count, 2 * width, hidden))
    w.add_tensor(p + "ffn_down_exps.weight", f32(count, hidden, width))
    w.add_tensor(p + "ffn_down_exps.scale", (1 + f32(count, std=0.2)))
    for n in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
        norm(p + n + ".weight", hidden)


def write_shape(path: Path, shape: str) -> Path:
    """Random weights of a real shape, Gemma 3's (random_gguf.SHAPES, in gemma-3-270m's
    Q4_K_M types) or Gemma 4's (SHAPES, in QAT Q4_0), with no tokenizer: token ids only."""
    from .random_gguf import Q4_K_M, write_tiny_gemma3
    from .random_gguf import SHAPES as GEMMA3

    if shape in SHAPES:
        return write_gemma4(path, np.random.default_rng(0), types=QAT_Q4_0, raw=True,
                            **SHAPES[shape])
    if shape not in GEMMA3:
        raise ValueError(f"unknown shape {shape!r}: one of {', '.join([*GEMMA3, *SHAPES])}")
    return write_tiny_gemma3(path, np.random.default_rng(0), types=Q4_K_M, **GEMMA3[shape])
