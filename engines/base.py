"""The one seam between decider and its backends: jobs in, raw label logits out.

An engine does math only. It knows nothing of prompts, probabilities or gRPC; decider/
plans the tokens, guards the rows and turns them into answers.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from .prefix_cache import PrefixCache

Tokens = tuple[int, ...]

# The work measure (Engine.work_tokens) is engine time in tokens of a long decode. An
# engine that decodes step by step adds DECODE_TOKENS for each decode (its fixed cost:
# the call's set-up, the output head's weights read for its rows) and OUTPUT_TOKENS for
# each row of logits (a 262,144-row head on a 640-wide model costs about one token's
# layers). Measured with llama.cpp and gemma-3-270m on 2 CPU cores (docs/benchmarks.md).
DECODE_TOKENS = 6
OUTPUT_TOKENS = 1


@dataclass(frozen=True, slots=True)
class Branch:
    """One question's continuation of the shared prefix and its candidate labels."""

    suffix: Tokens  # question + answer cue
    candidates: tuple[Tokens, ...]  # label token sequences; none a prefix of another

    def __post_init__(self) -> None:
        if not self.suffix:
            raise ValueError("Branch.suffix must hold at least one token")
        if not self.candidates or any(not c for c in self.candidates):
            raise ValueError("Branch.candidates must be non-empty token sequences")

    def positions(self) -> int:
        """Tokens this branch places after the prefix (the last label token is never fed)."""
        return len(self.suffix) + max(len(c) for c in self.candidates) - 1


@dataclass(frozen=True, slots=True)
class ScoreJob:
    prefix: Tokens  # BOS + instructions + text, computed once for every branch
    branches: tuple[Branch, ...]
    questions: tuple[int, ...] = ()  # how many branches each question has, in order

    def __post_init__(self) -> None:
        if not self.prefix:
            raise ValueError("ScoreJob.prefix must hold at least the BOS token")
        if not self.branches:
            raise ValueError("ScoreJob.branches must not be empty")
        if self.questions and (min(self.questions) < 1
                               or sum(self.questions) != len(self.branches)):
            raise ValueError("ScoreJob.questions must count every branch once")

    def units(self) -> list[range]:
        """The branches an engine may compute together: each question's, or (questions not
        given) each branch alone. An engine whose arithmetic moves with what shares a batch
        batches a unit with nothing else, so that no answer depends on another question."""
        ends = list(itertools.accumulate(self.questions or [1] * len(self.branches)))
        return [range(a, b) for a, b in zip([0, *ends], ends)]

    def window_tokens(self) -> int:
        """The longest sequence the job puts in one window: prefix + suffix + label."""
        return len(self.prefix) + max(b.positions() + 1 for b in self.branches)

    def work_ceiling(self) -> int:
        """At least any engine's work_tokens for the job, for a sum: every candidate as a
        sequence of its own (prefix, suffix, label), each label token also as a row of
        logits, and three decodes a candidate (a layout makes at most one for the prefix
        and one for each branch and each label path)."""
        per_decode = 3 * DECODE_TOKENS
        return sum(len(self.prefix) + len(b.suffix) + len(c) * (1 + OUTPUT_TOKENS) + per_decode
                   for b in self.branches for c in b.candidates)


@dataclass(frozen=True, slots=True)
class NodeLogits:
    """Raw logits at one node of a branch's label trie."""

    path: Tokens  # label tokens already placed after the suffix; () is the answer position
    token_ids: Tokens  # the tokens allowed next, sorted
    logits: np.ndarray  # float32, aligned with token_ids, exactly as the engine produced them
    logsumexp: float | None = None  # over the full vocabulary; given at the answer position


BranchResult = tuple[NodeLogits, ...]


class JobResult(list):
    """One job's results, a BranchResult for each branch in order, and how many tokens of
    its prefix the engine read from its prefix cache instead of computing them."""

    def __init__(self, branches=(), cached_tokens: int = 0) -> None:
        super().__init__(branches)
        self.cached_tokens = cached_tokens

# Asked before each chunk of job i's work; an error returned is that job's result
Stop = Callable[[int], Exception | None]


