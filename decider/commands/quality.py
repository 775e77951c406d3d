"""`decider calibrate` and `decider eval`: fit a calibration on labelled examples, and
measure a model's answers on them (docs/calibration.md)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ..errors import FieldViolation, InvalidRequest
from . import EXIT_OK, flag_config, load_options


def cmd_calibrate(args: argparse.Namespace) -> int:
    from ..evaluation.calibrate import contextual_calibration, fit_calibration, score_examples

    examples = _examples(args.examples, labelled=not args.contextual)
    with _decider(args) as decider:
        t0 = time.perf_counter()
        if args.contextual:
            questions = {e.question: None for e in examples}  # each once, in file order
            calibration = contextual_calibration(decider, list(questions))
            _say(f"contextual calibration of {len(questions)} question(s)", t0)
        else:
            scores = score_examples(decider, examples)
            _say(f"scored {len(examples)} examples", t0)
            fitted = fit_calibration(decider, examples, scores, args.folds, args.seed,
                                     args.min_examples, args.error_budget)
            calibration = fitted.calibration
            _say("fitted", t0)
            for sig, losses in fitted.cv_log_loss.items():
                own = calibration.questions[sig]
                tried = ", ".join(f"{form} {loss:.4f}" for form, loss in losses.items())
                print(f"{own.question!r}: {own.examples} examples, "
                      f"{'/'.join(a.method for a in own.branches)}; held-out log loss: "
                      f"{tried}" + (f"; abstain below {own.abstain_below:.3f}"
                                    if own.abstain_below is not None else ""))
    calibration.save(args.output)
    print(f"wrote {args.output} ({len(calibration.questions)} question(s), "
          f"{len(calibration.fallbacks)} fallback shape(s))")
    return EXIT_OK


def cmd_eval(args: argparse.Namespace) -> int:
    from ..calibration import Calibration
    from ..evaluation.calibrate import fit_calibration, score_examples
    from ..evaluation.evaluate import evaluate, table

    test = _examples(args.examples)
    train = _examples(args.train) if args.train else []
    with _decider(args, calibrated=False) as decider:
        t0 = time.perf_counter()
        calibration = None
        if args.calibration:
            calibration = Calibration.load(args.calibration)
            calibration.check(decider.model_sha256, decider.template_version, args.calibration)
        elif train:
            calibration = fit_calibration(decider, train, score_examples(decider, train),
                                          seed=args.seed).calibration
            _say(f"calibrated on {len(train)} training examples", t0)
        scores = score_examples(decider, test)
        _say(f"scored {len(test)} test examples", t0)
    reports = evaluate(test, scores, calibration, train, args.bins,
                       Path(args.plots) if args.plots else None)
    print(table(reports))
    if args.json:
        doc = json.dumps({"model": decider.entry.name, "model_sha256": decider.model_sha256,
                          "template_version": decider.template_version, "bins": args.bins,
                          "questions": reports}, indent=1)
        if args.json == "-":
            print(doc)
        else:
            Path(args.json).write_text(doc + "\n")
    return EXIT_OK


def _decider(args: argparse.Namespace, calibrated: bool = False):
    from ..api import Decider

    cfg = flag_config(args)
    options = load_options(cfg)
    if not calibrated:
        options.pop("calibration", None)  # measured and fitted on the raw probabilities
    return Decider(args.model, limits=cfg.limits, **options)


def _examples(path: str, labelled: bool = True):
    from ..evaluation.examples import read_examples

    try:
        return read_examples(path, labelled=labelled)
    except (OSError, ValueError) as e:
        raise InvalidRequest([FieldViolation("examples", str(e))]) from None


def _say(what: str, t0: float) -> None:
    print(f"decider: {what} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
