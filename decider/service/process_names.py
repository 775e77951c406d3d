"""The names the daemon's child processes carry in the kernel (`ps`, `top`,
/proc/PID/comm): the daemon keeps its executable's, its children say what they are, so an
operator and a benchmark can tell the engine's CPU from the front ends'."""

from __future__ import annotations

import sys

ENGINE = "decider-engine"
FRONT_END = "decider-front"
_PR_SET_NAME = 15  # prctl(2); the kernel keeps 15 bytes


def name_this_process(name: str) -> None:
    """Called first thing in the child: the main thread's name is the process's."""
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None).prctl(_PR_SET_NAME, name.encode()[:15])
