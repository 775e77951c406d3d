"""Content (a state, an instruction, a criterion) rendered into prompt text, deterministically:
the same JSON value always gives the same text, object keys in the order given.

Text stays as it is. An object or an array becomes JSON, indented by two spaces, so a
question can name a field as a path in backticks (`ticket.messages[0].text`) and the model
sees that path in the text. Option and level descriptions must stay on one line (they
are listed one a line): their whitespace runs become single spaces, and JSON is written
compactly.
"""

from __future__ import annotations

import json
import math

from .schema import Content

JSON_ERROR = "holds a non-finite number (NaN or Infinity), which JSON does not allow"


def content_text(value: Content) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, indent=2)


def content_line(value: Content | None) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return " ".join(value.split())
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def is_empty(value: Content) -> bool:
    return not value.strip() if isinstance(value, str) else not value


def non_finite(value: object) -> bool:
    """Whether a parsed JSON value holds NaN or an infinity (Python's parsers accept them)."""
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return True
        if isinstance(v, dict):
            todo.extend(v.values())
        elif isinstance(v, (list, tuple)):
            todo.extend(v)
    return False
