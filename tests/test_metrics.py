"""decider.evaluation: the metrics against direct computations on hand-made and random
arrays, ECE on calibrated and overconfident synthetic data, the coverage thresholds, the
report PNG and the TF-IDF baseline."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from decider.evaluation import metrics
from decider.evaluation.metrics import (
    accuracy,
    brier,
    coverage_at,
    ece,
    log_loss,
    majority_class,
    reliability,
    summary,
)

HAND_P = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]])
HAND_Y = np.array([0, 1, 1, 1])


def calibrated(rng, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Probabilities from a flat Dirichlet, each label drawn from its own row."""
    p = rng.dirichlet(np.ones(k), size=n)
    y = (rng.random(n)[:, None] > p.cumsum(axis=1)).sum(axis=1)  # one draw from each row
    return p, np.minimum(y, k - 1)


def test_hand_made_binary():
    assert accuracy(HAND_P, HAND_Y) == 0.75
    assert log_loss(HAND_P, HAND_Y) == pytest.approx(
        -(math.log(0.9) + math.log(0.8) + math.log(0.4) + math.log(0.7)) / 4)
    # binary form: the squared error of p_yes (column 1) against y
    assert brier(HAND_P, HAND_Y) == pytest.approx((0.1**2 + 0.2**2 + 0.6**2 + 0.3**2) / 4)


def test_hand_made_three_classes():
    p = np.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
    y = np.array([1, 2])
    assert accuracy(p, y) == 0.5
    assert brier(p, y) == pytest.approx(((0.25 + 0.49 + 0.04) + (0.01 + 0.01 + 0.04)) / 2)
    assert log_loss(p, y) == pytest.approx(-(math.log(0.3) + math.log(0.8)) / 2)


def test_log_loss_clips_a_zero_probability():
    p, y = np.array([[1.0, 0.0], [0.5, 0.5]]), np.array([1, 0])
    assert log_loss(p, y) == pytest.approx((-math.log(1e-12) - math.log(0.5)) / 2)


@pytest.mark.parametrize("k", [2, 3, 7])
def test_random_arrays_against_loops(rng, k):
    p, y = calibrated(rng, 301, k)
    rows = list(zip(p.tolist(), y.tolist()))
    assert accuracy(p, y) == pytest.approx(
        sum(max(range(k), key=row.__getitem__) == g for row, g in rows) / len(rows))
    assert log_loss(p, y) == pytest.approx(-sum(math.log(row[g]) for row, g in rows) / len(rows))
    squared = sum(sum((row[j] - (j == g)) ** 2 for j in range(k)) for row, g in rows) / len(rows)
    assert brier(p, y) == pytest.approx(squared / 2 if k == 2 else squared)

    bins = 15
    order = sorted(range(len(rows)), key=lambda i: max(rows[i][0]))  # stable, as numpy's
    table = reliability(p, y, bins)
    assert len(table) == bins and sum(b["count"] for b in table) == len(rows)
    assert max(b["count"] for b in table) - min(b["count"] for b in table) <= 1  # equal mass
    start, direct_ece = 0, 0.0
    for b in table:
        members = order[start:start + b["count"]]
        start += b["count"]
        conf = sum(max(rows[i][0]) for i in members) / len(members)
        hits = sum(max(range(k), key=rows[i][0].__getitem__) == rows[i][1] for i in members)
        assert b["confidence"] == pytest.approx(conf)
        assert b["accuracy"] == pytest.approx(hits / len(members))
        direct_ece += len(members) / len(rows) * abs(hits / len(members) - conf)
    assert ece(p, y, bins) == pytest.approx(direct_ece)


def test_reliability_with_fewer_items_than_bins():
    assert [b["count"] for b in reliability(HAND_P, HAND_Y, 15)] == [1, 1, 1, 1]


@pytest.mark.parametrize("k", [2, 4])
def test_ece_of_calibrated_and_overconfident_data(rng, k):
    p, y = calibrated(rng, 20_000, k)
    assert ece(p, y) < 0.02
    sharper = p ** 3 / (p ** 3).sum(axis=1, keepdims=True)  # temperature 1/3: overconfident
    assert ece(sharper, y) > 0.1


