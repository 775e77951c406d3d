"""Every parser of outside input, fed generated input (Hypothesis): a --jsonl line, a
request as JSON-shaped data, a request as protobuf (from fields, and from raw bytes),
the CLI's arguments, the config file. Each either gives a valid value or refuses with a
DeciderError naming a field (or the flag, or the key); nothing else escapes.

500 examples a property in CI (conftest.py's "ci" profile, 3,000 in all); the deep run:
    DECIDER_HYPOTHESIS_PROFILE=deep .venv/bin/python -m pytest tests/test_parsers.py
(20,000 a property, 120,000 in all). The run's seed is in pytest's header; a failure
prints its example and a @reproduce_failure blob, and Hypothesis's database (.hypothesis/)
replays it first on the next run.
"""

from __future__ import annotations

import io
import json
import math
import re
import sys
from unittest.mock import patch

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from decider.commands import flag_config
from decider.commands.jsonl import request_at
from decider.commands.parser import parser
from decider.commands.run import run_input
from decider.config import parse_config
from decider.errors import ConfigError, InvalidRequest
from decider.questions import QUESTION_TYPES, Limits, Request, request_from_dict

LIMITS = Limits()

scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                           max_leaves=12)
names = st.sampled_from(["billing", "Billing", "yes", "a", "", " ", "x\ny", "<eos>"]) \
    | st.text(max_size=12)
labels = st.lists(names | st.fixed_dictionaries({}, optional={
    "name": names | json_values, "description": st.text(max_size=12) | json_values}),
    max_size=6) | json_values
questions = st.fixed_dictionaries({}, optional={
    "type": st.sampled_from([*QUESTION_TYPES, "nope"]) | json_values,
    "question": st.text(max_size=30) | json_values,
    "labels": labels, "levels": labels,
    "threshold": st.floats(-1, 2) | json_values,
    "extra": json_values,
})
words = st.text(alphabet=st.characters(exclude_categories=["Cs"]), min_size=1, max_size=30)
good_labels = st.lists(words, min_size=2, max_size=5, unique_by=lambda x: x.strip().casefold())
well_formed = st.fixed_dictionaries({  # valid but for what the text draws (blank, newlines)
    "text": words,
    "questions": st.lists(st.one_of(
        st.fixed_dictionaries({"type": st.just("yes_no"), "question": words},
                              optional={"threshold": st.floats(0, 1)}),
        st.fixed_dictionaries({"type": st.sampled_from(["choice", "multi_label"]),
                               "question": words, "labels": good_labels}),
        st.fixed_dictionaries({"type": st.just("scale"), "question": words,
                               "levels": good_labels})), min_size=1, max_size=3),
}, optional={"instructions": words})
requests = well_formed | st.fixed_dictionaries({}, optional={
    "text": st.text(max_size=60) | json_values,
    "instructions": st.text(max_size=30) | json_values,
    "questions": st.lists(questions, max_size=4) | json_values,
    "unknown": json_values,
})


def valid_or_refused(parse) -> object | None:
    """parse()'s value, which must validate as it is; or None after a refusal that
    names each bad field. Any other exception (another DeciderError too) fails."""
    try:
        value = parse()
    except InvalidRequest as e:
        assert e.violations and all(v.field.strip() and v.description
                                    for v in e.violations), e.violations
        event("refused")  # --hypothesis-show-statistics: the share of each outcome
        return None
    event("valid")
    if isinstance(value, Request):
        assert value.validate(LIMITS) is value
    return value


@given(st.text(max_size=200) | json_values.map(json.dumps) | requests.map(json.dumps))
def test_a_jsonl_line(line):
    valid_or_refused(lambda: request_at(7, line, LIMITS))


@given(requests | json_values)
def test_a_request_as_json_data(data):
    valid_or_refused(lambda: request_from_dict(data, LIMITS))


# -- protobuf ------------------------------------------------------------------------------

pb = pytest.importorskip("decider.v1.decider_pb2")
from decider.service.convert import request_from_proto  # noqa: E402 - the service's parser

wire_text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40)
pb_labels = st.lists(st.builds(pb.Label, name=wire_text, description=wire_text), max_size=5)
thresholds = st.none() | st.floats(allow_nan=True, allow_infinity=True)


def with_threshold(msg, threshold):
    if threshold is not None:
        msg.threshold = threshold
    return msg


pb_kinds = st.one_of(
    st.none(),
    st.builds(lambda t: {"yes_no": with_threshold(pb.YesNo(), t)}, thresholds),
    st.builds(lambda ls: {"choice": pb.Choice(labels=ls)}, pb_labels),
    st.builds(lambda ls, t: {"multi_label": with_threshold(pb.MultiLabel(labels=ls), t)},
              pb_labels, thresholds),
    st.builds(lambda ls: {"scale": pb.Scale(levels=ls)}, pb_labels),
)
pb_questions = st.builds(lambda q, kind: pb.Question(question=q, **(kind or {})),
                         wire_text, pb_kinds)
pb_requests = st.builds(pb.DecideRequest, model=wire_text, text=wire_text,
                        instructions=wire_text, questions=st.lists(pb_questions, max_size=4))


