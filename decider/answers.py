"""A decision: the typed answers to a request's questions (each type's answer class lives
with its question, decider/questions/), with the usage and the provenance."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .questions import Answer


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int  # the prefix plus every branch's suffix and label tokens
    window_tokens: int  # the longest single sequence, the one checked against n_ctx
    cached_tokens: int = 0  # of the prefix, read from the engine's prefix cache


@dataclass(frozen=True, slots=True)
class Decision:
    answers: tuple[Answer, ...]
    model: str
    engine: str
    usage: Usage

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "engine": self.engine,
            "answers": [a.to_dict() for a in self.answers],
            "usage": asdict(self.usage),
        }


@dataclass(frozen=True, slots=True)
class Outcome:
    """A decision as a service answers it: with its timings and the model's provenance."""

    decision: Decision
    queue_ms: float
    compute_ms: float
    model_sha256: str  # of the model that computed it
    template_version: str  # of the prompts that asked it

    def provenance(self) -> dict:
        """What the HTTP APIs report under x_decider: who answered, with what, how fast."""
        from . import __version__

        d = self.decision
        return {"version": __version__, "engine": d.engine, "model_sha256": self.model_sha256,
                "template_version": self.template_version,
                "window_tokens": d.usage.window_tokens,
                "cached_tokens": d.usage.cached_tokens, "queue_ms": self.queue_ms,
                "compute_ms": self.compute_ms}
