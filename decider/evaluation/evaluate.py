"""`decider eval`: how right and how calibrated a model's answers are on labelled test
examples, before and after a calibration, beside the simple baselines.

Each question (each of its branches, for any-of-N) is measured on its own test examples:
accuracy, log loss, Brier, ECE with equal-mass bins, the coverage/error curve, and the
reliability diagram as a PNG. With training examples it also reports the majority class
of the training split and a logistic regression on TF-IDF features trained on it: the
floor a user would compare a language model against.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..calibration import Calibration, branch_answers, signature
from ..prompts import canonical
from ..questions import Scored
from .examples import Example
from .metrics import summary


def evaluate(test: Sequence[Example], scores: Sequence[Sequence[Scored]],
             calibration: Calibration | None = None, train: Sequence[Example] = (),
             bins: int = 15, plots: Path | None = None, baseline: bool = True) -> list[dict]:
    """One report per question branch, in the order the test file first asks them."""
    groups = defaultdict(list)
    for i, example in enumerate(test):
        for j in range(len(example.expected)):
            groups[(signature(example.question), j)].append(i)
    trained = defaultdict(list)
    for example in train:
        for j in range(len(example.expected)):
            trained[(signature(example.question), j)].append(example)
    reports = []
    for (sig, j), items in groups.items():
        question = test[items[0]].question
        answers = branch_answers(question)[j]
        name = question.question + (f" [{answers_label(question, j)}]"
                                    if len(branch_answers(question)) > 1 else "")
        y = np.array([answers.index(test[i].expected[j]) for i in items])
        raw = np.array([list(scores[i][j].probabilities.values()) for i in items])
        train_y = [answers.index(e.expected[j]) for e in trained[(sig, j)]] or None
        report = {"question": name, "type": question.type, "signature": sig,
                  "answers": list(answers), "raw": summary(raw, y, bins, train_y)}
        own = calibration and calibration.lookup(question)
        after = None
        if own is not None:
            after = np.array([list(own.branches[j].apply(scores[i][j]).probabilities.values())
                              for i in items])
            report["calibrated"] = summary(after, y, bins, train_y)
            report["method"] = own.branches[j].method
        if baseline and train_y and len(set(train_y)) > 1:
            from .baseline import tfidf_probabilities

            p = tfidf_probabilities([e.request.text for e in trained[(sig, j)]], train_y,
                                    [test[i].request.text for i in items], len(answers))
            report["tfidf_baseline"] = summary(p, y, bins, train_y)
        if plots is not None:
            plots.mkdir(parents=True, exist_ok=True)
            from .report import write_report_png

            path = plots / f"{len(reports) + 1:02d}-{_slug(name)}.png"
            write_report_png(path, name, (raw, y), (after, y) if after is not None else None,
                             bins)
            report["plot"] = str(path)
        reports.append(report)
    return reports


def answers_label(question, j: int) -> str:
    """The label an any-of-N branch asks about (branches go in canonical label order)."""
    return canonical(question.options()[1])[j].name


def table(reports: Sequence[dict]) -> str:
    """The reports as a person reads them: one block per question, raw beside calibrated."""
    lines = []
    for r in reports:
        lines.append(f"{r['question']}  ({r['type']}, {r['raw']['n']} examples)")
        rows = [("raw", r["raw"])]
        if "calibrated" in r:
            rows.append((f"calibrated ({r['method']})", r["calibrated"]))
        if "tfidf_baseline" in r:
            rows.append(("tf-idf + logistic", r["tfidf_baseline"]))
        lines.append(f"  {'':24} {'acc':>6} {'logloss':>8} {'brier':>7} {'ece':>6} "
                     f"{'floor':>6} {'p':>5}  decided alone at 1% / 5% / 10% error (threshold)")
        for label, s in rows:
            covered = " / ".join(
                f"{c['coverage']:.2f}" + (f" ({c['threshold']:.3f})" if c["threshold"] is not
                                          None else "") for c in s["coverage"])
            lines.append(f"  {label:24} {s['accuracy']:6.3f} {s['log_loss']:8.4f} "
                         f"{s['brier']:7.4f} {s['ece']:6.3f} {s['ece_floor']:6.3f} "
                         f"{s['ece_p']:5.3f}  {covered}")
        if "majority" in r["raw"]:
            lines.append(f"  {'majority class':24} {r['raw']['majority']['accuracy']:6.3f}"
                         "  accuracy over it, 95% interval: " + "; ".join(
                             f"{label.split(' (')[0]} {_interval(s['majority']['over'])}"
                             for label, s in rows))
        lines.append(f"  ECE over {r['raw']['ece_bins']} equal-mass bins; floor: the median ECE "
                     "of answers drawn from the probabilities themselves, on this many items; "
                     "p: the share of those draws at or above the ECE (under 0.05: "
                     "miscalibrated beyond chance)")
    return "\n".join(lines)


def _interval(paired: dict) -> str:
    return f"{paired['difference']:+.3f} ({paired['low']:+.3f}, {paired['high']:+.3f})"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "question"
