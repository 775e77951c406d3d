"""A request as engine work: one ScoreJob (shared prefix + branches), and the way back
from the branches' raw logits to typed answers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from decider.engines.base import Branch, BranchResult, ScoreJob

from .answers import (
    Answer,
    ChoiceAnswer,
    LabelDecision,
    MultiLabelAnswer,
    ScaleAnswer,
    YesNoAnswer,
)
from .prompts import YES, PromptFormat, canonical, plan_branches
from .questions import Choice, MultiLabel, Question, Request, Scale, YesNo
from .scoring import Candidates, answer_log_probs, build_candidates, label_mass


@dataclass(frozen=True, slots=True)
class _BranchKey:
    candidates: Candidates
    answers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    job: ScoreJob
    questions: tuple[Question, ...]
    keys: tuple[tuple[_BranchKey, ...], ...]  # per question, per branch (job order)

    @property
    def window_tokens(self) -> int:
        return self.job.window_tokens()

    @property
    def prompt_tokens(self) -> int:
        return len(self.job.prefix) + sum(b.positions() + 1 for b in self.job.branches)

    def read(self, results: Sequence[BranchResult]) -> tuple[Answer, ...]:
        """Typed answers from the engine's (already guarded) results for this job."""
        it = iter(results)
        answers = []
        for q, keys in zip(self.questions, self.keys):
            scored = [(_probabilities(k, r), label_mass(r)) for k, r in zip(keys, it)]
            answers.append(_answer(q, keys, scored))
        return tuple(answers)


def build_plan(
    request: Request, fmt: PromptFormat, tokenize: Callable[[str], list[int]], bos: int
) -> Plan:
    prefix = (bos, *tokenize(fmt.render_prefix(request.text, request.instructions)))
    end = tuple(tokenize(fmt.answer_end))
    branches, keys = [], []
    for q in request.questions:
        q_keys = []
        for bp in plan_branches(q, fmt):
            cands = build_candidates([fmt.surface_forms(a) for a in bp.answers], tokenize, end)
            branches.append(Branch(tuple(tokenize(bp.suffix)), cands.sequences))
            q_keys.append(_BranchKey(cands, bp.answers))
        keys.append(tuple(q_keys))
    return Plan(ScoreJob(prefix, tuple(branches)), request.questions, tuple(keys))


def _probabilities(key: _BranchKey, result: BranchResult) -> dict[str, float]:
    lp = answer_log_probs(key.candidates, result, len(key.answers))
    p = np.exp(lp - np.logaddexp.reduce(lp))
    return {name: float(v) for name, v in zip(key.answers, p)}


def _answer(q: Question, keys, scored: list[tuple[dict[str, float], float]]) -> Answer:
    probs, mass = scored[0]
    if isinstance(q, YesNo):
        p_yes = probs[YES]
        return YesNoAnswer(q.question, p_yes, p_yes >= q.threshold, q.threshold, mass)
    if isinstance(q, Choice):
        ordered = {lb.name: probs[lb.name] for lb in q.labels}
        best = max(ordered, key=ordered.get)
        return ChoiceAnswer(q.question, best, ordered[best], ordered, mass)
    if isinstance(q, Scale):
        ordered = {lv.name: probs[lv.name] for lv in q.levels}
        best = max(ordered, key=ordered.get)
        expected = float(sum(i * p for i, p in enumerate(ordered.values())))
        return ScaleAnswer(q.question, best, expected, ordered, mass)
    assert isinstance(q, MultiLabel)
    by_name = {lb.name: s for lb, s in zip(canonical(q.labels), scored)}
    decisions = tuple(
        LabelDecision(lb.name, pr[YES], pr[YES] >= q.threshold, m)
        for lb in q.labels
        for pr, m in [by_name[lb.name]]
    )
    chosen = tuple(d.label for d in decisions if d.chosen)
    return MultiLabelAnswer(q.question, decisions, chosen, q.threshold,
                            min(d.label_mass for d in decisions))
