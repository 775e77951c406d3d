"""The Triton engine: a plain PyTorch Gemma 3 on packed GGUF weights.

On CUDA it is meant to run Triton kernels; on a machine without CUDA the same model code
runs on the torch reference kernels (fp32), which is what CI checks the math with.

One job: the prefix goes through the model once, in chunks of n_batch tokens, filling
the engine's KV cache. Then the branches: each branch's suffix and label-trie tokens
form a token tree on top of the cached prefix (a trie node's token sees the prefix, the
suffix and its own ancestors), several branches per pass, none writing the cache. Only
label rows of the tied output head are computed, at trie-node tokens only, plus the
full-vocabulary logsumexp at each answer position.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from decider.errors import ConfigError, EngineOutOfMemory
from decider.kernels.attention import tree_visible

from .base import (BranchResult, EngineInfo, NodeLogits, ScoreJob, Tokens, check_windows,
                   label_trie)
from .checkpoints import has_tokenizer, read_model
from .faults import begin_pass
from .gemma3 import Gemma3
from .gguf_weights import GGUFModel
from .kv_cache import KVCache
from .vocab import Vocab

SENTINEL = float(np.finfo(np.float32).min)  # no forward pass produces exactly -FLT_MAX
DEFAULT_N_CTX = 8192


@dataclass(frozen=True, slots=True)
class _Out:
    """One trie node's row: where it is read and where it lands in the output buffer."""

    job: int
    branch: int
    path: Tokens
    allowed: Tokens
    at: int  # offset of its logits in the output buffer
    lse_at: int  # offset of its logsumexp, -1 below the answer position


