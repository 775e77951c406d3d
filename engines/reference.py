"""The reference engine: transformers' Gemma3ForCausalLM or Gemma4ForCausalLM in fp32 on
weights dequantized from the same file by gguf's own dequantize (compressed-tensors' for
a checkpoint). The correctness oracle for the other engines and the plain-transformers
baseline: no KV cache, no shared prefix, one full forward per label path (prefix +
suffix + the path's tokens).

The transformers config is built from the config this project reads
(reference_models.py), since transformers' GGUF loader does not read Gemma 3's layer
types, query_pre_attn_scalar or local RoPE base, nor Gemma 4 at all.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from transformers.initialization import no_init_weights

from decider.chat_template import stored_template
from decider.errors import ConfigError, EngineFailure

from . import reference_models
from .base import (
    BranchResult,
    EngineInfo,
    JobResult,
    NodeLogits,
    ScoreJob,
    Stop,
    check_windows,
    label_trie,
    resolve_n_ctx,
    trie_leaves,
)
from .checkpoints import has_tokenizer, read_text_model
from .faults import begin_pass
from .layers import activation_dtype
from .vocab import Vocab


class ReferenceEngine:
    name = "reference"
    prefix_cache = None  # none kept yet (docs/design.md, "The prefix cache")

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
        gg, _, cfg = read_text_model(path, self.name, dense=True)
        n_ctx = resolve_n_ctx(n_ctx, cfg.n_ctx_train)
        try:
            model_cls, config, sd = getattr(reference_models, gg.arch)(cfg, gg)
        except ValueError as e:
            raise ConfigError(f"engine 'reference' cannot load {path}: {e}") from e
        with no_init_weights():  # every weight is loaded next: skip the random init
            self.model = model_cls(config).eval()
        missing, unexpected = self.model.load_state_dict(sd, strict=False, assign=True)
        if unexpected or set(missing) - {"lm_head.weight"}:
            raise EngineFailure(f"{path}: tensors do not match {model_cls.__name__} "
                                f"(missing {missing}, unexpected {unexpected})")
        if config.tie_word_embeddings:
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
            chat_template=stored_template(path, gg.meta),
        )

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        return self._vocab.tokenize(text, special)

    def work_tokens(self, job: ScoreJob) -> int:
        """Each label path is a sequence of its own: prefix, suffix and path each time."""
        return sum(len(job.prefix) + len(b.suffix) + len(leaf) for b in job.branches
                   for leaf in trie_leaves(label_trie(b.candidates)))

    def warm_up(self, max_batch: int) -> None:
        """Nothing to run: transformers in eager mode compiles no shape ahead."""

    def score(self, jobs: Sequence[ScoreJob], stop: Stop | None = None
              ) -> list[JobResult | Exception]:
        """A job is its chunk: stop is asked before each."""
        check_windows(jobs, self.info.n_ctx)
        with self._lock:
            fault = begin_pass("reference")
            if fault:  # no buffer of its own to leave unwritten: every such pass reads zeros
                return [JobResult(self._zeros(b) for b in job.branches) for job in jobs]
            with torch.inference_mode():
                return [(stop and stop(i)) or JobResult(
                        self._branch(job.prefix, b.suffix, b.candidates) for b in job.branches)
                        for i, job in enumerate(jobs)]

    def _branch(self, prefix, suffix, candidates) -> BranchResult:
        trie = label_trie(candidates)
        rows = {}
        for leaf in trie_leaves(trie):
            ids = torch.tensor([[*prefix, *suffix, *leaf]], device=self._device)
            # the last positions by index: transformers 5.24's Gemma 4 slices an integer
            # count into its shared layers, and fails there without per-layer inputs
            keep = torch.arange(ids.shape[1] - len(leaf) - 1, ids.shape[1], device=self._device)
            logits = self.model(ids, logits_to_keep=keep).logits[0].float().cpu()
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
