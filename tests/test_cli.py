"""`decider run` end to end: the real executable, the real gemma-3-270m on the CPU."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from decider import Choice, Label, MultiLabel, Scale, YesNo

SCHEMA = json.loads((Path(__file__).parents[1] / "docs" / "decision.schema.json").read_text())
TEXT = "I was charged twice for my order, please refund me."
N_CTX = "2048"  # the `decider` fixture's window: same window, same logits

QUESTIONS = {
    "yes_no": (["-q", "Does the customer request a refund?"],
               YesNo("Does the customer request a refund?")),
    "choice": (["-q", "What is the topic?", "-l", "billing", "-l", "shipping=parcels and delivery",
                "-l", "technical problem"],
               Choice("What is the topic?", ["billing", Label("shipping", "parcels and delivery"),
                                            "technical problem"])),
    "multi_label": (["-q", "Which apply?", "--multi", "-l", "refund", "-l", "angry customer",
                     "--threshold", "0.6"],
                    MultiLabel("Which apply?", ["refund", "angry customer"], threshold=0.6)),
    "scale": (["-q", "How urgent is it?", "--scale", "low", "--scale", "medium", "--scale", "high"],
              Scale("How urgent is it?", ["low", "medium", "high"])),
}


def distributions(answer: dict) -> list[dict[str, float]]:
    if answer["type"] == "yes_no":
        return [{"yes": answer["p_yes"], "no": 1 - answer["p_yes"]}]
    if answer["type"] == "multi_label":
        return [{"yes": d["p"], "no": 1 - d["p"]} for d in answer["labels"]]
    return [answer["probabilities"]]


@pytest.mark.parametrize("kind", list(QUESTIONS))
def test_each_question_type_through_the_cli_matches_the_python_api(kind, run_cli, decider):
    flags, question = QUESTIONS[kind]
    out = run_cli("run", "gemma-3-270m", TEXT, *flags, "--json", "--n-ctx", N_CTX)
    assert out.returncode == 0, out.stderr.decode()
    decision = json.loads(out.stdout)
    jsonschema.validate(decision, SCHEMA)
    [answer] = decision["answers"]
    assert answer["type"] == kind
    for dist in distributions(answer):
        assert all(math.isfinite(p) and 0 <= p <= 1 for p in dist.values())
        assert sum(dist.values()) == pytest.approx(1.0, abs=1e-9)
    assert 0 < answer["label_mass"] <= 1

    api = decider.decide(TEXT, [question]).to_dict()
    [api_answer] = api["answers"]
    assert api_answer.keys() == answer.keys()
    for got, want in zip(distributions(answer), distributions(api_answer)):
        assert got == pytest.approx(want, abs=1e-6)
    for key in ("decision", "label", "chosen", "level"):
        assert answer.get(key) == api_answer.get(key)


def test_an_answer_below_the_thresholds_abstains_and_says_why(run_cli):
    out = run_cli("run", "gemma-3-270m", TEXT, "-q", "Is this about billing?",
                  "--abstain-below", "0.999", "--min-label-mass", "0.999", "--json",
                  "--n-ctx", N_CTX)
    assert out.returncode == 0, out.stderr.decode()
    [answer] = json.loads(out.stdout)["answers"]
    assert answer["abstained"] and not answer["calibrated"] and answer["raw"] is None
    sure = max(answer["p_yes"], 1 - answer["p_yes"])
    assert answer["abstain_reason"] == (f"confidence {sure:.3f} below 0.999; label mass "
                                        f"{answer['label_mass']:.3f} below 0.999")


def test_plain_output_answers_in_words(run_cli):
    out = run_cli("run", "gemma-3-270m", TEXT, "-q", "Is this about money?")
    assert out.returncode == 0, out.stderr.decode()
    lines = out.stdout.decode().splitlines()
    assert lines[0] == "Is this about money?"
    assert lines[1].split()[0] in ("yes", "no") and "p_yes" in lines[1]
    assert out.stderr == b""  # nothing but answers unless asked (-v)


def test_text_from_stdin(run_cli):
    piped = run_cli("run", "gemma-3-270m", "-q", "Is this about money?", "--json",
                    stdin=TEXT.encode())
    dash = run_cli("run", "gemma-3-270m", "-", "-q", "Is this about money?", "--json",
                   stdin=TEXT.encode())
    given = run_cli("run", "gemma-3-270m", TEXT, "-q", "Is this about money?", "--json")
    assert piped.returncode == dash.returncode == given.returncode == 0
    assert json.loads(piped.stdout) == json.loads(dash.stdout) == json.loads(given.stdout)


def test_over_the_window_exits_1_with_the_counts_and_runs_no_pass(run_cli, fault_file):
    fault_file.write_text("oom")  # any pass that starts takes this file and fails with OOM
    out = run_cli("run", "gemma-3-270m", "many words " * 60, "-q", "Is it long?",
                  "--n-ctx", "64")
    assert out.returncode == 1
    err = out.stderr.decode()
    assert "PROMPT_TOO_LONG" in err and "n_ctx=64" in err
    assert int(err.split("prompt is ")[1].split()[0]) > 64
    assert out.stdout == b""
    assert fault_file.exists()  # no engine pass began


@pytest.mark.parametrize("fault", ["zero-logits", "skip-decode"])
def test_a_pass_that_writes_no_logits_gives_the_explicit_error(run_cli, fault_file, fault):
    fault_file.write_text(fault)
    out = run_cli("run", "gemma-3-270m", TEXT, "-q", "Is this about money?", "--json")
    assert out.returncode == 1
    assert out.stdout == b""  # no answer
    err = out.stderr.decode()
    assert "ENGINE_RETURNED_NO_LOGITS" in err
    assert "the engine returned no logits: the GPU pass failed, most likely out of memory" in err
    assert not fault_file.exists()


def test_a_stale_row_from_the_previous_request_is_refused(decider, fault_file):
    from decider.errors import EngineNoLogits

    q = [YesNo("Is this about money?")]
    decider.decide("The invoice shows a double charge.", q)
    fault_file.write_text("stale-logits")  # the next pass leaves the buffer as it was
    with pytest.raises(EngineNoLogits, match="previous pass"):
        decider.decide("My parcel is lost.", q)
    decider.decide("My parcel is lost.", q)  # the engine itself is fine afterwards


HUGE = "x" * (256 * 1024 + 1)


@pytest.mark.parametrize(
    "args, stdin, words",
    [
        (["run", "gemma-3-270m", "", "-q", "Q?"], None, "text: must not be empty"),
        (["run", "gemma-3-270m", "text"], None, "--question: is required"),
        (["run", "gemma-3-270m", "text", "-q", ""], None,
         "questions[0].question: must not be empty"),
        (["run", "gemma-3-270m", "t", "-q", "Q?", "-l", "a", "-l", "A"], None, "duplicates"),
        (["run", "gemma-3-270m", "t", "-q", "Q?", "-l", "a", "-l", ""], None,
         "labels[1]: must not be empty"),
        (["run", "gemma-3-270m", "t", "-q", "Q?", "-l", "only"], None, "needs at least 2, got 1"),
        (["run", "gemma-3-270m", "t", "-q", "Q?", *sum((["-l", f"l{i}"] for i in range(257)), [])],
         None, "257 given, over the limit of 256"),
        (["run", "gemma-3-270m", "t", "-q", "Q?", "--multi", "-l", "a", "--threshold", "1.5"],
         None, "threshold: must be a number in [0, 1]"),
        (["run", "gemma-3-270m", "-", "-q", "Q?"], HUGE.encode(), "over the limit of 262144"),
        (["run", "gemma-3-270m", "-", "-q", "Q?"], b"caf\xe9 \xff", "text: is not valid UTF-8"),
        (["run", "gemma-3-270m", b"caf\xe9", "-q", "Q?"], None, "text: is not valid UTF-8"),
        (["run", "no-such-model", "t", "-q", "Q?"], None, "MODEL_NOT_FOUND: unknown model"),
        (["run", "/no/such/model.gguf", "t", "-q", "Q?"], None,
         "MODEL_NOT_FOUND: model path '/no/such/model.gguf' does not exist"),
        (["run", "gemma-3-270m", "t", "-q", "Q?", "--engine", "warp"], None,
         "--engine: must be one of llama, triton, reference, got 'warp'"),
        (["run", "gemma-3-270m", "t", "-q", "Q?", "--n-ctx", "31"], None,
         "--n-ctx: must be at least 32"),
        (["run", "gemma-3-270m", "t", "-q", "Q?", "--n-ctx", "40000"], None,
         "n_ctx must be in [32, 32768]"),
        (["run", "gemma-3-270m", "t", "-q", "Q?", "--scale", "a", "-l", "b"], None,
         "--scale: cannot be combined with --label"),
        (["run", "gemma-3-270m", "t", "-q", "Q?", "--bogus"], None, "unrecognized arguments"),
        (["run", "gemma-3-270m", "t", "-q", "Q?", "--abstain-below", "1.5"], None,
         "questions[0].abstain_below: must be a number in [0, 1], got 1.5"),
        (["run", "gemma-3-270m", "t", "-q", "Q?", "--calibration", "/no/such.json"], None,
         "cannot read the calibration /no/such.json"),
        (["run", "gemma-3-270m", "t", "-q", "Q?", "--dtype", "bfloat16"], None,
         "the llama engine has no option 'dtype'"),
        (["run", "gemma-3-270m", "t", "-q", "Q?", "--dtype", "fp8"], None,
         "--dtype: invalid choice: 'fp8'"),
        (["bench", "--engines", "triton", "--prompt-tokens", "120,x"], None,
         "--prompt-tokens: '120,x': give whole numbers of at least 10"),
        (["bench", "--engines", "triton", "--prompt-tokens", "9"], None,
         "--prompt-tokens: '9': give whole numbers of at least 10"),
    ],
)
def test_bad_input_exits_2_naming_the_field_and_the_limit(run_cli, args, stdin, words):
    out = run_cli(*args, stdin=stdin)
    assert out.returncode == 2, out.stderr.decode()
    assert words in out.stderr.decode()
    assert out.stdout == b""


def test_every_jsonl_line_is_answered_in_order_with_its_number(run_cli, tmp_path):
    lines = [
        {"text": "fine", "questions": [{"question": "ok?"}]},
        {"text": "t", "questions": [{"question": f"q{i}?"} for i in range(33)]},
        {"text": "long " * 100, "questions": [{"question": "long?"}]},
        "not json",
        "",
        {"text": "t", "questions": [{"type": ["yes_no"], "question": "q?"}]},
        {"a": 1},
        {"text": "t", "questions": [{"type": {"a": 1}}]},
        "   ",
        {"text": "last", "questions": [{"question": "ok?"}]},
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    out = run_cli("run", "gemma-3-270m", "--jsonl", str(path), "--n-ctx", "64")
    assert out.returncode == 2, out.stderr.decode()  # the worst line: a validation error
    assert b"Traceback" not in out.stderr
    got = [json.loads(x) for x in out.stdout.decode().splitlines()]
    assert [g["line"] for g in got] == list(range(1, len(lines) + 1))
    first, second, third, fourth, fifth, sixth, seventh, eighth, ninth, last = got
    jsonschema.validate(first, SCHEMA)
    jsonschema.validate(last, SCHEMA)
    assert second["error"]["reason"] == "INVALID_REQUEST"
    assert "33 questions, over the limit of 32" in second["error"]["message"]
    assert third["error"]["reason"] == "PROMPT_TOO_LONG"
    assert third["error"]["n_ctx"] == "64" and int(third["error"]["prompt_tokens"]) > 64
    assert fourth["error"]["violations"][0]["field"] == "line 4"
    assert fifth["error"]["violations"][0]["field"] == "line 5"
    assert ninth["error"]["violations"][0]["field"] == "line 9"
    assert sixth["error"]["violations"][0]["field"] == "questions[0].type"
    assert eighth["error"]["violations"][0]["field"] == "questions[0].type"
    assert {v["field"] for v in seventh["error"]["violations"]} == {"a", "questions", "text"}


def test_answers_do_not_depend_on_label_order(decider):
    labels = ["billing", "shipping", "technical problem", "account"]
    a = decider.decide(TEXT, [Choice("Topic?", labels), MultiLabel("Which?", labels)])
    b = decider.decide(TEXT, [Choice("Topic?", labels[::-1]), MultiLabel("Which?", labels[::-1])])
    assert a.answers[0].probabilities == b.answers[0].probabilities
    assert list(b.answers[0].probabilities) == labels[::-1]  # reported in the order given
    assert ({d.label: d.p for d in a.answers[1].labels}
            == {d.label: d.p for d in b.answers[1].labels})


# llama.cpp's logits move with how tokens are grouped into one decode (CPU flash
# attention past 64 tokens a batch): up to 0.05 in a probability (docs/design.md, "The
# llama.cpp engine"), 0.054 measured here for the same prompt batched differently.
P_TOL = 0.08


def test_several_questions_share_one_prefix_and_match_separate_requests(decider):
    questions = [q for _, q in QUESTIONS.values()]
    together = decider.decide(TEXT, questions)
    for q, answer in zip(questions, together.answers):
        [alone] = decider.decide(TEXT, [q]).answers
        a, b = alone.to_dict(), answer.to_dict()
        for got, want in zip(distributions(b), distributions(a)):
            assert got == pytest.approx(want, abs=P_TOL)
    assert together.usage.prompt_tokens < sum(
        decider.decide(TEXT, [q]).usage.prompt_tokens for q in questions)


def test_the_python_api_writes_nothing_but_what_the_caller_prints(model_path):
    """Its logs go to stderr; stdout is the application's."""
    code = ("from decider import Decider, YesNo\n"
            "with Decider('gemma-3-270m', n_ctx=256) as d:\n"
            "    print(d.decide('I was charged twice', [YesNo('Refund?')]).answers[0].decision)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120,
                         env=os.environ.copy())
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode().strip() in ("True", "False")
    assert "model loaded" in out.stderr.decode()


