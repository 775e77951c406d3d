"""The "chat-template" prompt format: decider's layout inside the model's own chat template.

The template (a GGUF's tokenizer.chat_template; a checkpoint directory's
chat_template.jinja or tokenizer_config.json's chat_template) is rendered as Hugging
Face's apply_chat_template and llama-cpp-python render it, around one user message whose
content is a placeholder, with the generation prompt: what comes before the placeholder
(the turn's opening, a default system prompt) is the format's head, what follows it (the
turn's end, the assistant's opening) its tail. Head and tail are the template's own and
are tokenized with special tokens parsed; the user turn's content is decider's usual
prefix (instructions, text) and question, plain text. The answer is the first token of
the assistant turn; what the template writes after an assistant message (rendered with
one) ends it. The template's text never passes through str.format: braces stay braces.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .engines.base import ChatTemplate
from .errors import ConfigError
from .prompts import (
    CHAT_TEMPLATE,
    FORMATS,
    TEMPLATE_VERSION,
    Piece,
    PromptFormat,
    prompt_text,
)

Tokenize = Callable[..., list[int]]  # (text, special=False): the model's tokenizer

_CONTENT = "DeciderContentPlaceholder7q2x"  # a user message's content while rendering
_REPLY = "DeciderReplyPlaceholder4k9w"  # an assistant message's
# Where the prefix (shared by every question about a text) ends inside the blank line
# before the question. Tokenizers cut a run of newlines differently: a GPT-2-style
# pre-tokenizer (SmolLM2's) leaves the last newline before a word on its own, Llama 3's
# keeps "\n\n" whole; the first cut at which the prompt tokenized piece by piece keeps
# the whole prompt's ids is taken.
_CUTS = (2, 1)
_PROBE_TEXTS = ("a few words", "ends in a space ", "ends in a newline\n")
_PROBE_BODY = "Question: Is it so? (yes or no)"


@dataclass(frozen=True, slots=True)
class ChatTemplateFormat(PromptFormat):
    head: str  # the template's, before the user turn's content
    tail: str  # the template's, after it: the end of the turn, the assistant's opening
    template_sha256: str

    @property
    def version(self) -> str:
        """The template's sha256 is part of it: another template, other answers."""
        return f"{TEMPLATE_VERSION}+chat-template:{self.template_sha256}"

    def render_prefix(self, text: str, instructions: str) -> tuple[Piece, ...]:
        head = ((self.head, True),) if self.head else ()
        return (*head, *PromptFormat.render_prefix(self, text, instructions))

    def render_suffix(self, body: str) -> tuple[Piece, ...]:
        return (*PromptFormat.render_suffix(self, body), (self.tail, True))

    def render_end(self) -> tuple[Piece, ...]:
        return ((self.answer_end, True),)


def prompt_format(name: str, template: ChatTemplate | None = None,
                  tokenize: Tokenize | None = None) -> PromptFormat:
    """The format called `name`: a hand-written one, or "chat-template", built from the
    model's own template (EngineInfo.chat_template) and tokenizer (engine.tokenize)."""
    return FORMATS[name] if name != CHAT_TEMPLATE else chat_format(template, tokenize)


def chat_format(template: ChatTemplate | None, tokenize: Tokenize) -> ChatTemplateFormat:
    """The format of a model whose chat template is `template`, for its tokenizer."""
    if template is None:
        raise ConfigError(f"prompt_format {CHAT_TEMPLATE!r} needs a model that carries a chat "
                          "template (a GGUF's tokenizer.chat_template, a checkpoint's "
                          "tokenizer_config.json); this one has none: use plain, gemma-chat "
                          "or gemma4-chat")
    turn = render(template, [{"role": "user", "content": _CONTENT}], generation=True)
    if turn.count(_CONTENT) != 1:
        raise ConfigError("the model's chat template does not place a user message's content "
                          "once, as it was given")
    head, tail = turn.split(_CONTENT)
    if not tail.strip():
        raise ConfigError("the model's chat template opens no assistant turn "
                          "(add_generation_prompt): there is no answer position")
    digest = hashlib.sha256(template.source.encode()).hexdigest()
    end = _answer_end(template)
    layouts = [ChatTemplateFormat(CHAT_TEMPLATE, "{instructions}Text: {text}" + "\n\n"[:cut],
                                  "\n\n"[cut:] + "{body}", False, end, head, tail, digest)
               for cut in _CUTS]
    return next((fmt for fmt in layouts if _keeps_ids(fmt, tokenize)), layouts[0])


