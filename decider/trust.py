"""From a question's read branches to its answer, calibrated where a calibration knows the
question, abstaining where the question or its calibration says so.

Abstention is decided on two measures, each the weakest over the question's branches:
- confidence: the probability of the answer given (yes/no: max(p, 1 - p); a choice or a
  scale: its top probability; any-of-N: the least sure label), calibrated where a
  calibration applies. It is what `decider eval`'s coverage/error curve sorts by, so a
  threshold read from that curve means the same here.
- label mass: the share of the model's full-vocabulary probability on the labels. Below
  the floor the model is not answering in label space, whatever its label probabilities.
The answer keeps its typed fields (the best label, p_yes) so that a client that ignores
`abstained` still reads the model's answer; `abstain_reason` says which measure fell short.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .calibration import Calibration, QuestionCalibration
from .questions import Answer, Question, Scored


def judged_answer(question: Question, scored: Sequence[Scored],
                  calibration: Calibration | None) -> Answer:
    own = calibration.lookup(question) if calibration is not None else None
    if own is None:
        answer, final = question.answer(scored), scored
    else:
        final = [a.apply(s) for a, s in zip(own.branches, scored, strict=True)]
        answer = replace(question.answer(final), calibrated=True, raw=question.answer(scored))
    reason = _abstain_reason(question, own, final)
    return replace(answer, abstained=True, abstain_reason=reason) if reason else answer


def confidence(scored: Sequence[Scored]) -> float:
    return min(max(s.probabilities.values()) for s in scored)


def _abstain_reason(question: Question, own: QuestionCalibration | None,
                    scored: Sequence[Scored]) -> str:
    def setting(name: str) -> float | None:
        asked = getattr(question, name)
        return asked if asked is not None or own is None else getattr(own, name)

    reasons = []
    floor = setting("abstain_below")
    if floor is not None and (sure := confidence(scored)) < floor:
        reasons.append(f"confidence {sure:.3f} below {floor:g}")
    floor = setting("min_label_mass")
    if floor is not None and (mass := min(s.label_mass for s in scored)) < floor:
        reasons.append(f"label mass {mass:.3f} below {floor:g}")
    return "; ".join(reasons)
