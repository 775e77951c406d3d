"""llama.cpp's tokenizer alone (a vocab-only model load), so every engine that reads a
GGUF produces the ids the llama engine does. llama.cpp is imported only when the file
holds a tokenizer: the tiny test models hold none, and need no llama.cpp.

A Hugging Face checkpoint directory's tokenizer.json is read with the `tokenizers`
package instead, to the same contract: no BOS added; special tokens spelled in the text
parsed only when asked (the prompt template's markers), user text always plain text."""

from __future__ import annotations

from pathlib import Path

from decider.errors import EngineFailure


class Vocab:
    def __init__(self, path: str | Path, present: bool) -> None:
        """present: whether the GGUF holds a tokenizer (tokenizer.ggml.model), or the
        checkpoint directory a tokenizer.json."""
        self.path = path
        self._model = self._hf = self._hf_plain = None
        if not present:
            return
        if Path(path).is_dir():
            from tokenizers import Tokenizer

            try:
                self._hf = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
            except Exception as e:  # tokenizers raises plain Exceptions
                raise EngineFailure(f"could not read {path}/tokenizer.json: {e}",
                                    model_path=path) from e
            self._hf_plain = Tokenizer.from_str(self._hf.to_str())
            self._hf_plain.encode_special_tokens = True  # a per-tokenizer switch, not per call
            return
        from .llama_lib import captured_log, ll, load_model, tokenizer_of  # initialises it

        params = ll.llama_model_default_params()
        params.vocab_only = True
        with captured_log() as lines:
            self._model = load_model(path, params, lines, "the tokenizer of ")
        self._llama = tokenizer_of(self._model)

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        if self._hf is not None:  # no BOS; special: added special tokens match as such
            hf = self._hf if special else self._hf_plain
            return hf.encode(text, add_special_tokens=False).ids
        if self._model is None:
            raise EngineFailure(f"{self.path} holds no tokenizer")
        return self._llama(text, special)

    def close(self) -> None:
        if self._model:
            from .llama_lib import ll

            ll.llama_model_free(self._model)
            self._model = None
