"""The one test hook for engine faults. It does nothing unless DECIDER_FAULT_FILE is set.

A test sets DECIDER_FAULT_FILE to a path and writes a fault name into that file; the next
engine pass takes the file (reads and deletes it) and misbehaves once, the way a failed
GPU pass does. Works across processes (CLI, daemon) and at any moment of their life.

Faults:
  skip-decode   the pass reports success but never runs: the output buffer keeps
                whatever it held (the engine's sentinel, if it poisons)
  zero-logits   the rows read back are zeros, as from a freshly allocated buffer
  stale-logits  the rows read back are the previous pass's, as from a buffer nobody wrote
  oom           the pass raises the engine's out-of-memory error
  hang:SECONDS  the pass stalls that long before running
"""

from __future__ import annotations

import os
import time

from decider.errors import EngineOutOfMemory

FAULTS = ("skip-decode", "zero-logits", "stale-logits", "oom", "hang")


def take_fault() -> tuple[str, float] | None:
    """The pending fault (name, argument), consumed; None outside tests."""
    path = os.environ.get("DECIDER_FAULT_FILE")
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            spec = f.read().strip()
        os.unlink(path)
    except FileNotFoundError:
        return None
    name, _, arg = spec.partition(":")
    if name not in FAULTS:
        raise ValueError(f"DECIDER_FAULT_FILE names unknown fault {spec!r}; one of {FAULTS}")
    return name, float(arg or 0)


def begin_pass(engine: str) -> str | None:
    """Take the pending fault at the start of an engine pass: stall for `hang`, raise for
    `oom`, and return the name of a fault the pass itself must act out (or None)."""
    fault = take_fault()
    if fault is None:
        return None
    name, arg = fault
    if name == "hang":
        time.sleep(arg)
        return None
    if name == "oom":
        raise EngineOutOfMemory(f"the {engine} engine ran out of memory (injected fault)")
    return name
