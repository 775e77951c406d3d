"""`decider serve --frontends N`: extra front-end processes share the TCP listener with
the daemon process and send their work to the one engine process. The real daemon, the
real gemma-3-270m, loopback TCP."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import grpc
import pytest

from decider import YesNo
from decider.bench import processes
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
    yield d
    if d.proc.poll() is None:
        assert d.stop() == 0


def test_the_daemon_is_ready_once_every_front_end_listens(daemon):
    """Readiness is the whole capacity (a balancer sends its share at once): the extra
    front end, started while the model loaded, said it listens before the daemon said it
    serves, and health answered SERVING only after that."""
    events = [json.loads(line)["event"] for line in daemon.log().splitlines()
              if line.startswith("{")]
    assert events.index("front-end process serving") < events.index("serving")


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


def test_every_front_end_applies_the_daemons_calibration_and_abstention(tmp_path, decider):
    """A calibration in the config reaches every front-end process (it travels with the
    model's facts): over gRPC each answer is the in-process raw answer, calibrated by the
    file's map, with the raw one beside it; a request's abstain_below abstains remotely."""
    from dataclasses import replace

    from decider.calibration import Calibration
    from decider.evaluation.calibrate import contextual_calibration
    from decider.questions import Scored

    calibration = contextual_calibration(decider, QUESTIONS)
    calibration.save(tmp_path / "c.json")
    d = spawn(tmp_path, "--n-ctx", "2048", "--frontends", "2", "--calibration",
              str(tmp_path / "c.json"), address=f"127.0.0.1:{free_port()}")
    try:
        for _ in range(6):  # fresh connections: the kernel spreads them over both processes
            with DeciderClient(d.address, timeout=120) as client:
                for q in QUESTIONS:
                    raw = decider.decide(TEXTS[0], [q]).answers[0]
                    got = client.decide(TEXTS[0], [replace(q, abstain_below=0.999)]).answers[0]
                    adjust = Calibration.load(tmp_path / "c.json").lookup(q).branches[0]
                    want = adjust.apply(Scored({"yes": raw.p_yes, "no": 1 - raw.p_yes}, 1.0))
                    assert got.calibrated and got.raw.p_yes == raw.p_yes
                    assert got.p_yes == pytest.approx(want.probabilities["yes"], abs=1e-12)
                    assert got.abstained and got.abstain_reason.startswith("confidence ")
    finally:
        assert d.stop() == 0


def test_the_processes_say_their_role_and_the_bench_costs_each_against_bare_servers(
        tmp_path, tiny, run_cli):
    """The kernel names the engine process and the front-end worker (ps, top); `decider
    bench --server` reads their CPU from /proc and, under the same load, a bare gRPC and
    a bare uvicorn server's, alone and with a hop to another process per call: every
    figure measured, none zero (the threads' CPU read in nanoseconds: in 10 ms ticks a
    bare server's hundred calls could read as none). The tiny model: the service's cost,
    not the model's."""
    http = f"127.0.0.1:{free_port()}"
    d = spawn(tmp_path, "--model", str(tiny), "--threads", "1", "--frontends", "2",
              "--http", http, address=f"127.0.0.1:{free_port()}")
    try:
        roles = processes.roles(d.proc.pid)
        assert sorted(roles["front ends"]) == sorted([d.proc.pid, *worker_pids(d)])
        [engine] = roles["engine"]
        assert processes.name(engine) == "decider-engine"
        for address, model in ((d.address, [str(tiny), "--max-batch", "8"]),
                               (f"http://{http}", [])):
            done = run_cli("bench", *model, "--server", address, "--pid", str(d.proc.pid),
                           "--clients", "1,8", "--per-client", "25", "--client-processes", "2")
            assert done.returncode == 0, done.stderr.decode()
            out = done.stdout.decode()
            table = out[out.index("CPU ms per request"):].splitlines()[2:4]
            assert [row.split()[0] for row in table] == ["1", "8"], out
            for row in table:
                front, engine_ms, bare, hop = map(float, row.split()[1:5])
                assert min(front, engine_ms, bare, hop) > 0, out
            # with the model, the engine's own rate: the front-end processes to keep up,
            # each level against the rate of the batches it can fill (1 and 8 clients),
            # and one client against a floor whose other process is busy for the
            # engine's call: it answers no sooner than that call
            assert ("the front ends need" in out) == bool(model), out
            assert ("in batches of 1," in out) == bool(model), out
            floor = re.search(r"busy ([\d.]+) ms a call \(the engine's one-job call\), "
                              r"([\d.]+) ms; the bare round trip ([\d.]+) ms", out)
            assert bool(floor) == bool(model), out
            if floor:  # answered no sooner than the busy process lets it
                assert min(map(float, floor.groups())) > 0, out
    finally:
        assert d.stop() == 0
