"""llama.cpp's tokenizer alone (a vocab-only model load), so every engine that reads a
GGUF produces the ids the llama engine does. llama.cpp is imported only when the file
holds a tokenizer: the tiny test models hold none, and need no llama.cpp."""

from __future__ import annotations

from pathlib import Path

from decider.errors import EngineFailure


class Vocab:
    def __init__(self, path: str | Path, present: bool) -> None:
        """present: whether the GGUF holds a tokenizer (tokenizer.ggml.model)."""
        self.path = path
        self._model = None
        if not present:
            return
        from .llama import ll  # initialises llama.cpp and routes its log lines away

        params = ll.llama_model_default_params()
        params.vocab_only = True
        self._model = ll.llama_model_load_from_file(str(path).encode(), params)
        if not self._model:
            raise EngineFailure(f"llama.cpp could not load the tokenizer of {path}",
                                model_path=path)
        self._vocab = ll.llama_model_get_vocab(self._model)

    def tokenize(self, text: str) -> list[int]:
        if self._model is None:
            raise EngineFailure(f"{self.path} holds no tokenizer")
        from .llama import tokenize_with

        return tokenize_with(self._vocab, text)

    def close(self) -> None:
        if self._model:
            from .llama import ll

            ll.llama_model_free(self._model)
            self._model = None
