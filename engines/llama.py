"""llama.cpp engine: label logits through llama-cpp-python's low-level API.

One job = one text, laid out by llama_layout.py: its prefix decoded once, alone, as
sequence 0; then each question in decodes of its own (so that no answer depends on the
other questions), its branches either as sequences of their own sharing the prefix cells
of a unified KV cache (several branches and label paths per decode, each suffix decoded
once), or, when the prefix is too long for the bounded sliding-window cache to share,
appended to sequence 0 and rolled back, the prefix's last window held by a guard
sequence meanwhile.

With a prefix cache (prefix_cache.py), sequence 0's state is saved after the prefix's
last multiple of n_batch and after its end (llama.cpp's state_seq_get_data), and a later
job starts from the longest saved state of its prefix (state_seq_set_data into the
cleared cache), decoding only the rest in the chunks a whole read would use: its logits
are bit-equal to a fresh read's (tests/test_prefix_cache.py).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import llama_cpp as ll
import numpy as np
import structlog

from decider.chat_template import llama_template
from decider.errors import ConfigError, EngineFailure, EngineOutOfMemory

from .base import (
    DECODE_TOKENS,
    OUTPUT_TOKENS,
    SENTINEL,
    EngineInfo,
    JobResult,
    NodeLogits,
    ScoreJob,
    Stop,
    Tokens,
    check_windows,
    label_trie,
    resolve_n_ctx,
)
from .faults import begin_pass
from .llama_layout import (
    PREFIX_SEQ,
    Copy,
    Decode,
    Entry,
    Remove,
    Repack,
    Save,
    job_steps,
)
from .llama_lib import (
    captured_log,
    kv_caches,
    load_model,
    seq_state,
    set_seq_state,
    tokenizer_of,
)
from .llama_rows import OutputRows, logsumexp
from .prefix_cache import PrefixCache, host_budget, saved_lengths

log = structlog.get_logger("decider.engines.llama")


class LlamaEngine:
    name = "llama"

    def __init__(
        self,
        model_path: str | Path,
        n_ctx: int | None = None,
        *,
        model_name: str = "",
        n_parallel: int = 8,  # label paths a decode: 4, 8, 16 measured (docs/design.md)
        n_batch: int = 512,
        n_threads: int | None = None,
        n_gpu_layers: int = 0,
        flash_attn: bool | None = None,
        repack: bool = False,
        prefix_cache_bytes: int | None = 0,  # saved prefix states, bytes; 0: none, None: host's
    ) -> None:
        if not 1 <= n_parallel < 256:
            raise ConfigError(f"n_parallel must be in [1, 255], got {n_parallel}")
        path = Path(model_path)
        self._lock = threading.Lock()  # a llama context is not thread-safe
        self._model = self._ctx = self._batch = None
        self.prefix_cache = None if prefix_cache_bytes == 0 else \
            PrefixCache(prefix_cache_bytes or host_budget())
        try:
            with captured_log() as lines:
                n_ctx = self._load(lines, path, n_ctx, n_parallel, n_batch, n_threads,
                                   n_gpu_layers, flash_attn, repack)
        except BaseException:
            self.close()
            raise
        self.kv_caches = kv_caches(lines)  # what the context really allocated
        log.info("kv caches", model=path.name, caches=[  # full attention, then sliding
            {"MiB": round(b / 2**20, 2), "cells": c, "layers": n} for b, c, n in self.kv_caches])
        self._n_swa = ll.llama_model_n_swa(self._model)
        self.room = self._cache_room()  # cells the shared layout may fill
        self._mem = ll.llama_get_memory(self._ctx)
        self._n_batch = n_batch
        self._n_parallel = n_parallel
        self._n_vocab = ll.llama_vocab_n_tokens(self._vocab)
        self._rows = OutputRows(self._ctx, self._n_vocab)
        self._batch = ll.llama_batch_init(n_batch, 0, 1 + n_parallel)
        desc = ctypes.create_string_buffer(256)
        ll.llama_model_desc(self._model, desc, len(desc))
        self.info = EngineInfo(
            model_name=model_name or path.stem,
            model_path=str(path),
            n_ctx=n_ctx,
            n_ctx_train=ll.llama_model_n_ctx_train(self._model),
            n_vocab=self._n_vocab,
            bos_id=ll.llama_vocab_bos(self._vocab),
            add_bos=ll.llama_vocab_get_add_bos(self._vocab),
            weights=f"{desc.value.decode()} GGUF, {ll.llama_model_n_params(self._model)} params",
            memory={
                "weights": ll.llama_model_size(self._model),
                "kv": sum(size for size, _, _ in self.kv_caches),
            },
            sentinel=SENTINEL,
            chat_template=llama_template(self._model),
        )

    def _load(self, lines, path, n_ctx, n_parallel, n_batch, n_threads, n_gpu_layers,
              flash_attn, repack) -> int:
        mparams = ll.llama_model_default_params()
        mparams.n_gpu_layers = n_gpu_layers
        # Repacked CPU weights (llama.cpp's extra buffer types) make logits depend on how
        # many tokens share a batch (0.12 on label logits of gemma-3-270m) and were slower
        # here past a few hundred tokens. Flash attention does too once a batch passes 64
        # tokens (up to 0.2), but saves ~12%, so llama.cpp's default (on) stays.
        mparams.use_extra_bufts = repack
        self._model = load_model(path, mparams, lines)
        self._vocab = ll.llama_model_get_vocab(self._model)
        self._tokenize = tokenizer_of(self._model)
        n_ctx_train = ll.llama_model_n_ctx_train(self._model)
        n_ctx = resolve_n_ctx(n_ctx, n_ctx_train)
        cparams = ll.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = cparams.n_ubatch = n_batch
        cparams.n_seq_max = 1 + n_parallel  # sequence 0 + a group's label paths
        cparams.kv_unified = True  # branch sequences share the prefix cells
        cparams.swa_full = False  # sliding layers keep only their window
        cparams.no_perf = True
        if flash_attn is not None:
            cparams.flash_attn_type = int(flash_attn)
        cparams.n_threads = cparams.n_threads_batch = n_threads or os.cpu_count() or 1
        self._ctx = ll.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            raise EngineOutOfMemory(f"llama.cpp could not create a context of n_ctx={n_ctx}")
        return n_ctx

    def _cache_room(self) -> int:
        """The cells every cache of the context holds, as llama.cpp reports allocating
        them. With swa_full off the sliding cache holds n_swa cells per sequence plus one
        ubatch, not the whole context (Llama(...) would silently drop a misspelled flag);
        the alone layout needs two windows and a ubatch of it."""
        cells = [c for _, c, _ in self.kv_caches] or [ll.llama_n_ctx(self._ctx)]
        if not self._n_swa or len(cells) != 2:
            return min(cells)
        full, swa = cells
        ubatch = ll.llama_n_ubatch(self._ctx)
        bounded = self._n_swa * ll.llama_n_seq_max(self._ctx) + ubatch
        if swa > max(bounded, 256) + 255:
            raise EngineFailure(f"llama.cpp allocated {swa} sliding-window cells (full "
                                f"cache: {full}); swa_full must be off")
        if swa < min(full, 2 * self._n_swa + ubatch):
            raise EngineFailure(f"llama.cpp allocated {swa} sliding-window cells; a prompt "
                                f"past the window needs {2 * self._n_swa + ubatch}")
        return min(full, swa)

    # -- Engine protocol -------------------------------------------------------------

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        return self._tokenize(text, special)

    def work_tokens(self, job: ScoreJob) -> int:
        """The tokens and rows of logits of the job's decodes, and each decode's fixed
        cost. A decode longer than n_batch runs as several llama_decode calls: the fixed
        cost of those past the first (DECODE_TOKENS in n_batch tokens) is left out. The
        whole prefix counts: the bound holds when the prefix cache misses."""
        tries = [label_trie(b.candidates) for b in job.branches]
        steps = job_steps(job, tries, self._n_parallel, self.room, self._n_swa)
        decodes = [s.entries for s in steps if isinstance(s, Decode)]
        return sum(len(entries) + DECODE_TOKENS
                   + OUTPUT_TOKENS * sum(e.out is not None for e in entries)
                   for entries in decodes)

    def warm_up(self, max_batch: int) -> None:
        """Nothing to run: llama.cpp builds each call's compute graph as it goes and
        compiles no shape ahead."""

    def score(self, jobs: Sequence[ScoreJob], stop: Stop | None = None
              ) -> list[JobResult | Exception]:
        check_windows(jobs, self.info.n_ctx)
        results: list[JobResult | Exception] = []
        with self._lock:
            fault = begin_pass("llama.cpp")
            for i, job in enumerate(jobs):
                try:
                    results.append(self._score_job(job, fault, stop and partial(stop, i)))
                except _Stopped as s:
                    results.append(s.error)
        return results

    def close(self) -> None:
        if getattr(self, "_batch", None) is not None:
            ll.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            ll.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            ll.llama_model_free(self._model)
            self._model = None

    # -- one job ---------------------------------------------------------------------

    def _score_job(self, job: ScoreJob, fault: str | None,
                   stop: Callable[[], Exception | None] | None) -> JobResult:
        ll.llama_memory_clear(self._mem, True)
        start = self._restore(job.prefix)
        tries = [label_trie(b.candidates) for b in job.branches]
        nodes: list[dict[Tokens, NodeLogits]] = [{} for _ in job.branches]
        stride = self._n_batch if self.prefix_cache else 0
        for step in job_steps(job, tries, self._n_parallel, self.room, self._n_swa, start,
                              stride):
            if isinstance(step, Decode):
                for (bi, path), node in self._decode(step.entries, fault, tries,
                                                     stop).items():
                    nodes[bi].setdefault(path, node)
            elif isinstance(step, Copy):
                ll.llama_memory_seq_cp(self._mem, step.src, step.dst, step.p0, step.p1)
            elif isinstance(step, Remove):
                ll.llama_memory_seq_rm(self._mem, step.seq, step.p0, step.p1)
            elif isinstance(step, Repack):
                self._repack(step)
            elif isinstance(step, Save) and fault is None:  # never keep a faulted pass
                self._save(job.prefix[: step.n])
        return JobResult((tuple(n[p] for p in sorted(n, key=len)) for n in nodes), start)

    def _restore(self, prefix: Tokens) -> int:
        """Sequence 0 set to the longest saved state of the prefix, into the cleared cache;
        the tokens it holds (0: none saved, or no cache). A state of part of the prefix
        serves only a prefix within `room`: a longer one reuses sliding-window cells as
        it is decoded, in an order that moves with where it started (its logits moved by
        up to 0.017 on a tiny model), so it is read whole or not at all."""
        if self.prefix_cache is None:
            return 0
        lengths = saved_lengths(prefix, self._n_batch) if len(prefix) <= self.room \
            else [len(prefix)]
        n, state = self.prefix_cache.longest(prefix, lengths)
        if state is None:
            return 0
        if not set_seq_state(self._ctx, state, PREFIX_SEQ):
            ll.llama_memory_clear(self._mem, True)  # what it placed, if anything, goes
            raise EngineFailure("llama.cpp could not restore a saved prefix state")
        return n

    def _save(self, tokens: Tokens) -> None:
        """Sequence 0's state, which holds exactly `tokens`, kept in the prefix cache."""
        size = ll.llama_state_seq_get_size_ext(self._ctx, PREFIX_SEQ, 0)
        if self.prefix_cache.wants(tokens, size) and (
                state := seq_state(self._ctx, PREFIX_SEQ, size=size)) is not None:
            self.prefix_cache.put(tokens, state, size)

    def _repack(self, step: Repack) -> None:
        """llama.cpp's sliding-window-only state of step.src, saved, then restored into
        step.dst: restoring first drops dst from every sliding cell (the full-attention
        cache keeps it), then places the saved cells in one block from the first free one."""
        state = seq_state(self._ctx, step.src, ll.LLAMA_STATE_SEQ_FLAGS_SWA_ONLY)
        ll.llama_memory_seq_rm(self._mem, step.src, -1, -1)
        if state is None or not set_seq_state(self._ctx, state, step.dst,
                                              ll.LLAMA_STATE_SEQ_FLAGS_SWA_ONLY):
            raise EngineFailure("llama.cpp could not repack its sliding-window cache")

    # -- llama_decode ----------------------------------------------------------------

    def _decode(self, entries: Sequence[Entry], fault: str | None,
                tries: list[dict[Tokens, Tokens]],
                stop: Callable[[], Exception | None] | None) -> dict:
        """Feed entries in n_batch chunks; read each output right after its chunk."""
        read: dict[tuple[int, Tokens], NodeLogits] = {}
        batch = self._batch
        for start in range(0, len(entries), self._n_batch):
            if stop is not None and (error := stop()) is not None:
                raise _Stopped(error)
            chunk = entries[start : start + self._n_batch]
            outputs = []
            for i, e in enumerate(chunk):
                batch.token[i] = e.token
                batch.pos[i] = e.pos
                batch.n_seq_id[i] = len(e.seqs)
                for j, s in enumerate(e.seqs):
                    batch.seq_id[i][j] = s
                batch.logits[i] = e.out is not None
                if e.out is not None:
                    outputs.append((i, e.out))
            batch.n_tokens = len(chunk)
            if fault != "stale-logits":
                self._rows.poison()
            if fault not in ("skip-decode", "zero-logits", "stale-logits"):
                rc = ll.llama_decode(self._ctx, batch)
                if rc == 1:
                    raise EngineOutOfMemory("llama.cpp found no room in the KV cache")
                if rc != 0:
                    raise EngineFailure(f"llama_decode failed with code {rc}", code=rc)
            stale_rows = self._rows.written if fault == "stale-logits" else 0
            self._rows.written = len(outputs)
            for j, (i, (bi, path)) in enumerate(outputs):
                allowed = tries[bi][path]
                row = self._rows.previous(j) if j < stale_rows else self._rows.row(i)
                if fault == "zero-logits":
                    row = np.zeros(self._n_vocab, dtype=np.float32)
                read[(bi, path)] = NodeLogits(path, allowed, row[list(allowed)].copy(),
                                              logsumexp(row) if path == () else None)
        return read


class _Stopped(Exception):
    """The caller's stop ended a job between chunks; `error` is the job's result."""

    def __init__(self, error: Exception) -> None:
        self.error = error