def _answer_end(template: ChatTemplate) -> str:
    """What the template writes after an assistant message, up to its trailing whitespace
    (the end-of-turn marker); the EOS token's text where it writes nothing."""
    chat = render(template, [{"role": "user", "content": _CONTENT},
                             {"role": "assistant", "content": _REPLY}], generation=False)
    if chat.count(_REPLY) != 1:
        raise ConfigError("the model's chat template does not place an assistant message's "
                          "content once, as it was given")
    end = chat.split(_REPLY)[1].rstrip() or template.eos_token
    if not end:
        raise ConfigError("the model's chat template ends an assistant message with nothing, "
                          "and the model names no EOS token")
    return end


def _keeps_ids(fmt: ChatTemplateFormat, tokenize: Tokenize) -> bool:
    """Whether a prompt tokenized piece by piece, as plan.py does (the template's parts
    with special tokens parsed, the content as plain text; the prefix apart from the
    question), gives the ids of the whole prompt tokenized at once."""
    for text in _PROBE_TEXTS:
        pieces = (*fmt.render_prefix(text, ""), *fmt.render_suffix(_PROBE_BODY))
        split = [t for part, marker in pieces for t in tokenize(part, special=marker)]
        if split != list(tokenize(prompt_text(pieces), special=True)):
            return False
    return True


def render(template: ChatTemplate, messages: list[dict[str, str]], generation: bool) -> str:
    """The template rendered as Hugging Face and llama-cpp-python render it: sandboxed,
    trim_blocks and lstrip_blocks, loop controls, raise_exception, the BOS and EOS texts.
    No strftime_now: a date in the prompt would move answers from day to day (templates
    that use it test whether it is defined)."""
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template.source).render(
            messages=messages, add_generation_prompt=generation,
            bos_token=template.bos_token, eos_token=template.eos_token)
    except Exception as e:  # the template is the model file's code: any failure refuses it
        raise ConfigError(f"the model's chat template does not render: "
                          f"{type(e).__name__}: {e}") from e


def llama_template(model) -> ChatTemplate | None:
    """The chat template of a model llama.cpp loaded (vocab-only too), if it has one."""
    import llama_cpp as ll

    source = ll.llama_model_chat_template(model, None)
    if not source:
        return None
    vocab = ll.llama_model_get_vocab(model)

    def text(token: int) -> str:
        return ll.llama_vocab_get_text(vocab, token).decode("utf-8", "replace") \
            if token >= 0 else ""
    return ChatTemplate(source.decode("utf-8"), text(ll.llama_vocab_bos(vocab)),
                        text(ll.llama_vocab_eos(vocab)))


def stored_template(path: str | Path, meta: Mapping[str, object]) -> ChatTemplate | None:
    """The chat template a model file carries, for the engines that do not load it with
    llama.cpp: a checkpoint directory's, or a GGUF's (meta: its metadata as read; the
    file is opened vocab-only for the token texts only where meta holds a template)."""
    path = Path(path)
    if path.is_dir():
        return _checkpoint_template(path)
    if "tokenizer.chat_template" not in meta:
        return None
    from .engines.llama_lib import captured_log, ll, load_model

    params = ll.llama_model_default_params()
    params.vocab_only = True
    with captured_log() as lines:
        model = load_model(path, params, lines, "the tokenizer of ")
    try:
        return llama_template(model)
    finally:
        ll.llama_model_free(model)


def _checkpoint_template(directory: Path) -> ChatTemplate | None:
    """chat_template.jinja (newer checkpoints) or tokenizer_config.json's chat_template
    (a string, or named templates: the default one), with that file's token texts."""
    config_file, jinja = directory / "tokenizer_config.json", directory / "chat_template.jinja"
    config = json.loads(config_file.read_text("utf-8")) if config_file.is_file() else {}
    source = jinja.read_text("utf-8") if jinja.is_file() else config.get("chat_template")
    if isinstance(source, list):
        source = next((t.get("template") for t in source if t.get("name") == "default"), None)
    if not source:
        return None

    def text(token: object) -> str:  # "<bos>", or {"content": "<bos>", ...}
        return str(token.get("content", "")) if isinstance(token, dict) else str(token or "")
    return ChatTemplate(source, text(config.get("bos_token")), text(config.get("eos_token")))
