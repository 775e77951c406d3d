"""Accuracy and calibration of a model on the labelled sets of decider/bench/datasets.py,
raw and calibrated, beside the majority class and a TF-IDF logistic regression: the tables
of docs/benchmarks.md. One model load for every set; the calibration is fitted on a
training sample and measured on a test sample it never saw. Also times what `decider
calibrate` adds to scoring its examples once (the fit), on the first set's training sample.

    python scripts/measure_calibration.py smollm2-135m-instruct --out results/smollm2 \\
        vader-tweets-positive rotten-tomatoes vader-tweets-scale yahoo-topics banking77
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from decider import Decider
from decider.bench import datasets
from decider.evaluation.calibrate import contextual_calibration, fit_calibration, score_examples
from decider.evaluation.evaluate import evaluate, table
from decider.evaluation.examples import parse_examples
from decider.questions import Scored


def sample(data: datasets.Dataset, which: str, n: int, seed: int) -> list:
    items = data.split(which)
    chosen = random.Random(seed).sample(items, min(n, len(items)))
    return parse_examples(json.dumps({"text": x.text, "question": data.question,
                                      "gold": x.gold}) for x in chosen)


def scored(decider, examples, path: Path):
    """The model's raw answers to `examples`, read from `path` when an earlier run of this
    model on the same sample wrote them: a refit with other settings needs no rescoring."""
    key = {"model_sha256": decider.model_sha256, "template": decider.template_version,
           "texts": [e.request.text for e in examples]}
    if path.exists():
        saved = json.loads(path.read_text())
        if saved["key"] == key:
            return [[Scored(b["p"], b["mass"]) for b in item] for item in saved["scores"]], False
    scores = score_examples(decider, examples)
    path.write_text(json.dumps({"key": key, "scores": [
        [{"p": b.probabilities, "mass": b.label_mass} for b in item] for item in scores]}))
    return scores, True


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("sets", nargs="+", choices=datasets.NAMES)
    p.add_argument("--train", type=int, default=300, help="training examples per set")
    p.add_argument("--test", type=int, default=500, help="test examples per set")
    p.add_argument("--seed", type=int, default=0, help="the samples' and folds' seed")
    p.add_argument("--n-ctx", type=int, default=4096, help="the longest test texts need ~1,200")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"seed {args.seed}", file=sys.stderr)
    results = {}
    with Decider(args.model, n_ctx=args.n_ctx) as decider:
        for name in args.sets:
            data = datasets.load(name)
            train = sample(data, "train", args.train, args.seed)
            test = sample(data, "test", args.test, args.seed)
            t0 = time.perf_counter()
            (args.out / name).mkdir(exist_ok=True)
            train_scores, fresh = scored(decider, train, args.out / name / "train_scores.json")
            t1 = time.perf_counter()
            fitted = fit_calibration(decider, train, train_scores, seed=args.seed)
            t2 = time.perf_counter()
            test_scores, _ = scored(decider, test, args.out / name / "test_scores.json")
            reports = evaluate(test, test_scores, fitted.calibration, train,
                               plots=args.out / name)
            # without labels: contextual calibration, measured on the same test answers
            contextual = contextual_calibration(decider, [train[0].question])
            for report, other in zip(reports, evaluate(test, test_scores, contextual,
                                                        baseline=False)):
                report["contextual"] = other["calibrated"]
            results[name] = {"train": len(train), "test": len(test), "fit_seconds": t2 - t1,
                             "questions": reports}
            if fresh:  # the fit's cost beside scoring, only where this run scored
                results[name] |= {"score_seconds": t1 - t0,
                                  "calibrate_over_scoring": (t2 - t0) / (t1 - t0)}
            scoring = f"scoring the training sample {t1 - t0:.1f} s" if fresh else \
                "scores of an earlier run"
            print(f"== {name}: {len(train)} train, {len(test)} test; {scoring}, the fit "
                  f"{t2 - t1:.2f} s\n{table(reports)}",
                  flush=True)
            for report in reports:
                c = report["contextual"]
                print(f"  contextual (no labels)   {c['accuracy']:6.3f} {c['log_loss']:8.4f} "
                      f"{c['brier']:7.4f} {c['ece']:6.3f}", flush=True)
            (args.out / "results.json").write_text(json.dumps(
                {"model": decider.entry.name, "model_sha256": decider.model_sha256,
                 "template_version": decider.template_version, "seed": args.seed,
                 "sets": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
