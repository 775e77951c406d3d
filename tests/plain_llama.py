"""llama-cpp-python's own Llama class set up as the llama engine sets up its context, for
the tests that hold the engine against plain one-sequence decodes: every position's
logits of one sequence, no shared prefix, no token tree."""

from __future__ import annotations

from unittest.mock import patch

import numpy as np


def plain_llama(model_path, n_ctx: int = 4096, n_batch: int = 512, flash_attn: bool = True):
    import llama_cpp.llama_cpp as lowlevel  # the module Llama calls
    from llama_cpp import Llama

    defaults = lowlevel.llama_model_default_params

    def as_the_engine():  # plain weight layout, as the engine loads it
        params = defaults()
        params.use_extra_bufts = False
        return params

    with patch.object(lowlevel, "llama_model_default_params", as_the_engine):
        return Llama(str(model_path), n_ctx=n_ctx, n_batch=n_batch, logits_all=True,
                     swa_full=False, flash_attn=flash_attn, verbose=False)


def plain_rows(llm, *pieces) -> np.ndarray:
    """Logits at every position of the pieces, decoded one after another into a fresh
    sequence, each piece its own batch (cut into n_batch chunks)."""
    llm.reset()
    for piece in pieces:
        if piece:
            llm.eval(list(piece))
    return np.array(llm.scores[: sum(map(len, pieces))])


class PlainContext:
    """One sequence decoded piece by piece through llama-cpp-python's low-level API, in a
    context made as the engine makes its own (the same cache sizes, so the same cells)."""

    def __init__(self, model_path, n_ctx: int, n_batch: int, n_seq_max: int,
                 flash_attn: bool = True) -> None:
        import llama_cpp as ll

        self.ll = ll
        mp = ll.llama_model_default_params()
        mp.use_extra_bufts = False
        self.model = ll.llama_model_load_from_file(str(model_path).encode(), mp)
        cp = ll.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n_ctx, n_batch, n_batch, n_seq_max
        cp.kv_unified, cp.swa_full, cp.flash_attn_type = True, False, int(flash_attn)
        self.ctx = ll.llama_init_from_model(self.model, cp)
        self.n_batch = n_batch
        self.n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(self.model))
        self.batch = ll.llama_batch_init(n_batch, 0, 1)

    def rows(self, *pieces) -> np.ndarray:
        """Logits at every position of the pieces, each piece its own decodes, in a fresh
        sequence."""
        self.ll.llama_memory_clear(self.ll.llama_get_memory(self.ctx), True)
        out, pos = [], 0
        for piece in pieces:
            out += list(self._decode(piece, pos, outputs=True))
            pos += len(piece)
        return np.array(out)

    def _decode(self, tokens, pos0: int, outputs: bool) -> np.ndarray:
        ll, b = self.ll, self.batch
        out = []
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            for i, t in enumerate(chunk):
                b.token[i], b.pos[i], b.n_seq_id[i] = t, pos0 + start + i, 1
                b.seq_id[i][0], b.logits[i] = 0, outputs
            b.n_tokens = len(chunk)
            if ll.llama_decode(self.ctx, b) != 0:
                raise RuntimeError("llama_decode failed")
            if outputs:
                out += [np.ctypeslib.as_array(ll.llama_get_logits_ith(self.ctx, i),
                                              (self.n_vocab,)).copy() for i in range(len(chunk))]
        return np.array(out)

    def start(self, prefix) -> None:
        """A fresh sequence holding `prefix`, no outputs read."""
        self.ll.llama_memory_clear(self.ll.llama_get_memory(self.ctx), True)
        self.extend(prefix, 0)

    def extend(self, tokens, start: int) -> None:
        """Append tokens at positions start.. to the sequence, no outputs read."""
        self._decode(tokens, start, outputs=False)

    def probe(self, at: int, piece, window: int) -> np.ndarray:
        """The rows of `piece` decoded after the first `at` positions, then rolled back.
        Safe under a bounded sliding-window cache because the piece is one decode: the
        cells it may reuse are those the window has left behind position `at`, which no
        later probe needs; checked after the roll-back."""
        if len(piece) > self.n_batch:
            raise ValueError(f"a probe is one decode: {len(piece)} > {self.n_batch} tokens")
        rows = self._decode(piece, at, outputs=True)
        mem = self.ll.llama_get_memory(self.ctx)
        self.ll.llama_memory_seq_rm(mem, 0, at, -1)
        assert self.ll.llama_memory_seq_pos_min(mem, 0) <= max(0, at - window + 1)
        return rows

    def close(self) -> None:
        self.ll.llama_batch_free(self.batch)
        self.ll.llama_free(self.ctx)
        self.ll.llama_model_free(self.model)