def label_trie(candidates: Sequence[Tokens]) -> dict[Tokens, Tokens]:
    """Map each trie node (a proper prefix of some candidate) to its sorted next tokens."""
    children: dict[Tokens, set[int]] = {}
    for cand in candidates:
        for k in range(len(cand)):
            children.setdefault(tuple(cand[:k]), set()).add(cand[k])
    return {path: tuple(sorted(ids)) for path, ids in children.items()}


def trie_leaves(trie: dict[Tokens, Tokens]) -> list[Tokens]:
    """Trie nodes with no child node: the label paths a sequence ends on."""
    return [p for p, nxt in trie.items() if not any((*p, t) in trie for t in nxt)]


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """A model's own chat template (Jinja source), with the texts of the special tokens
    templates name (bos_token, eos_token): what decider/chat_template.py renders."""

    source: str
    bos_token: str = ""
    eos_token: str = ""


@dataclass(frozen=True, slots=True)
class EngineInfo:
    model_name: str
    model_path: str
    n_ctx: int  # the per-sequence window loaded
    n_ctx_train: int
    n_vocab: int
    bos_id: int
    weights: str  # e.g. "Q4_K_M GGUF, 268M params"
    memory: dict[str, int] = field(default_factory=dict)  # bytes: weights, kv, compute
    sentinel: float | None = None  # value an unwritten row holds, when the engine poisons
    add_bos: bool = True  # the tokenizer puts bos_id first (SmolLM2's does not: its bos_id
    # is <|im_start|>, which its chat template places itself)
    chat_template: ChatTemplate | None = None  # the model's own, where it carries one


DEFAULT_N_CTX = 8192  # when neither the caller nor the catalog names a window
# what an engine writes over output rows before a pass: no forward pass produces -FLT_MAX
SENTINEL = float(np.finfo(np.float32).min)


def resolve_n_ctx(n_ctx: int | None, n_ctx_train: int) -> int:
    """The per-sequence window to load: n_ctx, or the default within the trained context;
    refused outside [32, trained context]."""
    from decider.errors import ConfigError

    n_ctx = n_ctx or min(DEFAULT_N_CTX, n_ctx_train)
    if not 32 <= n_ctx <= n_ctx_train:
        raise ConfigError(f"n_ctx must be in [32, {n_ctx_train}] (the model's trained "
                          f"context), got {n_ctx}", n_ctx=n_ctx, n_ctx_train=n_ctx_train)
    return n_ctx


def check_windows(jobs: Sequence[ScoreJob], n_ctx: int) -> None:
    """Refuse, before any compute, a job whose longest sequence does not fit n_ctx."""
    from decider.errors import PromptTooLong

    for i, job in enumerate(jobs):
        if job.window_tokens() > n_ctx:
            raise PromptTooLong(job.window_tokens(), n_ctx, where=f"job {i}")


class Engine(Protocol):
    name: str
    info: EngineInfo
    # saved prefix states (prefix_cache.py), or None where the engine keeps none
    prefix_cache: PrefixCache | None

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        """Token ids of `text`, no BOS added. Plain text by default: spelled control
        tokens stay text. special=True parses them, for the prompt template's own
        markers (`<start_of_turn>`) and nothing else."""

    def work_tokens(self, job: ScoreJob) -> int:
        """What a score call of `job` costs this engine, in tokens of a long decode: the
        tokens its layout places, and what the engine's calls cost beyond them
        (DECODE_TOKENS, OUTPUT_TOKENS). The measure of the work bound, checked before
        any compute. Never above job.work_ceiling()."""

    def warm_up(self, max_batch: int) -> None:
        """Run, before the daemon says READY, every shape of call up to max_batch jobs
        that this engine compiles or captures, so that no request pays for it."""

    def score(self, jobs: Sequence[ScoreJob], stop: Stop | None = None
              ) -> list[JobResult | Exception]:
        """For each job, for each branch, the logits at every node of its label trie.
        stop(i) is asked before each chunk of job i (a deadline passed, the caller gone):
        the error it returns is job i's result and the rest of its work is skipped. An
        engine whose call is one pass has no chunk to stop between and never asks."""

    def close(self) -> None: ...
