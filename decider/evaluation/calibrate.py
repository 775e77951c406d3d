"""`decider calibrate`: labelled examples in, a calibration out (decider/calibration.py).

Each question with at least `min_examples` examples gets adjustments of its own, one per
branch, the form chosen by cross-validated log loss (fit.py). Every question shape (type
and option count) also gets a fallback temperature fitted on all the examples of that
shape, which a question with fewer examples, or one the file never saw, takes. Without
labels, contextual calibration fits each question's bias on content-free texts instead.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..calibration import Calibration, QuestionCalibration, branch_answers, shape_key, signature
from ..errors import DeciderError
from ..questions import Request, Scored
from .examples import Example
from .fit import contextual, fit_branch, log_probs
from .metrics import coverage_at

CONTENT_FREE = ("N/A", "[MASK]")  # Zhao et al.'s, but "": decider refuses an empty text


@dataclass(frozen=True, slots=True)
class Fitted:
    calibration: Calibration
    held_out: list[list[Scored]]  # each example's branches, calibrated out of fold
    cv_log_loss: dict[str, dict[str, float]]  # per question signature: form -> loss


def score_examples(decider, examples: Sequence[Example], batch: int = 16) -> list[list[Scored]]:
    """The model's own probabilities for each example, per branch of its question."""
    out = []
    for start in range(0, len(examples), batch):
        part = examples[start:start + batch]
        for example, scored in zip(part, decider.branch_scores([e.request for e in part])):
            if isinstance(scored, DeciderError):
                raise ValueError(f"example on line {example.line}: {scored.message}")
            out.append(scored[0])
    return out


def fit_calibration(decider, examples: Sequence[Example], scores: Sequence[Sequence[Scored]],
                    folds: int = 5, seed: int = 0, min_examples: int = 50,
                    error_budget: float | None = None) -> Fitted:
    by_question, by_shape = defaultdict(list), defaultdict(list)
    for i, example in enumerate(examples):
        by_question[signature(example.question)].append(i)
        for j, answers in enumerate(branch_answers(example.question)):
            by_shape[shape_key(example.question.type, len(answers))].append((i, j))
    fallbacks = {}
    for key, places in by_shape.items():
        logp, gold = _matrix(examples, scores, places)
        fallbacks[key] = fit_branch(logp, gold, _answers_at(examples, places[0]), folds, seed,
                                    ("none", "temperature")).adjustment
    questions, losses = {}, {}
    held = [list(s) for s in scores]
    for sig, items in by_question.items():
        if len(items) < min_examples:
            continue
        question = examples[items[0]].question
        adjustments = []
        for j, answers in enumerate(branch_answers(question)):
            logp, gold = _matrix(examples, scores, [(i, j) for i in items])
            fitted = fit_branch(logp, gold, answers, folds, seed)
            adjustments.append(fitted.adjustment)
            losses[sig] = {form: losses.get(sig, {}).get(form, 0) + loss
                           for form, loss in fitted.cv_log_loss.items()}
            for i, p in zip(items, fitted.held_out):
                held[i][j] = Scored(dict(zip(answers, p.tolist())), scores[i][j].label_mass)
        own = QuestionCalibration(sig, question.type, question.question, tuple(adjustments),
                                  examples=len(items))
        if error_budget is not None:
            own = replace(own, abstain_below=_threshold(examples, held, items, error_budget))
        questions[sig] = own
    calibration = Calibration(decider.model_sha256, decider.template_version, questions,
                              fallbacks, decider.entry.name)
    return Fitted(calibration, held, losses)


def contextual_calibration(decider, questions) -> Calibration:
    """Each question's bias from the model's answers to content-free texts."""
    own = {}
    for question in questions:
        runs = decider.branch_scores([Request(text, (question,)) for text in CONTENT_FREE])
        adjustments = tuple(contextual([list(run[0][j].probabilities.values()) for run in runs],
                                       answers)
                            for j, answers in enumerate(branch_answers(question)))
        own[signature(question)] = QuestionCalibration(signature(question), question.type,
                                                       question.question, adjustments)
    return Calibration(decider.model_sha256, decider.template_version, own, {},
                       decider.entry.name)


def _matrix(examples, scores, places) -> tuple[np.ndarray, np.ndarray]:
    logp = log_probs([list(scores[i][j].probabilities.values()) for i, j in places])
    gold = np.array([_answers_at(examples, (i, j)).index(examples[i].expected[j])
                     for i, j in places])
    return logp, gold


def _answers_at(examples, place) -> tuple[str, ...]:
    i, j = place
    return branch_answers(examples[i].question)[j]


def _threshold(examples, held, items, budget: float) -> float | None:
    """The confidence from which the held-out answers err at most `budget` of the time
    (a question of one branch; None for any-of-N: each label errs on its own)."""
    if len(held[items[0]]) != 1:
        return None
    answers = list(held[items[0]][0].probabilities)
    p = np.array([list(held[i][0].probabilities.values()) for i in items])
    y = np.array([answers.index(examples[i].expected[0]) for i in items])
    return coverage_at(p, y, (budget,))[0]["threshold"]