@given(pb_requests)
def test_a_request_as_protobuf(msg):
    valid_or_refused(lambda: request_from_proto(msg).validate(LIMITS))


@given(st.binary(max_size=300) | pb_requests.map(lambda m: m.SerializeToString()))
def test_a_request_from_wire_bytes(data):
    from google.protobuf.message import DecodeError

    try:
        msg = pb.DecideRequest.FromString(data)
    except DecodeError:
        return  # the service's to refuse as INVALID_ARGUMENT, before this parser
    valid_or_refused(lambda: request_from_proto(msg).validate(LIMITS))


# -- the command line ----------------------------------------------------------------------

argv_text = st.text(alphabet=st.characters(exclude_characters="\x00"), max_size=12)
numbers = st.integers(-10**6, 10**6).map(str) | st.floats().map(str) | argv_text
FLAG_VALUES = {
    "--n-ctx": numbers, "--engine": st.sampled_from(["llama", "triton", "", "warp"]) | argv_text,
    "--threads": numbers, "--dtype": st.sampled_from(["float32", "fp8"]),
    "--max-work-tokens": numbers, "--max-queue": numbers, "--max-batch": numbers,
    "--metrics-port": numbers, "--listen": st.sampled_from(
        ["127.0.0.1:50051", "localhost:0", "unix:///tmp/x.sock", "unix://", "nohost"])
    | argv_text, "--log-format": st.sampled_from(["json", "xml"]),
    "-q": argv_text, "-l": argv_text, "--scale": argv_text, "--threshold": numbers,
    "--instructions": argv_text, "--repeat": numbers, "--tokens": numbers,
    "--per-client": numbers, "--timeout": numbers, "--prompt-tokens": numbers,
    "--jsonl": st.sampled_from(["/nonexistent.jsonl", "/", "-"]) | argv_text,
}
flags = st.lists(st.one_of(
    st.sampled_from(sorted(FLAG_VALUES)).flatmap(
        lambda f: FLAG_VALUES[f].map(lambda v: [f, v])),
    st.sampled_from(["--multi", "--json", "-v", "--allow-insecure-tcp"]).map(lambda f: [f]),
    argv_text.map(lambda junk: [junk]),
), max_size=6).map(lambda groups: sum(groups, []))
good_runs = st.tuples(words, words, st.lists(words, max_size=3), st.booleans()).map(
    lambda t: ["run", "gemma-3-270m", t[0], "-q", t[1], *sum((["-l", x] for x in t[2]), []),
               *(["--multi"] if t[3] else [])])
commands = st.sampled_from(["run", "serve", "bench", "models", "pull", "health"])
argvs = good_runs | st.tuples(commands, st.lists(argv_text, max_size=2), flags).map(
    lambda t: [t[0], *(["gemma-3-270m", "some text"] if t[0] == "run" else t[1]), *t[2]])


@given(argvs, st.binary(max_size=40))
def test_the_command_line(argv, stdin):
    """Parsed and checked as `decider` does before anything loads: argparse's refusals
    exit 2 naming the argument; the rest are DeciderErrors naming the flag or field."""
    err = io.StringIO()
    with patch.object(sys, "stderr", err), \
            patch.object(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin))):
        try:
            args = parser().parse_args(argv)
        except SystemExit as e:
            assert e.code in (0, 2)
            assert e.code == 0 or "decider: error: " in err.getvalue()
            return
        try:
            cfg = flag_config(args)
            if args.command == "run":
                valid_or_refused(lambda: run_input(args, cfg.limits))
        except ConfigError as e:
            assert re.match(r"^(--[a-z-]+: |listen address )", e.message), e.message


# -- the config file -----------------------------------------------------------------------

def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) \
            else repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(map(toml_value, v)) + "]"
    return json.dumps(v) if isinstance(v, str) else str(v)


KEYS = ["listen", "max_queue", "max_batch", "grace_seconds", "metrics_port", "log_format",
        "cert", "allow_insecure_tcp", "name", "engine", "n_ctx", "threads", "gpu_layers",
        "dtype", "max_work_tokens", "max_labels", "cache_dir", "colour"]
toml_scalars = (st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats()
                | st.text(max_size=12) | st.sampled_from(["json", "llama", "bfloat16",
                                                          "127.0.0.1:1", "unix:///x.sock"]))
sections = st.dictionaries(
    st.sampled_from(["server", "tls", "model", "limits", "paths", "modle"]),
    st.dictionaries(st.sampled_from(KEYS), toml_scalars | st.lists(toml_scalars, max_size=3),
                    max_size=5), max_size=4)


def toml(doc: dict) -> str:
    return "".join(f"[{name}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in body.items())
                   for name, body in doc.items())


@given(sections.map(toml) | st.text(max_size=80))
def test_the_config_file(text):
    try:
        cfg = parse_config(text, "gen.toml")
    except ConfigError as e:
        assert e.message.startswith("gen.toml: ")
        assert "key" in e.metadata or "not valid TOML" in e.message, e.message
        return
    assert cfg.source == "gen.toml"