def binary(confidences, right) -> tuple[np.ndarray, np.ndarray]:
    """Items of the given top-label confidence, right or wrong."""
    c = np.array(confidences)
    return np.stack([c, 1 - c], axis=1), np.array([0 if r else 1 for r in right])


def test_coverage_thresholds_by_hand():
    # two items tie at 0.95, one of them wrong: no cut may fall between them
    p, y = binary([0.99, 0.97, 0.95, 0.95, 0.90, 0.90, 0.85, 0.80, 0.70, 0.60],
                  [1, 1, 1, 0, 1, 1, 1, 0, 1, 0])
    rows = coverage_at(p, y, (0.01, 0.15, 0.25, 0.5))
    assert [(r["coverage"], r["threshold"]) for r in rows] == [
        (0.2, 0.97), (0.7, 0.85), (0.9, 0.70), (1.0, 0.60)]
    assert [r["error"] for r in rows] == pytest.approx([0.0, 1 / 7, 2 / 9, 0.3])


def test_coverage_is_zero_when_the_most_confident_item_is_wrong():
    p, y = binary([0.99, 0.9, 0.8], [0, 1, 1])
    assert coverage_at(p, y, (0.01,)) == [
        {"error_budget": 0.01, "coverage": 0.0, "threshold": None, "error": None}]


@pytest.mark.parametrize("k", [2, 3])
def test_coverage_thresholds_are_honest_and_largest(rng, k):
    p, y = calibrated(rng, 400, k)
    p = np.round(p, 1)  # many ties
    p[:, 0] += 1 - p.sum(axis=1)
    p = np.clip(p, 0, 1)
    p /= p.sum(axis=1, keepdims=True)
    conf, right = p.max(axis=1), p.argmax(axis=1) == y
    for row in coverage_at(p, y, (0.01, 0.05, 0.1, 0.3)):
        # the best cut by brute force over every threshold
        best = 0.0
        for t in np.unique(conf):
            chosen = conf >= t
            if (~right[chosen]).mean() <= row["error_budget"] + 1e-9:
                best = max(best, chosen.mean())
        assert row["coverage"] == pytest.approx(best)
        if row["threshold"] is not None:
            chosen = conf >= row["threshold"]
            assert chosen.mean() == pytest.approx(row["coverage"])
            assert (~right[chosen]).mean() == pytest.approx(row["error"])


def test_majority_class():
    assert majority_class([2, 2, 1, 0, 2], [2, 0, 0, 2]) == {
        "class": 2, "train_share": 0.6, "accuracy": 0.5}


def test_summary_is_json_ready(rng):
    p, y = calibrated(rng, 500, 3)
    out = json.loads(json.dumps(summary(p, y, bins=10, train_y=y)))
    assert out["n"] == 500 and out["classes"] == 3 and out["ece_bins"] == 10
    assert out["accuracy"] == pytest.approx(accuracy(p, y))
    assert out["ece"] == pytest.approx(ece(p, y, 10))
    assert [r["error_budget"] for r in out["coverage"]] == [0.01, 0.05, 0.10]
    assert out["majority"]["class"] == int(np.bincount(y).argmax())
    assert out["log_loss_clip"] == 1e-12 and out["brier_form"] == "multiclass sum"


@pytest.mark.parametrize("p, y", [
    ([[0.5, 0.6]], [0]),  # a row not summing to 1
    ([[0.5, 0.5]], [2]),  # an index past the columns
    ([[1.0]], [0]),  # one column
    ([[0.5, 0.5], [0.5, 0.5]], [0]),  # lengths differ
    ([[0.5, 0.5]], [0.0]),  # not integers
])
def test_bad_input_is_refused(p, y):
    with pytest.raises(ValueError):
        metrics.checked(p, y)


