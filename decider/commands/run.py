"""`decider run`: one request from TEXT and the question flags, --jsonl lines, or a
System One request file; in this process or against a daemon (--server)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import TYPE_CHECKING

from ..errors import DeciderError, FieldViolation, InvalidRequest
from ..questions import Choice, Label, Limits, MultiLabel, Question, Request, Scale, YesNo
from . import EXIT_OK, exit_code, flag_config, jsonl, load_options

if TYPE_CHECKING:
    from ..config import Config

def _label(spec: str) -> Label:
    name, _, description = spec.partition("=")
    return Label(name, description)


def _question(args: argparse.Namespace) -> Question:
    return replace(_typed_question(args), abstain_below=args.abstain_below,
                   min_label_mass=args.min_label_mass)


def _typed_question(args: argparse.Namespace) -> Question:
    if args.scale and args.label:
        raise InvalidRequest([FieldViolation("--scale", "cannot be combined with --label")])
    if args.multi and not args.label:
        raise InvalidRequest([FieldViolation("--multi", "needs at least one --label")])
    q = args.question or ""
    if args.scale:
        return Scale(q, [_label(s) for s in args.scale])
    if args.label and args.multi:
        return MultiLabel(q, [_label(s) for s in args.label], args.threshold)
    if args.label:
        return Choice(q, [_label(s) for s in args.label])
    return YesNo(q, args.threshold)


def _read_text(arg: str | None) -> str:
    if arg is not None and arg != "-":
        return arg
    if arg is None and sys.stdin.isatty():
        raise InvalidRequest([FieldViolation("text", "give TEXT, '-', or pipe it on stdin")])
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidRequest([FieldViolation("text", f"is not valid UTF-8 ({e.reason} "
                                              f"at byte {e.start})")]) from e


def _format(decision) -> str:
    return "\n".join(a.text() for a in decision.answers)


def _worst(errors: list[DeciderError]) -> int:
    return max(map(exit_code, errors), default=EXIT_OK)


def run_input(args: argparse.Namespace, limits: Limits) -> list[str] | Request:
    """What `run` answers, read and checked before any model loads: the --jsonl lines,
    or the one request of TEXT and the question flags."""
    if args.jsonl:
        if args.text is not None or args.question is not None:
            raise InvalidRequest([FieldViolation("--jsonl", "cannot be combined with TEXT or "
                                                 "--question: each line carries its own")])
        return jsonl.read_lines(args.jsonl)
    if args.question is None:
        raise InvalidRequest([FieldViolation("--question", "is required (or use --jsonl)")])
    return Request(_read_text(args.text), (_question(args),), args.instructions
                   ).validate(limits)


def cmd_run(args: argparse.Namespace) -> int:
    from ..api import Decider  # loads numpy and the engine registry only when needed

    cfg = flag_config(args)
    if args.systemone:
        return _run_systemone(args, cfg)
    work = run_input(args, cfg.limits)
    if args.server:
        return _run_remote(args, work)
    with Decider(args.model, limits=cfg.limits, **load_options(cfg)) as decider:
        if isinstance(work, list):
            return _worst(jsonl.answer(decider.decide_request, work, cfg.limits))
        decision = decider.decide_request(work)
    print(json.dumps(decision.to_dict(), indent=2) if args.json else _format(decision))
    return EXIT_OK


def _run_remote(args: argparse.Namespace, work: list[str] | Request) -> int:
    from ..client import DeciderClient

    with DeciderClient(args.server, timeout=args.timeout) as client:
        if isinstance(work, list):
            return _worst(jsonl.answer(lambda req: client.decide_request(req, args.model),
                                       work, Limits()))  # and the daemon's own limits
        decision = client.decide_request(work, args.model)
    print(json.dumps(decision.to_dict(), indent=2) if args.json else _format(decision))
    return EXIT_OK


def _run_systemone(args: argparse.Namespace, cfg: Config) -> int:
    from ..api import Decider
    from ..systemone.mapping import parse_body

    if args.text is not None or args.question is not None or args.jsonl or args.server:
        raise InvalidRequest([FieldViolation("--systemone", "cannot be combined with TEXT, "
                              "--question, --jsonl or --server: the file is the request (a "
                              "daemon takes it at POST /v1/systemone)")])
    raw = jsonl.read_file(args.systemone, "--systemone")
    parse_body(raw)  # refuse a bad file before loading the model
    with Decider(args.model, limits=cfg.limits, **load_options(cfg)) as decider:
        print(json.dumps(decider.decide_systemone(raw), indent=2, ensure_ascii=False))
    return EXIT_OK
