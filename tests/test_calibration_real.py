"""Calibration on a real instruction-tuned model and real labels: SmolLM2-135M-Instruct on
300 of VADER's tweets, fitted on 200, measured on the other 100; and the commands a user
runs (`decider calibrate`, `decider eval`, `decider run --calibration`)."""

from __future__ import annotations

import json
import random

import pytest

from decider.evaluation.calibrate import fit_calibration, score_examples
from decider.evaluation.evaluate import evaluate
from decider.evaluation.examples import parse_examples

pytest.importorskip("scipy", reason="fitting needs the calibrate extra (scipy)")
SEED = 20261205  # which 300 tweets: fixed, so the comparison is the same every run


@pytest.fixture(scope="module")
def tweets(loaded) -> list[str]:
    """300 labelled lines of vader-tweets-positive's training split, drawn with SEED."""
    data = loaded["vader-tweets-positive"]
    print(f"tweets drawn with seed {SEED}")
    return [json.dumps({"text": item.text, "question": data.question, "gold": item.gold})
            for item in random.Random(SEED).sample(data.train, 300)]


@pytest.fixture(scope="module")
def smollm2(smollm2_model, catalog):
    from decider import Decider

    with Decider("smollm2-135m-instruct", catalog=catalog, n_ctx=1024) as d:
        yield d


def test_a_calibration_fitted_on_200_tweets_lowers_the_ece_of_the_other_100(smollm2, tweets):
    examples = parse_examples(tweets)
    scores = score_examples(smollm2, examples)
    fitted = fit_calibration(smollm2, examples[:200], scores[:200])
    [report] = evaluate(examples[200:], scores[200:], fitted.calibration, examples[:200],
                        baseline=False)
    raw, calibrated = report["raw"], report["calibrated"]
    print(f"ECE over {raw['ece_bins']} bins, 100 held-out tweets: raw {raw['ece']:.3f}, "
          f"calibrated ({report['method']}) {calibrated['ece']:.3f}; log loss "
          f"{raw['log_loss']:.3f} -> {calibrated['log_loss']:.3f}")
    assert calibrated["ece"] < raw["ece"]
    assert calibrated["log_loss"] < raw["log_loss"]


def test_calibrate_then_run_and_eval_from_the_command_line(run_cli, smollm2_model, tweets,
                                                            tmp_path):
    (tmp_path / "train.jsonl").write_text("\n".join(tweets[:60]) + "\n")
    (tmp_path / "test.jsonl").write_text("\n".join(tweets[60:90]) + "\n")
    cal = tmp_path / "cal.json"
    done = run_cli("calibrate", "smollm2-135m-instruct", str(tmp_path / "train.jsonl"),
                   "-o", str(cal), "--error-budget", "0.2")
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(cal.read_text())["questions"][0]["examples"] == 60

    done = run_cli("run", "smollm2-135m-instruct", "What a lovely day with friends!",
                   "-q", "Is this tweet positive?", "--calibration", str(cal), "--json")
    assert done.returncode == 0, done.stderr.decode()
    [answer] = json.loads(done.stdout)["answers"]
    assert answer["calibrated"] and 0 <= answer["raw"]["p_yes"] <= 1
    assert answer["p_yes"] != answer["raw"]["p_yes"]

    done = run_cli("eval", "smollm2-135m-instruct", str(tmp_path / "test.jsonl"),
                   "--calibration", str(cal), "--json", "-", "--plots", str(tmp_path))
    assert done.returncode == 0, done.stderr.decode()
    out = done.stdout.decode()
    report = json.loads(out[out.index("\n{") + 1:])["questions"][0]
    assert report["raw"]["n"] == 30 and "calibrated" in report
    assert (tmp_path / report["plot"].rsplit("/", 1)[-1]).stat().st_size > 0

    # the same file on another model is refused, naming what differs
    done = run_cli("run", "gemma-3-270m", "text", "-q", "Is this tweet positive?",
                   "--calibration", str(cal))
    assert done.returncode == 2 and b"CALIBRATION_MISMATCH" in done.stderr
