"""llama.cpp's tokenizer alone (a vocab-only model load), so every engine that reads a
GGUF produces the ids the llama engine does."""

from __future__ import annotations

from pathlib import Path

import llama_cpp as ll

from decider.errors import EngineFailure

from . import llama  # noqa: F401  (initialises llama.cpp and routes its log lines away)


class Vocab:
    def __init__(self, path: str | Path) -> None:
        params = ll.llama_model_default_params()
        params.vocab_only = True
        self._model = ll.llama_model_load_from_file(str(path).encode(), params)
        if not self._model:
            raise EngineFailure(f"llama.cpp could not load the tokenizer of {path}",
                                model_path=path)
        self._vocab = ll.llama_model_get_vocab(self._model)

    def tokenize(self, text: str) -> list[int]:
        """No BOS added, special tokens parsed (as LlamaEngine.tokenize)."""
        data = text.encode("utf-8")
        buf = (ll.llama_token * (len(data) + 8))()
        n = ll.llama_tokenize(self._vocab, data, len(data), buf, len(buf), False, True)
        if n < 0:
            raise EngineFailure(f"tokenizer needed {-n} slots for {len(data)} bytes")
        return buf[:n]

    def close(self) -> None:
        if self._model:
            ll.llama_model_free(self._model)
            self._model = None
