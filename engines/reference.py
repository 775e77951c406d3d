"""The reference engine: transformers' Gemma3ForCausalLM in fp32 on weights dequantized
from the same GGUF by gguf's own dequantize. The correctness oracle for the other
engines and the plain-transformers baseline: no KV cache, no shared prefix, one full
forward per label path (prefix + suffix + the path's tokens).

The config is built here from the GGUF metadata and the values GGUF lacks
(Gemma3Config.from_gguf), since transformers' GGUF loader does not read layer types,
query_pre_attn_scalar or the local RoPE base.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig
from transformers.initialization import no_init_weights

from decider.errors import EngineFailure

from .base import (BranchResult, EngineInfo, NodeLogits, ScoreJob, check_windows, label_trie,
                   resolve_n_ctx, trie_leaves)
from .checkpoints import HF_NAMES, has_tokenizer, read_gemma3
from .faults import begin_pass
from .gemma3 import SLIDING_PATTERN, Gemma3Config, activation_dtype
from .gguf_weights import GGUFModel
from .vocab import Vocab

# GGUF tensor name (after "blk.N.") -> transformers parameter (after "model.layers.N.")
_NAMES = {gguf: hf for hf, gguf in HF_NAMES.items()}


def hf_config(cfg: Gemma3Config) -> Gemma3TextConfig:
    full_rope = {"rope_type": "default", "rope_theta": cfg.rope_global}
    if cfg.rope_global_scale != 1.0:
        full_rope = {**full_rope, "rope_type": "linear", "factor": cfg.rope_global_scale}
    return Gemma3TextConfig(
        vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=cfg.ffn,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads, head_dim=cfg.head_dim, rms_norm_eps=cfg.eps,
        sliding_window=cfg.window, query_pre_attn_scalar=cfg.query_pre_attn_scalar,
        max_position_embeddings=cfg.n_ctx_train, sliding_window_pattern=SLIDING_PATTERN,
        rope_parameters={"full_attention": full_rope, "sliding_attention": {
            "rope_type": "default", "rope_theta": cfg.rope_local}},
        bos_token_id=cfg.bos_id, tie_word_embeddings=True, attn_implementation="eager",
    )


def state_dict(gg: GGUFModel) -> dict[str, torch.Tensor]:
    """transformers' parameters from dense GGUF tensors; norms lose the +1 llama.cpp's
    converter folded in (transformers' Gemma RMSNorm adds it back)."""
    sd = {}
    for name, array in gg.tensors.items():
        w = torch.from_numpy(np.array(array, np.float32))
        if name.endswith("norm.weight"):
            w = w - 1
        if name == "token_embd.weight":
            sd["model.embed_tokens.weight"] = w
        elif name == "output_norm.weight":
            sd["model.norm.weight"] = w
        else:
            _, i, kind, _ = name.split(".")
            sd[f"model.layers.{i}.{_NAMES[kind]}.weight"] = w
    return sd


class ReferenceEngine:
    name = "reference"

    def __init__(self, model_path: str | Path, n_ctx: int | None = None, *, model_name: str = "",
                 n_threads: int | None = None, device: str = "cpu",
                 dtype: str = "float32") -> None:
        """device and dtype: fp32 on the CPU is the oracle; bf16 on CUDA the "plain
        transformers" row of the GPU benchmarks."""
        if n_threads:
            torch.set_num_threads(n_threads)
        torch_dtype = activation_dtype(dtype)
        path = Path(model_path)
        # gguf's own dequantize (compressed-tensors' for a checkpoint), not our packing
        gg, cfg = read_gemma3(path, self.name, dense=True)
        n_ctx = resolve_n_ctx(n_ctx, cfg.n_ctx_train)
        with no_init_weights():  # every weight is loaded next: skip the random init
            self.model = Gemma3ForCausalLM(hf_config(cfg)).eval()
        missing, unexpected = self.model.load_state_dict(state_dict(gg), strict=False,
                                                         assign=True)
        if unexpected or set(missing) - {"lm_head.weight"}:
            raise EngineFailure(f"{path}: tensors do not match Gemma 3 "
                                f"(missing {missing}, unexpected {unexpected})")
        self.model.tie_weights()
        self.model.to(device=device, dtype=torch_dtype)
        self._device = torch.device(device)
        self._lock = threading.Lock()
        self._vocab = Vocab(path, has_tokenizer(gg))  # the llama engine's ids
        self.info = EngineInfo(
            model_name=model_name or path.stem, model_path=str(path), n_ctx=n_ctx,
            n_ctx_train=cfg.n_ctx_train, n_vocab=cfg.vocab, bos_id=cfg.bos_id,
            weights=f"dequantized to {dtype}, "
                    f"{sum(w.size for w in gg.tensors.values()) / 1e6:.0f}M params",
            memory={"weights": sum(p.numel() * p.element_size()
                                   for p in self.model.parameters())},
        )

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        return self._vocab.tokenize(text, special)

    def placed_tokens(self, job: ScoreJob) -> int:
        """Each label path is a sequence of its own: prefix, suffix and path each time."""
        return sum(len(job.prefix) + len(b.suffix) + len(leaf) for b in job.branches
                   for leaf in trie_leaves(label_trie(b.candidates)))

    def score(self, jobs: Sequence[ScoreJob]) -> list[list[BranchResult]]:
        check_windows(jobs, self.info.n_ctx)
        with self._lock:
            fault = begin_pass("reference")
            if fault:  # no buffer of its own to leave unwritten: every such pass reads zeros
                return [[self._zeros(b) for b in job.branches] for job in jobs]
            with torch.inference_mode():
                return [[self._branch(job.prefix, b.suffix, b.candidates) for b in job.branches]
                        for job in jobs]

    def _branch(self, prefix, suffix, candidates) -> BranchResult:
        trie = label_trie(candidates)
        rows = {}
        for leaf in trie_leaves(trie):
            ids = torch.tensor([[*prefix, *suffix, *leaf]], device=self._device)
            logits = self.model(ids, logits_to_keep=len(leaf) + 1).logits[0].float().cpu()
            for k in range(len(leaf) + 1):
                rows.setdefault(leaf[:k], logits[k])
        return tuple(
            NodeLogits(p, trie[p], rows[p][list(trie[p])].numpy().copy(),
                       float(torch.logsumexp(rows[p], -1)) if not p else None)
            for p in sorted(trie, key=len))

    @staticmethod
    def _zeros(branch) -> BranchResult:
        trie = label_trie(branch.candidates)
        return tuple(NodeLogits(p, trie[p], np.zeros(len(trie[p]), np.float32),
                                0.0 if not p else None) for p in sorted(trie, key=len))

    def close(self) -> None:
        self._vocab.close()
