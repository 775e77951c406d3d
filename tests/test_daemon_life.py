"""The daemon's life under an operator's faults, from outside: the real `decider serve`
with its config file, gRPC on a unix socket and on TCP, the HTTP API and the metrics
endpoint, the real gemma-3-270m. One daemon serves the module's tests in order (each
leaves it serving); the last one stops it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from contextlib import contextmanager

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from decider import YesNo
from decider.client import AsyncDeciderClient, DeciderClient, RemoteError
from helpers.daemon import DECIDER, free_port, health_status, spawn

TEXT = "I was charged twice for my order, please refund me."
CALL_LIMIT = 5.0  # engine_call_limit_seconds: a silent engine is hung past this
GRACE = 10.0


def write_config(path, n_ctx: int):
    path.write_text(f"""
[server]
max_queue = 64
max_batch = 4
grace_seconds = {GRACE}
engine_call_limit_seconds = {CALL_LIMIT}
metrics_port = 0
[model]
name = "gemma-3-270m"
n_ctx = {n_ctx}
""")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, model_path):
    tmp = tmp_path_factory.mktemp("life")
    config = tmp / "decider.toml"
    write_config(config, 512)
    tcp, http = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    d = spawn(tmp, "--config", str(config), "--listen", tcp, "--http", http)
    d.config, d.tcp, d.http = config, tcp, f"http://{http}"
    yield d
    if d.proc.poll() is None:
        d.proc.kill()
        d.proc.wait()


def wait_until(condition, timeout: float, step: float = 0.02) -> float:
    """Seconds until condition() held; AssertionError past the timeout."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout} s")
        time.sleep(step)
    return time.monotonic() - start


def serving(daemon) -> bool:
    try:
        return health_status(daemon.address, timeout=1) == "SERVING"
    except grpc.RpcError:
        return False


@contextmanager
def health_latencies(address: str):
    """Health checks every 20 ms on one channel while the block runs; the latencies."""
    seen, done = [], threading.Event()

    def probe():
        with grpc.insecure_channel(address) as channel:
            check = health_pb2_grpc.HealthStub(channel).Check
            while not done.is_set():
                t0 = time.monotonic()
                check(health_pb2.HealthCheckRequest(), timeout=5)
                seen.append(time.monotonic() - t0)
                time.sleep(0.02)

    thread = threading.Thread(target=probe)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        thread.join()


def decide(daemon, timeout: float = 60):
    with DeciderClient(daemon.address, timeout=timeout) as c:
        return c.decide(TEXT, [YesNo("Refund?")])


def test_metrics_count_every_request_of_a_run_over_grpc_and_http(daemon):
    """With --http the endpoint still sums every process's metrics (the front end's were
    lost when prometheus_client was imported before its multiprocess directory was set)."""
    before = daemon.metric("decider_requests_total")
    for _ in range(5):
        decide(daemon)
    body = json.dumps({"model": "gemma-3-270m", "state": TEXT,
                       "questions": {"q": {"type": "noul", "instructions": "Refund?"}}})
    for _ in range(3):
        request = urllib.request.Request(daemon.http + "/v1/systemone", body.encode(),
                                         {"Content-Type": "application/json"})
        assert urllib.request.urlopen(request, timeout=60).status == 200
    # a request is counted once its answer has gone out (gRPC and HTTP): a moment after
    wait_until(lambda: daemon.metric("decider_requests_total") - before == 8, 5)
    assert daemon.metric("decider_http_requests_total") >= 3
    assert daemon.metric("decider_request_seconds_count") >= 8
    assert daemon.metric("decider_engine_up") == 1


@pytest.mark.parametrize("where", ["unix", "tcp", "http"])
def test_a_second_daemon_on_a_taken_address_is_refused_and_the_first_serves_on(
        daemon, tmp_path, where):
    """On its unix socket (never unlinked while it answers), on its gRPC TCP port and on
    its HTTP port: refused before any model loads, naming the first daemon's pid."""
    listen = {"unix": daemon.address, "tcp": daemon.tcp}.get(where, f"unix://{tmp_path}/x")
    extra = ["--http", daemon.http.removeprefix("http://")] if where == "http" else []
    t0 = time.monotonic()
    second = subprocess.run([*DECIDER, "serve", "--listen", listen, *extra],
                            capture_output=True, text=True, timeout=60)
    assert second.returncode == 2, second.stderr
    assert "is in use by another decider daemon" in second.stderr
    assert f"(pid {daemon.proc.pid})" in second.stderr
    assert time.monotonic() - t0 < 10  # no model loaded
    assert decide(daemon).answers[0].question == "Refund?"
    with DeciderClient(daemon.tcp, timeout=60) as c:
        assert c.decide(TEXT, [YesNo("Refund?")]).answers[0].question == "Refund?"


