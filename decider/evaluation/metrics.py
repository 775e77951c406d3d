"""How good probabilistic answers are against gold answers (numpy only). `p` is an n x K
array of probabilities, each row summing to 1, and `y` the n gold indices into its
columns.

Definitions, as `summary` reports them:
- confidence: the top label's probability, max_k p_ik (not decider's confidence.peak,
  which rescales it).
- accuracy: the share of items whose most probable label is the gold one (ties go to the
  first column, as numpy's argmax has it).
- log loss: -mean_i ln p_{i,y_i}, each probability clipped to at least LOG_LOSS_CLIP.
- Brier score: for K = 2 the binary form, mean_i (p_i1 - [y_i = 1])^2, in [0, 1] (the
  same for either column, and half the K-class sum); for K > 2 the mean over items of
  sum_k (p_ik - [y_i = k])^2, in [0, 2].
- ECE: expected calibration error over equal-mass bins of the confidence (the items
  sorted by confidence and cut into bins of equal count, so every bin holds evidence):
  sum_b (n_b / n) |accuracy_b - mean confidence_b|. Sampling alone gives a perfectly
  calibrated model a positive ECE on a finite test set (ece_by_chance): the floor is its
  median, and the ECE's p-value the share of such draws at least as large as the one
  measured (under 0.05: miscalibrated beyond what this many items can hide).
- coverage at an error budget: the items sorted by confidence, highest first; the
  largest share that, decided alone, has an error rate within the budget, and the
  confidence threshold that picks exactly those items (confidence >= threshold). A cut
  falls only between different confidences, so tied items are never split.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

LOG_LOSS_CLIP = 1e-12
ERROR_BUDGETS = (0.01, 0.05, 0.10)


def checked(p, y) -> tuple[np.ndarray, np.ndarray]:
    """p and y as arrays, or ValueError naming what is wrong with them."""
    p, y = np.asarray(p, dtype=float), np.asarray(y)
    if p.ndim != 2 or p.shape[0] == 0 or p.shape[1] < 2:
        raise ValueError(f"p must be n x K with n >= 1 and K >= 2, got shape {p.shape}")
    if y.shape != (p.shape[0],) or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"y must be {p.shape[0]} integer indices, got {y.dtype} {y.shape}")
    if y.min() < 0 or y.max() >= p.shape[1]:
        raise ValueError(f"y must index the {p.shape[1]} columns of p")
    if (p < 0).any() or not np.allclose(p.sum(axis=1), 1.0, atol=1e-5):
        raise ValueError("each row of p must be probabilities summing to 1")
    return p, y


def confidence(p) -> np.ndarray:
    return np.asarray(p, dtype=float).max(axis=1)


def correct(p, y) -> np.ndarray:
    return np.asarray(p).argmax(axis=1) == np.asarray(y)


def accuracy(p, y) -> float:
    p, y = checked(p, y)
    return float(correct(p, y).mean())


def log_loss(p, y) -> float:
    p, y = checked(p, y)
    return float(-np.log(np.maximum(p[np.arange(len(y)), y], LOG_LOSS_CLIP)).mean())


def brier(p, y) -> float:
    p, y = checked(p, y)
    onehot = np.eye(p.shape[1])[y]
    total = ((p - onehot) ** 2).sum(axis=1).mean()
    return float(total / 2 if p.shape[1] == 2 else total)


def reliability(p, y, bins: int = 15) -> list[dict]:
    """Equal-mass bins of the confidence, lowest first: each bin's mean confidence,
    accuracy and count. Fewer bins than asked when there are fewer items."""
    p, y = checked(p, y)
    conf, hit = confidence(p), correct(p, y)
    order = np.argsort(conf, kind="stable")
    return [{"confidence": float(conf[part].mean()), "accuracy": float(hit[part].mean()),
             "count": len(part)}
            for part in np.array_split(order, min(bins, len(order)))]


def ece(p, y, bins: int = 15) -> float:
    return ece_of(reliability(p, y, bins))


def ece_of(table: list[dict]) -> float:
    """ECE from a reliability table."""
    n = sum(row["count"] for row in table)
    return float(sum(row["count"] / n * abs(row["accuracy"] - row["confidence"])
                     for row in table))


def ece_by_chance(p, bins: int = 15, draws: int = 1000, seed: int = 0) -> np.ndarray:
    """The ECEs of `draws` gold answers drawn from p itself (p perfectly calibrated), on
    as many items as p has: what sampling alone gives a measured ECE."""
    p = np.asarray(p, dtype=np.float64)
    rng = np.random.default_rng(seed)
    cumulative = p.cumsum(axis=1)
    return np.array([ece(p, (cumulative < rng.random((len(p), 1))).sum(axis=1)
                         .clip(0, p.shape[1] - 1), bins) for _ in range(draws)])


def risk_coverage(p, y) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The coverage/error curve at every honest cut: (thresholds, coverage, error rate),
    thresholds descending. Deciding the items with confidence >= thresholds[j] decides
    coverage[j] of them with error rate error[j]."""
    p, y = checked(p, y)
    conf, wrong = confidence(p), ~correct(p, y)
    order = np.argsort(-conf, kind="stable")
    conf, wrong = conf[order], wrong[order]
    # a cut after item i is honest only when the next item is less confident
    ends = np.flatnonzero(np.append(conf[1:] < conf[:-1], True))
    decided = ends + 1
    return conf[ends], decided / len(conf), np.cumsum(wrong)[ends] / decided


