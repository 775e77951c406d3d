"""Labelled examples: what `decider calibrate` fits on and `decider eval` measures.

One JSON object a line, a question asked about a text and its right answer, in either
of the two ways decider is asked:
  {"text": ..., "instructions": ..., "question": {decider's question JSON}, "gold": ...}
  {"state": ..., "question": {a System One question: noul, choice, score}, "gold": ...}
gold: "yes"/"no" or a boolean (yes/no, noul); a label or level name (choice, scale); a
level's index (score); the list of labels that apply (multi_label). Examples of many
questions may share a file: each question is fitted on its own examples.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidRequest
from ..questions import Limits, Question, Request, request_from_dict


@dataclass(frozen=True, slots=True)
class Example:
    line: int  # in its file, from 1
    request: Request  # the text and its one question
    expected: tuple[str, ...]  # the answer each of the question's branches should give

    @property
    def question(self) -> Question:
        return self.request.questions[0]


def read_examples(path: str | Path, limits: Limits = Limits(),
                  labelled: bool = True) -> list[Example]:
    """Every example of a JSONL file; ValueError naming the line and the field at the
    first bad one (a labelled set with holes would measure something else). Unlabelled
    (contextual calibration): no gold needed, none read."""
    with open(path, encoding="utf-8") as f:
        return parse_examples(f, str(path), limits, labelled)


def parse_examples(lines: Iterable[str], origin: str = "examples",
                   limits: Limits = Limits(), labelled: bool = True) -> list[Example]:
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(_example(number, json.loads(line), limits, labelled))
        except InvalidRequest as e:
            raise ValueError(f"{origin}:{number}: {e.message}") from None
        except (ValueError, TypeError) as e:
            raise ValueError(f"{origin}:{number}: {e}") from None
    if not out:
        raise ValueError(f"{origin}: no examples")
    return out


def _example(number: int, data: object, limits: Limits, labelled: bool) -> Example:
    if not isinstance(data, dict) or "question" not in data or (labelled and "gold" not in
                                                                 data):
        raise ValueError('each line is {"text" or "state", "question", "gold"}')
    gold = data.get("gold")
    if "state" in data:
        request = _systemone_request(data["state"], data["question"])
        if request.questions[0].type == "scale" and isinstance(gold, int):
            gold = str(gold)  # a score's levels are named by their index
    else:
        unknown = set(data) - {"text", "instructions", "question", "gold"}
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)}")
        request = request_from_dict({"text": data.get("text", ""),
                                     "instructions": data.get("instructions", ""),
                                     "questions": [data["question"]]}, limits)
    request.validate(limits)
    return Example(number, request, request.questions[0].expected(gold) if labelled else ())


def _systemone_request(state: object, question: object) -> Request:
    from ..systemone.mapping import parse_body, to_decider

    return to_decider(parse_body({"state": state, "questions": {"q": question}})).request