def test_an_address_another_program_holds_is_refused_before_loading(tmp_path):
    """A TCP port someone else listens on, and a unix socket path a live server holds."""
    import socket

    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        out = subprocess.run([*DECIDER, "serve", "--listen", f"127.0.0.1:{port}"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and "another program holds the port" in out.stderr
    path = tmp_path / "live.sock"
    with socket.socket(socket.AF_UNIX) as live:
        live.bind(str(path))
        live.listen()
        out = subprocess.run([*DECIDER, "serve", "--listen", f"unix://{path}"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and "belongs to a running server" in out.stderr
        assert path.exists()  # not unlinked


def test_a_text_asked_again_reads_its_prefix_from_the_cache_until_a_reload(daemon):
    """The second request about a text reports its prefix as cached (gRPC usage, System One
    x_decider, the metrics) with the same answer; a reload that loads the model again
    starts an empty cache."""
    text = "My parcel arrived broken and the box was soaked. " * 3

    def ask():
        with DeciderClient(daemon.address, timeout=60) as c:
            return c.decide(text, [YesNo("Is the parcel damaged?")])

    hits = daemon.metric("decider_prefix_cache_hit_tokens_total")
    first, again = ask(), ask()
    assert first.usage.cached_tokens == 0
    assert 20 < again.usage.cached_tokens < again.usage.prompt_tokens
    assert again.answers[0].p_yes == first.answers[0].p_yes
    assert daemon.metric("decider_prefix_cache_hit_tokens_total") - hits \
        == again.usage.cached_tokens
    assert daemon.metric("decider_prefix_cache_bytes") > 0
    body = json.dumps({"model": "gemma-3-270m", "state": "The lid was cracked. " * 4,
                       "questions": {"q": {"type": "noul", "instructions": "Damaged?"}}})
    for cached in (False, True):
        request = urllib.request.Request(daemon.http + "/v1/systemone", body.encode(),
                                         {"Content-Type": "application/json"})
        reply = json.load(urllib.request.urlopen(request, timeout=60))
        assert (reply["x_decider"]["cached_tokens"] > 0) == cached
    engine = daemon.wait_engine()
    with daemon.config.open("a") as config:  # a reload that loads: a new engine
        config.write("[cache]\nmax_bytes = 268435456\n")
    daemon.proc.send_signal(signal.SIGHUP)
    new = daemon.wait_engine(other_than=engine)  # it loads while the old one serves
    wait_until(lambda: daemon.engine_pids() == [new] and serving(daemon), 120)
    assert ask().usage.cached_tokens == 0


def test_an_idle_engine_that_dies_is_replaced(daemon):
    """Killed before it answers anything (the OOM killer at rest): a new engine serves,
    and health answers within 100 ms throughout (the tokenizer loads off the loop)."""
    engine = daemon.wait_engine()
    with health_latencies(daemon.address) as latencies:
        os.kill(engine, signal.SIGKILL)
        wait_until(lambda: not serving(daemon), 10)
        daemon.wait_engine(other_than=engine)
        wait_until(lambda: serving(daemon), 120)
    second = daemon.wait_engine()
    os.kill(second, signal.SIGKILL)  # again before it answered anything
    wait_until(lambda: daemon.wait_engine(other_than=second) and serving(daemon), 120)
    assert decide(daemon).answers[0].question == "Refund?"
    assert max(latencies) < 0.1, sorted(latencies)[-5:]


def test_the_cli_against_a_daemon_waits_no_longer_than_its_deadline(daemon):
    """`decider run --server` waits at most --timeout seconds (default 120), here for an
    engine call held 3 s."""
    daemon.fault_file.write_text("hang:3")
    t0 = time.monotonic()
    out = subprocess.run([*DECIDER, "run", "gemma-3-270m", TEXT, "-q", "Refund?", "--server",
                          daemon.address, "--timeout", "1"], capture_output=True, text=True,
                         timeout=60)
    assert (out.returncode, out.stdout) == (1, "")
    assert "DEADLINE_EXCEEDED" in out.stderr
    assert time.monotonic() - t0 < 3
    wait_until(lambda: not daemon.fault_file.exists(), 10)


def test_a_stopped_engine_is_hung_and_replaced_under_load(daemon):
    """SIGSTOP of the engine under 16 clients: NOT_SERVING within the call limit, every
    request answered or refused by its deadline, SERVING again with a new engine."""
    engine = daemon.wait_engine()
    timeout = 3 * CALL_LIMIT

    async def scenario():
        stopped = asyncio.Event()
        calls: list[tuple[str, float]] = []

        async def client(k: int) -> None:
            async with AsyncDeciderClient(daemon.address, timeout=timeout) as c:
                while len(calls) < 400:
                    t0 = time.monotonic()
                    try:
                        await c.decide(TEXT, [YesNo(f"Question {k}?")])
                        outcome = "OK"
                    except RemoteError as e:
                        outcome = e.reason
                    calls.append((outcome, time.monotonic() - t0))
                    if stopped.is_set() and outcome == "OK" and \
                            await asyncio.to_thread(serving, daemon):
                        return
                    await asyncio.sleep(0.05 if outcome == "OK" else 0.5)

        tasks = [asyncio.create_task(client(k)) for k in range(16)]
        await asyncio.sleep(1.0)
        os.kill(engine, signal.SIGSTOP)
        stopped.set()
        t0 = time.monotonic()
        while await asyncio.to_thread(health_status, daemon.address) != "NOT_SERVING":
            await asyncio.sleep(0.05)
        noticed = time.monotonic() - t0
        await asyncio.wait_for(asyncio.gather(*tasks), 180)
        return noticed, calls

    noticed, calls = asyncio.run(scenario())
    assert noticed < CALL_LIMIT + 2.5, noticed  # the limit, a ping period, slack
    assert all(seconds < timeout + 1 for _, seconds in calls), max(calls, key=lambda c: c[1])
    assert {outcome for outcome, _ in calls} <= {"OK", "ENGINE_HUNG", "DEADLINE_EXCEEDED",
                                                 "UNAVAILABLE", "ENGINE_DIED"}
    assert "ENGINE_HUNG" in {outcome for outcome, _ in calls}
    assert daemon.wait_engine(other_than=engine) != engine
    assert "the engine made no progress past its limit; killing it" in daemon.log()


def test_two_quick_reloads_leave_one_engine_and_sigterm_ends_within_the_grace(daemon):
    """Two SIGHUPs 0.5 s apart, each with another window, under load: they are applied
    in turn, one engine process remains, health answers within 100 ms throughout, and
    SIGTERM then drains and exits 0 within its grace."""
    first = daemon.wait_engine()

    async def load(until: threading.Event) -> list[str]:
        outcomes = []
        async with AsyncDeciderClient(daemon.address, timeout=60) as c:
            while not until.is_set():
                try:
                    await c.decide(TEXT, [YesNo("Refund?")])
                    outcomes.append("OK")
                except RemoteError as e:
                    outcomes.append(e.reason)
                await asyncio.sleep(0.02)
        return outcomes

    done = threading.Event()
    loader = threading.Thread(target=lambda: setattr(done, "outcomes", asyncio.run(load(done))))
    loader.start()
    with health_latencies(daemon.address) as latencies:
        write_config(daemon.config, 1024)
        daemon.proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        write_config(daemon.config, 768)
        daemon.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: daemon.log().count('"configuration reloaded"') >= 2, 180, 0.1)
    done.set()
    loader.join()
    # the old engines answer what they hold, then exit
    wait_until(lambda: len(daemon.engine_pids()) == 1, 30, 0.1)
    assert set(done.outcomes) == {"OK"}, set(done.outcomes)
    assert first not in daemon.engine_pids()
    with DeciderClient(daemon.address) as c:
        assert next(m.n_ctx for m in c.list_models().models if m.loaded) == 768
    assert max(latencies) < 0.1, sorted(latencies)[-5:]
    t0 = time.monotonic()
    assert daemon.stop(timeout=GRACE + 5) == 0
    assert time.monotonic() - t0 < GRACE
