"""`decider run --jsonl`: one JSON request a line in, one JSON line out for each, in order,
each carrying its line number: the decision, or {"line": N, "error": ...} for a blank
line, bad JSON or a bad field. Only an engine that returned no logits stops the run."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from ..answers import Decision
from ..errors import DeciderError, FieldViolation, InvalidRequest
from ..questions import Limits, Request, request_from_dict


def read_file(path: str, flag: str) -> bytes:
    """The bytes of `path` ('-': stdin), refused naming `flag` if unreadable."""
    try:
        return sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as e:
        raise InvalidRequest([FieldViolation(flag, f"cannot read {path}: {e.strerror}")]
                             ) from None


def read_lines(path: str) -> list[str]:
    """The lines of `path` ('-': stdin), refused as a whole if unreadable or not UTF-8."""
    raw = read_file(path, "--jsonl")
    try:
        return raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise InvalidRequest([FieldViolation("--jsonl", f"is not valid UTF-8 (byte {e.start})")]
                             ) from None


def request_at(n: int, line: str, limits: Limits) -> Request:
    """Line n as a validated request."""
    if not line.strip():
        raise InvalidRequest([FieldViolation(f"line {n}", "is blank: give a JSON request")])
    try:
        data = json.loads(line)
    except (json.JSONDecodeError, RecursionError) as e:
        why = e.msg if isinstance(e, json.JSONDecodeError) else "nested too deeply"
        raise InvalidRequest([FieldViolation(f"line {n}", f"not JSON: {why}")]) from None
    return request_from_dict(data, limits)


def answer(decide: Callable[[Request], Decision], lines: Sequence[str],
           limits: Limits) -> list[DeciderError]:
    """Print an output line for every input line; return the errors of the lines refused."""
    errors = []
    for n, line in enumerate(lines, 1):
        try:
            out = decide(request_at(n, line, limits)).to_dict()
        except DeciderError as e:
            if e.reason == "ENGINE_RETURNED_NO_LOGITS":
                raise  # the engine is broken: do not answer the rest from it
            out = {"error": error_dict(e)}
            errors.append(e)
        print(json.dumps({"line": n, **out}, ensure_ascii=False), flush=True)
    return errors


def error_dict(e: DeciderError) -> dict:
    out = {"reason": e.reason, "message": e.message, **e.metadata}
    if getattr(e, "violations", ()):  # InvalidRequest, or a daemon's (RemoteError)
        out["violations"] = [{"field": v.field, "description": v.description}
                             for v in e.violations]
    return out