class TorchEngine:
    name = "triton"

    def __init__(self, model_path: str | Path, n_ctx: int | None = None, *, model_name: str = "",
                 device: str | None = None, dtype: str | None = None, n_batch: int = 512,
                 n_threads: int | None = None) -> None:
        if n_threads:
            torch.set_num_threads(n_threads)
        path = Path(model_path)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        # activations: bf16 on the GPU (tensor cores), fp32 elsewhere (exact against the
        # reference); the head's logits and logsumexp are computed in fp32 either way
        name = dtype or ("bfloat16" if self.device.type == "cuda" else "float32")
        if name not in ("bfloat16", "float16", "float32"):
            raise ConfigError(f"dtype must be bfloat16, float16 or float32, got {name!r}")
        self.dtype = getattr(torch, name)
        try:
            gg = read_model(path)  # a .gguf file or a checkpoint directory
            self.model = Gemma3(gg, self.dtype).to(self.device).eval()
        except ValueError as e:  # a model this engine cannot run: say which and why
            raise ConfigError(f"engine {self.name!r} cannot load {path}: {e}",
                              model_path=path) from e
        cfg = self.model.cfg
        n_ctx = n_ctx or min(DEFAULT_N_CTX, cfg.n_ctx_train)
        if not 32 <= n_ctx <= cfg.n_ctx_train:
            raise ConfigError(f"n_ctx must be in [32, {cfg.n_ctx_train}] (the model's trained "
                              f"context), got {n_ctx}", n_ctx=n_ctx, n_ctx_train=cfg.n_ctx_train)
        self._n_batch = n_batch
        self._lock = threading.Lock()
        self._vocab = Vocab(path, has_tokenizer(gg))  # the llama engine's ids
        self.cache = KVCache([cfg.sliding(i) for i in range(cfg.layers)], n_ctx, cfg.window,
                             cfg.kv_heads, cfg.head_dim, self.dtype, self.device)
        self._logits = torch.empty(0, device=self.device)  # label rows of one score call
        self._lse = torch.empty(0, device=self.device)
        self.info = EngineInfo(
            model_name=model_name or path.stem, model_path=str(path), n_ctx=n_ctx,
            n_ctx_train=cfg.n_ctx_train, n_vocab=cfg.vocab, bos_id=cfg.bos_id,
            weights=_summary(gg),
            memory={"weights": self.model.weight_bytes(), "kv": self.cache.nbytes()},
            sentinel=SENTINEL,
        )

    # -- Engine protocol -------------------------------------------------------------

    def tokenize(self, text: str) -> list[int]:
        return self._vocab.tokenize(text)

    def score(self, jobs: Sequence[ScoreJob]) -> list[list[BranchResult]]:
        check_windows(jobs, self.info.n_ctx)
        if not jobs:
            return []
        with self._lock:
            kind = begin_pass("torch")
            outs, n_logits, n_lse = _layout(jobs)
            try:
                self._prepare(n_logits, n_lse, poison=kind != "stale-logits")
                if kind == "zero-logits":  # as from a freshly allocated buffer
                    self._logits.zero_()
                    self._lse.zero_()
                elif kind is None:
                    with torch.inference_mode():
                        self._run(jobs, outs)
            except torch.OutOfMemoryError as e:
                raise EngineOutOfMemory(f"the torch engine ran out of memory: {e}") from e
            return self._read(jobs, outs)

    def close(self) -> None:
        self._vocab.close()

    # -- the passes ------------------------------------------------------------------

    def _prepare(self, n_logits: int, n_lse: int, poison: bool) -> None:
        """Size the output buffers and write the sentinel over the rows this call reads."""
        if self._logits.numel() < n_logits:  # zeros, not stale memory, if never written
            self._logits = torch.zeros(n_logits, device=self.device)
        if self._lse.numel() < n_lse:
            self._lse = torch.zeros(n_lse, device=self.device)
        if poison:
            self._logits[:n_logits].fill_(SENTINEL)
            self._lse[:n_lse].fill_(SENTINEL)

    def _run(self, jobs: Sequence[ScoreJob], outs: list[_Out]) -> None:
        hidden: list[torch.Tensor] = []  # [hidden] per entry of outs, in order
        for ji, job in enumerate(jobs):
            self.cache.clear()
            prefix = torch.tensor(job.prefix, device=self.device)
            for s in range(0, len(prefix), self._n_batch):
                ids = prefix[s : s + self._n_batch]
                pos = torch.arange(s, s + len(ids), device=self.device)
                causal = torch.ones(len(ids), len(ids), dtype=torch.bool,
                                    device=self.device).tril()
                self.model(ids, pos, causal, self.cache, write=True)
            job_outs = [o for o in outs if o.job == ji]
            for group in self._groups(job):
                hidden += self._branch_pass(job, group, job_outs)
        h = torch.stack(hidden).float()
        rows = sorted({t for o in outs for t in o.allowed})
        logits = self.model.head(h, torch.tensor(rows, device=self.device))
        col = {t: i for i, t in enumerate(rows)}
        for o, row in zip(outs, logits):
            self._logits[o.at : o.at + len(o.allowed)] = row[[col[t] for t in o.allowed]]
        roots = [i for i, o in enumerate(outs) if o.lse_at >= 0]
        lse = torch.logsumexp(self.model.head(h[roots]), dim=-1)
        self._lse[[outs[i].lse_at for i in roots]] = lse

    def _groups(self, job: ScoreJob) -> list[list[int]]:
        """Branches packed into passes of at most n_batch tokens (a longer branch alone)."""
        groups: list[list[int]] = [[]]
        used = 0
        for bi, branch in enumerate(job.branches):
            cost = len(branch.suffix) + len(label_trie(branch.candidates)) - 1
            if groups[-1] and used + cost > self._n_batch:
                groups.append([])
                used = 0
            groups[-1].append(bi)
            used += cost
        return groups

    def _branch_pass(self, job: ScoreJob, group: list[int], outs: list[_Out]) -> list:
        """One pass over the token trees of `group`; the hidden state of each of their
        outputs, in the order of `outs`."""
        ids, pos, parents, at = [], [], [], {}
        base = len(job.prefix)
        for bi in group:
            branch = job.branches[bi]
            for k, tok in enumerate(branch.suffix):
                parents.append(len(ids) - 1 if k else -1)
                ids.append(tok)
                pos.append(base + k)
            at[(bi, ())] = len(ids) - 1
            for path in sorted(label_trie(branch.candidates), key=len)[1:]:
                parents.append(at[(bi, path[:-1])])
                at[(bi, path)] = len(ids)
                ids.append(path[-1])
                pos.append(base + len(branch.suffix) + len(path) - 1)
        h = self.model(torch.tensor(ids, device=self.device), torch.tensor(pos, device=self.device),
                       tree_visible(parents).to(self.device), self.cache, write=False)
        return [h[at[(o.branch, o.path)]] for o in outs if o.branch in group]

    def _read(self, jobs: Sequence[ScoreJob], outs: list[_Out]) -> list[list[BranchResult]]:
        logits = self._logits.cpu().numpy()
        lse = self._lse.cpu().numpy()
        results: list[list[list[NodeLogits]]] = [[[] for _ in j.branches] for j in jobs]
        for o in outs:
            row = logits[o.at : o.at + len(o.allowed)].copy()
            results[o.job][o.branch].append(
                NodeLogits(o.path, o.allowed, row, float(lse[o.lse_at]) if o.lse_at >= 0 else None))
        return [[tuple(nodes) for nodes in branches] for branches in results]


def _layout(jobs: Sequence[ScoreJob]) -> tuple[list[_Out], int, int]:
    """Every trie node of every branch, root first per branch, with its buffer offsets."""
    outs: list[_Out] = []
    n_logits = n_lse = 0
    for ji, job in enumerate(jobs):
        for bi, branch in enumerate(job.branches):
            trie = label_trie(branch.candidates)
            for path in sorted(trie, key=len):
                outs.append(_Out(ji, bi, path, trie[path], n_logits, n_lse if not path else -1))
                n_logits += len(trie[path])
                n_lse += not path
    return outs, n_logits, n_lse


def _summary(gg: GGUFModel) -> str:
    dense = {"float32": "F32", "float16": "F16"}
    types = sorted({getattr(w, "source", None) or dense[str(w.dtype)] for w in gg.tensors.values()})
    params = sum(int(np.prod(w.shape)) for w in gg.tensors.values())
    return f"{'/'.join(types)} GGUF (packed), {params / 1e6:.0f}M params"
