"""llama.cpp itself, for the engine and the vocabulary: the library initialised once, its
log captured while a model or context is made (what it allocated, why it refused a file),
and its tokenizer."""

from __future__ import annotations

import ctypes
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

import llama_cpp as ll

from decider.errors import EngineFailure

from .pieces import PieceTokenizer

# llama.cpp logs through one process-wide callback; model and context creation are
# captured to read back what the context really allocated (KV cells, sizes).
_capture_lock = threading.Lock()
_captured: list[str] | None = None


@ll.llama_log_callback
def _on_llama_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    if _captured is not None:
        _captured.append(text.decode("utf-8", "replace"))


ll.llama_log_set(_on_llama_log, ctypes.c_void_p(0))
ll.llama_backend_init()

_KV_LINE = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers")


def load_model(path, params, lines: list[str], what: str = ""):
    """llama_model_load_from_file, inside captured_log (`lines`): a refusal raises with
    the reason llama.cpp logged."""
    model = ll.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise EngineFailure(f"llama.cpp could not load {what}{path}: {load_error(lines)}",
                            model_path=path)
    return model


def tokenize_with(vocab, text: str, special: bool = False) -> list[int]:
    """Token ids of `text` in a llama.cpp vocabulary, no BOS added. special: control
    tokens spelled in the text are parsed (the prompt template's markers); otherwise the
    text stays text, even where llama.cpp would match a token that is both user-defined
    and control (Gemma 3's `</s>`): that spelling is split after its first
    character, so no control token comes out of user text."""
    data = text.encode("utf-8")
    buf = (ll.llama_token * (len(data) + 8))()
    n = ll.llama_tokenize(vocab, data, len(data), buf, len(buf), False, special)
    if n < 0:  # cannot happen with one slot per byte, but never read past the buffer
        raise EngineFailure(f"tokenizer needed {-n} slots for {len(data)} bytes")
    ids = buf[:n]
    if special:
        return ids
    control = next((i for i in ids
                    if ll.llama_vocab_get_attr(vocab, i) & ll.LLAMA_TOKEN_ATTR_CONTROL), None)
    if control is None:
        return ids
    at = text.find(ll.llama_vocab_get_text(vocab, control).decode("utf-8", "replace")) + 1
    if not 0 < at < len(text):  # a spelling llama.cpp stores otherwise: nothing to split
        return ids
    return tokenize_with(vocab, text[:at]) + tokenize_with(vocab, text[at:])


def tokenizer_of(model) -> Callable[..., list[int]]:
    """tokenize(text, special=False) in a llama.cpp model's vocabulary, as `tokenize_with`:
    the plain text of a SentencePiece vocabulary piece by piece, cached (pieces.py), unless
    llama.cpp puts a space before the text (add_space_prefix, on where a file does not
    say): then each piece would get one."""
    vocab = ll.llama_model_get_vocab(model)
    whole = partial(tokenize_with, vocab)
    flag = ctypes.create_string_buffer(8)
    ll.llama_model_meta_val_str(model, b"tokenizer.ggml.add_space_prefix", flag, len(flag))
    if ll.llama_vocab_type(vocab) != ll.LLAMA_VOCAB_TYPE_SPM or flag.value != b"false":
        return whole
    plain = PieceTokenizer(whole, (ll.llama_vocab_get_text(vocab, i).decode("utf-8", "replace")
                                   for i in range(ll.llama_vocab_n_tokens(vocab))))

    def tokenize(text: str, special: bool = False) -> list[int]:
        return whole(text, True) if special else plain(text)
    return tokenize


def seq_state(ctx, seq: int, flags: int = 0, size: int | None = None) -> bytearray | None:
    """A copy of sequence `seq`'s cells (llama_state_seq_get_data); None if it failed.
    size: its llama_state_seq_get_size, where the caller has it already."""
    size = size or ll.llama_state_seq_get_size_ext(ctx, seq, flags)
    state = bytearray(size)
    buf = (ctypes.c_uint8 * size).from_buffer(state)
    return state if ll.llama_state_seq_get_data_ext(ctx, buf, size, seq, flags) == size else None


def set_seq_state(ctx, state: bytearray, seq: int, flags: int = 0) -> bool:
    """`state` placed as sequence `seq` (llama_state_seq_set_data): whether it was."""
    buf = (ctypes.c_uint8 * len(state)).from_buffer(state)
    return ll.llama_state_seq_set_data_ext(ctx, buf, len(state), seq, flags) == len(state)


@contextmanager
def captured_log() -> Iterator[list[str]]:
    global _captured
    with _capture_lock:
        _captured = lines = []
        try:
            yield lines
        finally:
            _captured = None


def load_error(lines: list[str] | None) -> str:
    """Why llama.cpp refused a file, from what it logged while loading: its error lines."""
    lines = [line.strip() for line in lines or () if line.strip()]
    errors = [line for line in lines if "error" in line or "failed" in line]
    return "; ".join(errors[-3:] or lines[-1:]) or "llama.cpp logged no reason"


def kv_caches(lines: list[str]) -> list[tuple[int, int, int]]:
    """(bytes, cells, layers) of each KV cache llama.cpp allocated: full, then sliding."""
    return [
        (int(float(m[1]) * 2**20), int(m[2]), int(m[3])) for m in _KV_LINE.finditer("".join(lines))
    ]