def test_the_readmes_example_files_ship_and_run_as_written(run_cli):
    root = Path(__file__).parents[1]
    readme = (root / "README.md").read_text()
    assert ". .venv/bin/activate" in readme  # how a bare `decider` gets on PATH
    ticket, requests = root / "examples" / "ticket.txt", root / "examples" / "requests.jsonl"
    assert f"cat {ticket.relative_to(root)} | decider run" in readme
    assert f"--jsonl {requests.relative_to(root)}" in readme
    out = run_cli("run", "gemma-3-270m", "--jsonl", str(requests))
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    got = [json.loads(x) for x in out.stdout.decode().splitlines()]
    assert [g["line"] for g in got] == [1, 2, 3]
    for g in got:
        jsonschema.validate(g, SCHEMA)
    out = run_cli("run", "gemma-3-270m", "-q", "Is a refund requested?", "--json",
                  stdin=ticket.read_bytes())
    assert out.returncode == 0 and json.loads(out.stdout)["answers"][0]["type"] == "yes_no"
    systemone = root / "examples" / "systemone.json"
    assert f"--systemone {systemone.relative_to(root)}" in readme
    out = run_cli("run", "gemma-3-270m", "--systemone", str(systemone))
    assert out.returncode == 0, out.stderr.decode()
    assert set(json.loads(out.stdout)["answers"]) == {"refund", "topic", "urgency"}