def coverage_at(p, y, budgets: Sequence[float] = ERROR_BUDGETS) -> list[dict]:
    """For each error budget: the largest share decided alone within it, the threshold
    that decides exactly those and their error rate; coverage 0 and threshold None when
    not even the most confident items are within the budget."""
    thresholds, coverage, error = risk_coverage(p, y)
    out = []
    for budget in budgets:
        # 1e-9: an error rate equal to the budget (1 in 100 at 0.01) counts as within it
        within = np.flatnonzero(error <= budget + 1e-9)
        if len(within) == 0:
            out.append({"error_budget": budget, "coverage": 0.0, "threshold": None,
                        "error": None})
        else:
            j = within[-1]  # coverage grows along the curve, so the last is the largest
            out.append({"error_budget": budget, "coverage": float(coverage[j]),
                        "threshold": float(thresholds[j]), "error": float(error[j])})
    return out


def majority_class(train_y, y) -> dict:
    """The majority-class baseline: the most frequent gold index of a training split
    (the lowest on a tie), its share there, and the accuracy of always answering it."""
    train_y, y = np.asarray(train_y), np.asarray(y)
    if len(train_y) == 0:
        raise ValueError("the training split is empty")
    counts = np.bincount(train_y)
    top = int(counts.argmax())
    return {"class": top, "train_share": float(counts[top] / len(train_y)),
            "accuracy": float((y == top).mean()) if len(y) else None}


def paired_difference(right, other_right) -> dict:
    """How much more often one predictor is right than another on the same items, with
    a 95% interval (the normal approximation to the mean of the per-item differences:
    items both get right or both get wrong say nothing of which is better)."""
    d = np.asarray(right, dtype=np.float64) - np.asarray(other_right, dtype=np.float64)
    half = 1.96 * d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else float("nan")
    return {"difference": float(d.mean()), "low": float(d.mean() - half),
            "high": float(d.mean() + half)}


def summary(p, y, bins: int = 15, train_y=None) -> dict:
    """Every measure above as a JSON-ready dict; with train_y (gold indices of the
    training split) also the majority-class baseline and how much more accurate than it
    these answers are on these items (paired_difference)."""
    p, y = checked(p, y)
    table = reliability(p, y, bins)
    measured, chance = ece_of(table), ece_by_chance(p, bins)
    out = {
        "n": len(y),
        "classes": p.shape[1],
        "accuracy": accuracy(p, y),
        "log_loss": log_loss(p, y),
        "log_loss_clip": LOG_LOSS_CLIP,
        "brier": brier(p, y),
        "brier_form": "binary" if p.shape[1] == 2 else "multiclass sum",
        "ece": measured,
        "ece_bins": len(table),
        "ece_floor": float(np.median(chance)),
        "ece_p": float(np.mean(chance >= measured)),
        "reliability": table,
        "coverage": coverage_at(p, y),
    }
    if train_y is not None:
        out["majority"] = majority_class(train_y, y)
        out["majority"]["over"] = paired_difference(correct(p, y), y == out["majority"]["class"])
    return out
