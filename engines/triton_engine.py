"""The Triton engine: a plain PyTorch Gemma 3 or Gemma 4 on packed GGUF weights.

On CUDA the model runs Triton kernels (packed-weight matmuls, tree attention, fused
norms and RoPE) and, for passes up to 8192 tokens, replays CUDA graphs captured at load,
one per power-of-two token count. On a machine without CUDA the same model code
runs on the torch reference kernels (fp32), which is what CI checks the math with.

A score call is laid out by passes.py: every job a token tree, several trees per pass
(a job larger than n_batch goes through the KV cache in chunks). Only label rows of the
tied output head are computed, at trie-node tokens only, plus the full-vocabulary
logsumexp at each answer position; they land in one output buffer poisoned with the
sentinel first, and one copy brings them back. A call of one small pass (the latency
case) runs its head inside the CUDA graphs too, into the graphs' own buffer.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from decider.chat_template import stored_template
from decider.errors import ActivationOverflow, ConfigError, EngineFailure, EngineOutOfMemory
from decider.kernels.columns import columns

from .base import (
    SENTINEL,
    Branch,
    EngineInfo,
    JobResult,
    NodeLogits,
    ScoreJob,
    Stop,
    check_windows,
    resolve_n_ctx,
)
from .checkpoints import has_tokenizer, read_text_model
from .cuda_graphs import HEAD_LABELS, HEAD_ROWS, GraphRunner
from .faults import begin_pass
from .gguf_weights import GGUFModel
from .kv_cache import KVCache
from .layers import activation_dtype
from .passes import Layout, lay_out, tree_size
from .prefix_cache import PrefixCache, host_budget
from .prefix_routes import PrefixRouter
from .staging import Staging, aligned
from .vocab import Vocab

# default tokens per pass: on CUDA a job of up to 32,768 tokens goes whole, in one pass
# (each weight dequantized once); several jobs share passes of the largest captured graph
N_BATCH = {"cuda": 32768, "cpu": 512}
# the prefix cache: the shortest prefix kept and the chunks it is written in, and the
# share of the device's free memory it may hold by default. On CUDA a hit (~2.4 ms on
# gemma-3-270m, ~6 on Gemma 4 E2B) beats a fresh read from ~2,000 tokens, and a hit job
# runs alone where fresh ones share passes (docs/benchmarks.md, "The prefix cache")
PREFIX_STRIDE = {"cuda": 2048, "cpu": 512}
DEVICE_SHARE = 4
_DEVICE_ERROR = getattr(torch, "AcceleratorError", ())  # CUDA errors (torch >= 2.8)


class TritonEngine:
    name = "triton"

    def __init__(self, model_path: str | Path, n_ctx: int | None = None, *, model_name: str = "",
                 device: str | None = None, dtype: str | None = None, n_batch: int | None = None,
                 n_threads: int | None = None, cuda_graphs: bool = True,
                 prefix_cache_bytes: int | None = 0, prefix_stride: int | None = None) -> None:
        """prefix_cache_bytes: saved prefix states (prefix_cache.py), kept on the device;
        0: none; None: a share of the device's memory free after the load. prefix_stride:
        the shortest prefix cached, and the chunks it is read and saved in (at most
        n_batch; None: the device's default)."""
        if n_threads:
            torch.set_num_threads(n_threads)
        path = Path(model_path)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        # activations: fp16 on the GPU (tensor cores; 3 more mantissa bits than bf16 put
        # p_yes 10x closer to the fp32 reference, and with the residual stream in fp32 the
        # sublayers stay far inside its range: docs/design.md), fp32 elsewhere (exact
        # against the reference); the head's logits and logsumexp are fp32 either way
        self.dtype = activation_dtype(
            dtype or ("float16" if self.device.type == "cuda" else "float32"))
        # a .gguf file or a checkpoint directory, of an architecture model_class knows
        gg, model_cls, cfg = read_text_model(path, self.name)
        n_ctx = resolve_n_ctx(n_ctx, cfg.n_ctx_train)
        self._n_batch = n_batch or N_BATCH.get(self.device.type, N_BATCH["cpu"])
        if self._n_batch < 1:
            raise ConfigError(f"n_batch must be positive, got {self._n_batch}")
        # the shortest prefix the prefix cache keeps (None: no cache)
        stride = None if prefix_cache_bytes == 0 else min(
            prefix_stride or PREFIX_STRIDE.get(self.device.type, PREFIX_STRIDE["cpu"]),
            self._n_batch)
        self._lock = threading.Lock()
        self._vocab = Vocab(path, has_tokenizer(gg))  # the llama engine's ids
        try:
            self.model = model_cls(gg, self.dtype, n_ctx).to(self.device).eval()
            self.cache = KVCache(self.model.kv_layout(), n_ctx, cfg.window, self.dtype,
                                 self.device)
            self._staging = Staging(self.device)
            # one call's label-row logits, then its logsumexps: one buffer, one copy back
            self._out = torch.empty(0, device=self.device)
            self._graphs = None
            if self.device.type == "cuda" and cuda_graphs:
                with torch.inference_mode():
                    self._graphs = GraphRunner(self.model, self._n_batch, self.device,
                                               self.cache if stride else None, stride or 1)
            # jobs share passes of the largest graph, unless the model prunes rows (a
            # graph's fixed room of rows costs more then: docs/design.md)
            self._pack = self._graphs.sizes[-1] if self._graphs and \
                not self.model.prunes_rows else None
        except torch.OutOfMemoryError as e:
            raise EngineOutOfMemory(f"the Triton engine ran out of memory loading {path}: {e}") \
                from e
        self.prefix_cache, self._router = None, None
        if stride:
            self.prefix_cache = PrefixCache(prefix_cache_bytes or self._free_share())
            self._router = PrefixRouter(self.prefix_cache, stride)
        memory = {"weights": self.model.weight_bytes(), "kv": self.cache.nbytes()}
        if self._graphs is not None:
            memory["graphs"] = self._graphs.nbytes
        self.info = EngineInfo(
            model_name=model_name or path.stem, model_path=str(path), n_ctx=n_ctx,
            n_ctx_train=cfg.n_ctx_train, n_vocab=cfg.vocab, bos_id=cfg.bos_id,
            weights=_summary(gg), memory=memory, sentinel=SENTINEL,
            chat_template=stored_template(path, gg.meta),
        )

    # -- Engine protocol -------------------------------------------------------------

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        return self._vocab.tokenize(text, special)

    def work_tokens(self, job: ScoreJob) -> int:
        return tree_size(job)  # one token tree a job

    def warm_up(self, max_batch: int) -> None:
        """On CUDA every call size from 1 to max_batch jobs, of one question with 1, 2 and
        16 labels and of five: Triton compiles a kernel for each row tile and size class
        (1, a multiple of 16, other) here, before READY, not on requests (docs/design.md).
        Elsewhere nothing compiles: one call."""
        ids = [(7 + k) % self.info.n_vocab for k in range(min(120, self.info.n_ctx - 12))]

        def job(questions: int, labels: int) -> ScoreJob:
            return ScoreJob((self.info.bos_id, *ids), tuple(
                Branch(tuple(ids[q:q + 9]), tuple((ids[k],) for k in range(labels)))
                for q in range(questions)))

        kinds = [job(1, 2), job(1, 1), job(1, 16), job(5, 2)]
        if self.device.type != "cuda":
            self.score(kinds[:1])
            return
        for n in range(1, max_batch + 1):
            for one in kinds:
                self.score([one] * n)

    def score(self, jobs: Sequence[ScoreJob], stop: Stop | None = None
              ) -> list[JobResult | Exception]:
        """The call's passes pack every job's tokens together: no job can stop alone, and
        `stop` is never asked (a pass takes milliseconds)."""
        check_windows(jobs, self.info.n_ctx)
        if not jobs:
            return []
        with self._lock:
            kind = begin_pass("torch")
            routes = self._router.routes(jobs) if self._router else {}
            layout = lay_out(list(jobs), self._n_batch, self.model.cfg.window, self._pack,
                             routes)
            saves = []  # (prefix, snapshot) of this call, kept once its values are checked
            try:
                head = self._graph_head(layout)
                # the head graph's whole buffer, which the call picks from; else its own
                out = self._graphs.values if head else \
                    self._buffer(_lse_offset(layout) + layout.n_lse)
                with torch.inference_mode():  # the graphs' buffers are inference tensors
                    if kind != "stale-logits":  # poison what this call reads
                        out.fill_(SENTINEL)
                    if kind == "zero-logits":  # as from a freshly allocated buffer
                        out.zero_()
                    elif kind is None and head:
                        self._graphs.run_with_head(layout.passes[0], head[0])
                    elif kind is None:
                        self._run(layout, saves)
                # a fresh array (also on the CPU, where .cpu() is the buffer itself):
                # the results are views of it
                values = out.to("cpu", copy=True).numpy()
                if head:
                    values = values[head[1]]
            except torch.OutOfMemoryError as e:
                raise EngineOutOfMemory(f"the Triton engine ran out of memory: {e}") from e
            except _DEVICE_ERROR as e:  # a CUDA error: this context is done for
                raise EngineFailure(f"the Triton engine's device failed: {e}") from e
            if self.dtype == torch.float16 and not np.isfinite(values).all():
                # an fp16 overflow (inf, then NaN through the norms) reaches every row
                # that reads the token it happened at; no other fault writes non-finite
                raise ActivationOverflow("float16", float(torch.finfo(torch.float16).max))
            for tokens, snapshot in saves:
                self.prefix_cache.put(tokens, snapshot, snapshot.nbytes())
            n = layout.n_logits
            results = _results(jobs, layout, values[:n],
                               values[n if head else _lse_offset(layout):])
            for i, route in routes.items():
                results[i].cached_tokens = route.start
            return results

    def close(self) -> None:
        self._vocab.close()

    # -- the passes ------------------------------------------------------------------

    def _buffer(self, n: int) -> torch.Tensor:
        """The output buffer's first n values (zeros, not stale memory, if never written)."""
        if self._out.numel() < n:
            self._out = torch.zeros(n, device=self.device)
        return self._out[:n]

    def _graph_head(self, layout: Layout) -> tuple[list[int], list[int]] | None:
        """(label rows for GraphRunner.run_with_head, the indices of the call's values in
        its buffer) when the call is one pass a graph runs head and all; None otherwise."""
        graphs, p = self._graphs, layout.passes[0]
        if graphs is None or len(layout.passes) > 1 or p.cache or len(p.rows) > HEAD_ROWS \
                or graphs.bucket(p) is None:
            return None
        labels, src, roots = _head_indices(layout, HEAD_LABELS)
        if len(labels) > HEAD_LABELS:
            return None
        return labels, src + [HEAD_ROWS * HEAD_LABELS + a for a in roots]

    def _free_share(self) -> int:
        """The default prefix cache budget: a share of the device's free memory."""
        if self.device.type == "cuda":
            return torch.cuda.mem_get_info(self.device)[0] // DEVICE_SHARE
        return host_budget()

    def _run(self, layout: Layout, saves: list) -> None:
        """Every pass, then the head at the outputs. Each pass is packed and sent while the
        GPU runs the pass before it. The KV cache after a pass that saves is copied into
        `saves`."""
        graphs = self._graphs
        # the captured size each pass replays, or None: it runs eagerly at its own size
        buckets = [graphs.bucket(p) if graphs is not None else None for p in layout.passes]
        rows = [graphs.padded_rows(p, n) if n else np.asarray(p.rows, np.int32)
                for p, n in zip(layout.passes, buckets, strict=True)]
        outs = layout.outputs
        label_rows, src, roots = _head_indices(layout)
        self._staging.begin(sum(p.packed_size for p in layout.passes) + sum(map(len, rows))
                            + len(label_rows) + len(src) + len(roots),
                            regions=2 * len(layout.passes) + 3)
        hidden = torch.empty(len(outs), self.model.cfg.hidden, dtype=self.dtype,
                             device=self.device)
        at = 0
        for p, n, pass_rows in zip(layout.passes, buckets, rows, strict=True):
            packed = self._staging.put_pass(p)
            picked = self._staging.put(pass_rows)
            if p.restore is not None:
                self.cache.restore(p.restore)
            elif p.cache == "write" and p.starts_sequence:
                self.cache.clear()
            if p.cache and n:  # a graph that reads the cache, or writes it too
                h = graphs.run_cached(p.cache, packed, picked, n, self.cache.length)
            elif p.cache:
                h = self.model(columns(packed, p.tokens, p.window), self.cache,
                               write=p.cache == "write", rows=picked)
            elif n:
                h = graphs.run(packed, picked, n)
            else:
                h = self.model(columns(packed, p.tokens, p.window), rows=picked)
            if p.cache == "write":
                self.cache.advance(p.tokens)
            if p.save is not None:
                saves.append((p.save, self.cache.snapshot()))
            hidden[at:at + len(p.rows)] = h[:len(p.rows)]
            at += len(p.rows)
        label_rows, src, roots = (self._staging.put(np.array(a, np.int32))
                                  for a in (label_rows, src, roots))
        n, at = layout.n_logits, _lse_offset(layout)  # n = len(src)
        logits = self.model.head(hidden, label_rows).view(-1)
        torch.index_select(logits, 0, src, out=self._out[:n])
        self.model.logsumexp(torch.index_select(hidden, 0, roots),
                             out=self._out[at:at + len(roots)])


def _lse_offset(layout: Layout) -> int:
    """Where a call's logsumexps begin in its output buffer: after its logits, aligned."""
    return aligned(layout.n_logits)


def _head_indices(layout: Layout, stride: int = 0) -> tuple[list[int], list[int], list[int]]:
    """The call's label rows (distinct, sorted); the flat index of each logit the call
    reads in the [outputs, stride] logits (stride: the number of label rows unless
    given); the outputs at an answer position (whose logsumexps it reads, in order)."""
    outs = layout.outputs
    label_rows = sorted({t for o in outs for t in o.allowed})
    col = {t: i for i, t in enumerate(label_rows)}
    stride = stride or len(label_rows)
    src = [a * stride + col[t] for a, o in enumerate(outs) for t in o.allowed]
    return label_rows, src, [a for a, o in enumerate(outs) if o.lse_at >= 0]


def _results(jobs: Sequence[ScoreJob], layout: Layout, logits: np.ndarray,
             lse: np.ndarray) -> list[JobResult]:
    """Each output's logits as a view of the call's own array (read back fresh each call)."""
    results: list[list[list[NodeLogits]]] = [[[] for _ in j.branches] for j in jobs]
    lse = lse.tolist()
    for o in layout.outputs:
        row = logits[o.at : o.at + len(o.allowed)]
        results[o.job][o.branch].append(
            NodeLogits(o.path, o.allowed, row, lse[o.lse_at] if o.lse_at >= 0 else None))
    return [JobResult(tuple(nodes) for nodes in branches) for branches in results]


def _summary(gg: GGUFModel) -> str:
    dense = {"float32": "F32", "float16": "F16"}
    types = sorted({getattr(w, "source", None) or dense[str(w.dtype)] for w in gg.tensors.values()})
    params = sum(int(np.prod(w.shape)) for w in gg.tensors.values())
    source = "GGUF" if gg.path.suffix == ".gguf" else "checkpoint"
    return f"{'/'.join(types)} {source} (packed), {params / 1e6:.0f}M params"
