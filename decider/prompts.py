"""Prompt formats: one shared prefix per text, one suffix per branch.

The prefix (BOS + instructions + text) is computed once for every question about the
text; each branch appends a short suffix that ends at the answer position (a question
type says what its suffixes ask: decider/questions/). Options are listed in a canonical
order (sorted by name) so an answer never depends on the order the labels were given in;
scale levels keep their order, which is their meaning.

A rendered prompt is a sequence of pieces: the template's own markers (every `<...>` in a
format's template strings, such as `<start_of_turn>`; in a format built from the model's
own chat template, all that template renders: decider/chat_template.py), tokenized with
special tokens parsed, and text, tokenized as plain text. Text is the template's words
and the user's fields together (text, instructions, questions, labels, descriptions), so
markup in a ticket stays text and never opens a turn.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

TEMPLATE_VERSION = "1"  # bump whenever any format's text changes: answers move with it
CHAT_TEMPLATE = "chat-template"  # the format built from the model's own chat template

YES, NO = "yes", "no"

_MARKER = re.compile(r"(<[^<>{}\s]+>)")  # split keeps the markers: odd items
Piece = tuple[str, bool]  # (text, whether it is a template marker)


class Named(Protocol):  # a label: its name, and what it means
    name: str
    description: str


@functools.cache
def _parts(template: str) -> tuple[tuple[str, bool], ...]:
    """A template split at its markers, once: the formats' few strings recur per request."""
    return tuple((part, bool(i % 2)) for i, part in enumerate(_MARKER.split(template)))


def fill(template: str, **fields: str) -> tuple[Piece, ...]:
    """`template` with its fields filled in, split at the template's markers only."""
    pieces = ((part if marker else part.format(**fields), marker)
              for part, marker in _parts(template))
    return tuple((text, marker) for text, marker in pieces if text)


def prompt_text(pieces: tuple[Piece, ...]) -> str:
    return "".join(text for text, _ in pieces)


@dataclass(frozen=True, slots=True)
class PromptFormat:
    name: str
    prefix: str  # with {instructions} and {text}
    suffix: str  # with {body}: the question and its options
    answer_space: bool  # the answer follows a space (" yes") rather than a line start
    answer_end: str  # what follows an answer; ends a label that prefixes another

    @property
    def version(self) -> str:
        """What answers carry as the template version (a calibration is tied to it)."""
        return TEMPLATE_VERSION

    def render_prefix(self, text: str, instructions: str) -> tuple[Piece, ...]:
        head = f"{instructions.strip()}\n\n" if instructions.strip() else ""
        return fill(self.prefix, instructions=head, text=text)

    def render_suffix(self, body: str) -> tuple[Piece, ...]:
        return fill(self.suffix, body=body)

    def render_end(self) -> tuple[Piece, ...]:
        return fill(self.answer_end)

    def surface_forms(self, name: str) -> list[str]:
        """The spellings pooled into one answer: as given, lower case, capitalised."""
        lead = " " if self.answer_space else ""
        forms = [name, name.lower(), name[:1].upper() + name[1:].lower()]
        return [lead + f for f in dict.fromkeys(forms)]


FORMATS = {
    # Base models: a plain Question/Answer layout keeps the answer in label space
    # (measured on gemma-3-270m: 44-63% of the probability on the labels, against
    # 0.1-2% with turn markup; "(yes or no)" on the question line beats a separate
    # instruction line, 55-70% against 28-44%).
    "plain": PromptFormat(
        name="plain",
        prefix="{instructions}Text: {text}\n\n",
        suffix="{body}\nAnswer:",
        answer_space=True,
        answer_end="\n",
    ),
    # Gemma instruction-tuned models: the answer is the first token of the model turn.
    "gemma-chat": PromptFormat(
        name="gemma-chat",
        prefix="<start_of_turn>user\n{instructions}Text: {text}\n\n",
        suffix="{body}<end_of_turn>\n<start_of_turn>model\n",
        answer_space=False,
        answer_end="<end_of_turn>",
    ),
    # Gemma 4 instruction-tuned models: their turns, then the empty thought block their
    # template adds with thinking off, so that the answer is the first token after it
    # (without the block the first token can be <|channel>, opening one).
    "gemma4-chat": PromptFormat(
        name="gemma4-chat",
        prefix="<|turn>user\n{instructions}Text: {text}\n\n",
        suffix="{body}<turn|>\n<|turn>model\n<|channel>thought\n<channel|>",
        answer_space=False,
        answer_end="<turn|>",
    ),
}


FORMAT_NAMES = (*FORMATS, CHAT_TEMPLATE)


@dataclass(frozen=True, slots=True)
class BranchPlan:
    suffix: tuple[Piece, ...]
    answers: tuple[str, ...]  # the names competing at this answer position


def describe(label: Named) -> str:
    return f"{label.name} ({label.description})" if label.description else label.name


def listing(labels: Iterable[Named]) -> str:
    """Options as a question's suffix lists them: inline, or one a line with descriptions."""
    labels = tuple(labels)
    if any(label.description for label in labels):
        return "".join(f"\n- {describe(label)}" for label in labels)
    return " " + ", ".join(label.name for label in labels)


def canonical(labels: Iterable[Named]) -> tuple:
    return tuple(sorted(labels, key=lambda label: (label.name.casefold(), label.name)))
