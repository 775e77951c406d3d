"""A running daemon's processes seen through /proc: which are front ends and which the
engine (by the names decider/service/process_names.py gives them), and the CPU time each
has spent, so that a benchmark can say what a request costs in each."""

from __future__ import annotations

import os
from pathlib import Path

from ..config import socket_path
from ..service.listeners import peer_pid
from ..service.process_names import ENGINE, FRONT_END

_TICK = os.sysconf("SC_CLK_TCK")


def read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError:  # the process ended
        return b""


def children(pid: int) -> list[int]:
    return sorted(int(k) for t in Path(f"/proc/{pid}/task").glob("*/children")
                  for k in read(str(t)).split())


def _stat(pid: int) -> list[bytes]:
    """/proc/PID/stat's fields after the name: state first, utime 12th, stime 13th."""
    return read(f"/proc/{pid}/stat").rsplit(b")", 1)[-1].split()


def name(pid: int) -> str:
    """Its name; "" once it has ended, a zombie (killed, not yet reaped) included."""
    state = _stat(pid)
    return read(f"/proc/{pid}/comm").decode().strip() if state and state[0] != b"Z" else ""


def roles(pid: int) -> dict[str, list[int]]:
    """The daemon's front ends (itself and its front-end workers) and engine processes."""
    kids = children(pid)
    return {"front ends": [pid, *(k for k in kids if name(k) == FRONT_END)],
            "engine": [k for k in kids if name(k) == ENGINE]}


def daemon_of(pid: int) -> int:
    """The daemon a process belongs to: itself, or the parent of one of its children."""
    if name(pid) in (ENGINE, FRONT_END):
        return int(_stat(pid)[1])
    return pid


def cpu_seconds(pids: list[int]) -> float:
    """CPU time of these processes so far: their live threads' in nanoseconds (schedstat),
    where the kernel keeps it; else utime and stime in ticks (10 ms: a bare server's
    hundred calls can cost less than one)."""
    total = 0.0
    for pid in pids:
        threads = [read(str(t)).split() for t in Path(f"/proc/{pid}/task").glob("*/schedstat")]
        if any(threads):  # a thread that just ended reads empty
            total += sum(int(t[0]) for t in threads if t) / 1e9
        elif len(fields := _stat(pid)) > 12:
            total += (int(fields[11]) + int(fields[12])) / _TICK
    return total


def daemon_pid(address: str) -> int | None:
    """The daemon serving a unix:// address (None for a TCP one: give its pid)."""
    if not address.startswith("unix:"):
        return None
    pid = peer_pid(str(socket_path(address)))
    return daemon_of(pid) if pid else None