def test_report_png(rng, tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    from decider.evaluation.report import write_report_png

    p, y = calibrated(rng, 2000, 2)
    sharper = p ** 3 / (p ** 3).sum(axis=1, keepdims=True)
    for after in (None, (p, y)):
        path = write_report_png(tmp_path / "report.png", "vader-tweets-positive",
                                before=(sharper, y), after=after)
        image = imread(path)
        assert path.stat().st_size > 10_000
        assert image.shape[0] > 300 and image.shape[1] > 600
        assert image[..., :3].std() > 0.01  # something drawn, not one flat colour


def test_tfidf_baseline():
    pytest.importorskip("sklearn")
    from decider.evaluation.baseline import tfidf_probabilities

    good = ["a great film", "great acting and a great story", "a lovely great film"]
    bad = ["an awful film", "awful acting and an awful story", "a dull awful film"]
    out = tfidf_probabilities(good + bad, ["yes"] * 3 + ["no"] * 3,
                         ["great film", "awful film"], ["no", "maybe", "yes"])
    assert out.shape == (2, 3)
    assert np.allclose(out.sum(axis=1), 1.0)
    assert (out[:, 1] == 0).all()  # never seen in training
    assert out[0, 2] > 0.5 > out[1, 2]
    # the same answers as indices (no 0, yes 2) with the count of labels
    by_index = tfidf_probabilities(good + bad, [2] * 3 + [0] * 3, ["great film", "awful film"], 3)
    assert np.allclose(by_index, out)
    with pytest.raises(ValueError, match="not among the labels"):
        tfidf_probabilities(good + bad, ["yes"] * 3 + ["no"] * 3, ["x"], ["yes"])


def test_the_ece_floor_is_what_sampling_alone_gives_and_shrinks_with_the_test_set(rng):
    p1 = rng.uniform(0.5, 0.95, 2000)
    p = np.stack([p1, 1 - p1], axis=1)
    floors = [np.median(metrics.ece_by_chance(p[:n], draws=200)) for n in (100, 500, 2000)]
    assert floors[0] > floors[1] > floors[2] > 0
    # a perfectly calibrated predictor's measured ECE scatters around its floor
    measured = [metrics.ece(p[:500], (rng.random(500) > p1[:500]).astype(int))
                for _ in range(50)]
    assert np.median(measured) == pytest.approx(floors[1], rel=0.25)


def test_the_ece_p_value_tells_sampling_noise_from_a_real_miscalibration(rng):
    p1 = rng.uniform(0.5, 0.95, 1000)
    p = np.stack([p1, 1 - p1], axis=1)
    calibrated = [metrics.summary(p, (rng.random(1000) > p1).astype(int))["ece_p"]
                  for _ in range(20)]
    # answers drawn from p: the p-value is uniform (4 of 20 under 0.01 one run in 25,000)
    assert sum(v < 0.01 for v in calibrated) <= 3 and 0.1 < np.median(calibrated) < 0.9
    # the truth 0.1 less sure than p says: beyond what 1,000 items can hide
    overconfident = metrics.summary(p, (rng.random(1000) > p1 - 0.1).astype(int))
    assert overconfident["ece_p"] < 0.01 and overconfident["ece"] > overconfident["ece_floor"]


def test_a_paired_difference_counts_only_the_items_the_two_disagree_on():
    a = np.array([1, 1, 0, 0, 1, 0, 1, 1] * 50, dtype=bool)
    b = np.array([1, 0, 0, 1, 1, 0, 0, 1] * 50, dtype=bool)
    out = metrics.paired_difference(a, b)
    assert out["difference"] == pytest.approx(a.mean() - b.mean())  # 0.125
    d = a.astype(float) - b  # 1, 0, 0, -1, 0, 0, 1, 0: sd over 400 items
    half = 1.96 * d.std(ddof=1) / np.sqrt(400)
    assert (out["low"], out["high"]) == pytest.approx((0.125 - half, 0.125 + half))
    assert metrics.paired_difference(a, a) == {"difference": 0.0, "low": 0.0, "high": 0.0}
