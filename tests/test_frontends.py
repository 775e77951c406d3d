"""`decider serve --frontends N`: extra front-end processes share the TCP listener with
the daemon process and send their work to the one engine process. The real daemon, the
real gemma-3-270m, loopback TCP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import grpc
import pytest

from decider import YesNo
from decider.client import DeciderClient
from helpers.daemon import DECIDER, alive, free_port, health_status, spawn

QUESTIONS = [YesNo("Is this about money?"), YesNo("Is the customer unhappy?")]
TEXTS = ["I was charged twice.", "My parcel is late.", "Thanks, all good!"]


def worker_pids(daemon) -> list[int]:
    """The extra front-end processes, as each one logs itself once it serves."""
    return [json.loads(line)["pid"] for line in daemon.log().splitlines()
            if '"front-end process serving"' in line]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, model_path):
    d = spawn(tmp_path_factory.mktemp("frontends"), "--n-ctx", "2048", "--frontends", "2",
              address=f"127.0.0.1:{free_port()}")
    deadline = time.monotonic() + 60
    while not worker_pids(d) and time.monotonic() < deadline:
        time.sleep(0.1)
    yield d
    if d.proc.poll() is None:
        assert d.stop() == 0


def test_every_connection_is_answered_as_the_in_process_api_answers(daemon, decider):
    """24 fresh connections (the kernel spreads them over both processes), each asking
    every case: the answers are the in-process API's, exactly (one job to an engine call:
    the llama.cpp CPU engine's arithmetic is the same)."""
    assert len(worker_pids(daemon)) == 1
    want = {(t, q.question): decider.decide(t, [q]).answers[0].p_yes
            for t in TEXTS for q in QUESTIONS}
    for _ in range(24):
        with DeciderClient(daemon.address, timeout=120) as client:
            for (text, question), p_yes in want.items():
                got = client.decide(text, [YesNo(question)]).answers[0].p_yes
                assert got == p_yes, (text, question)


def test_a_front_end_process_that_dies_ends_the_service_for_systemd_to_restart(daemon):
    """Its share of the listener would be gone: the daemon exits 1, and takes the
    engine process and the other front ends with it."""
    [worker] = worker_pids(daemon)
    others = [pid for pid in daemon.children() if pid != worker]
    os.kill(worker, signal.SIGKILL)
    assert daemon.proc.wait(60) == 1
    assert "a front-end process ended" in daemon.log()
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in others) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in others if alive(pid)]


def test_front_end_processes_need_tcp_listeners(tmp_path):
    """A unix socket cannot be shared: refused before any model loads, naming the key."""
    out = subprocess.run([*DECIDER, "serve", "--listen", f"unix://{tmp_path}/d.sock",
                          "--frontends", "2"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "server.frontends 2 needs TCP listeners" in out.stderr
    with pytest.raises(grpc.RpcError):
        health_status(f"unix://{tmp_path}/d.sock", timeout=0.5)
