"""Engine faults while 16 clients loop on a real `decider serve` (the tiny model of
tests/test_soak.py): a bad engine call is refused whole and answers nothing, the engine
process is replaced only when its output cannot be trusted, and every answer before and
after equals what its request got alone.

A hang past engine_call_limit_seconds is a hung engine, killed and replaced
(tests/test_daemon_life.py, tests/test_systemd.py); here a short hang only shows the load
waits and nothing is refused."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from decider.bench import soak
from decider.v1 import decider_pb2_grpc as pb_grpc
from helpers.daemon import spawn

CLIENTS, MAX_BATCH = 16, 4
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, tiny):
    d = spawn(tmp_path_factory.mktemp("faults"), "--model", str(tiny), "--threads", "1",
              "--max-batch", str(MAX_BATCH), "--max-queue", "64")  # 1: tests/test_soak.py
    yield d
    assert d.stop(60) == 0


@pytest.fixture(scope="module")
def refs(daemon):
    reqs = soak.requests()
    return reqs, asyncio.run(soak.references(daemon.address, reqs))


async def until(check, seconds: float, what: str) -> None:
    """Poll `check` until true, or fail naming `what` at the deadline."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s: {what}")
        await asyncio.sleep(0.02)


async def fault_under_load(daemon, refs, fault: str, settled) -> tuple:
    """Load, then `fault` into the next engine pass, then load until `settled(statuses)`
    and 40 more answers. Returns (tally with every outcome, health statuses seen, the
    time the fault was taken)."""
    reqs, answers = refs
    tally, stop, statuses = soak.Tally(), asyncio.Event(), []
    async with grpc.aio.insecure_channel(daemon.address) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())

        async def watching() -> None:
            async for reply in watch:
                statuses.append(reply.status)

        watcher = asyncio.create_task(watching())
        loader = asyncio.create_task(soak.load(
            daemon.address, reqs, answers, clients=CLIENTS, seconds=300, keep=True,
            stop=stop, backoff=0.1, tally=tally))
        await until(lambda: tally.answered >= 40 and statuses == [SERVING], 60, "answers")
        daemon.fault_file.write_text(fault)
        await until(lambda: not daemon.fault_file.exists(), 30, "the fault taken")
        taken = time.monotonic()
        await until(lambda: settled(statuses), 120, f"health settled, saw {statuses}")
        after = tally.answered
        await until(lambda: tally.answered >= after + 40, 60, "answers after the fault")
        stop.set()
        await loader
        watch.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    names = [health_pb2.HealthCheckResponse.ServingStatus.Name(s) for s in statuses]
    print(f"{fault}: {tally.sent} sent, {tally.answered} answered, refused "
          f"{dict(tally.errors)}, health {names}")
    return tally, statuses, taken


@pytest.mark.parametrize("fault", ["zero-logits", "stale-logits"])
def test_unwritten_logits_refuse_their_call_and_replace_the_engine(daemon, refs, fault):
    old = daemon.wait_engine()
    tally, statuses, taken = asyncio.run(fault_under_load(
        daemon, refs, fault, lambda s: s[-2:] == [NOT_SERVING, SERVING]))
    assert statuses == [SERVING, NOT_SERVING, SERVING]
    assert daemon.wait_engine(other_than=old) != old  # a new engine process serves
    refused = [(at, code, reason) for at, code, reason in tally.outcomes if code != "OK"]
    bad = [at for at, code, reason in refused
           if (code, reason) == ("INTERNAL", "ENGINE_RETURNED_NO_LOGITS")]
    assert 1 <= len(bad) <= MAX_BATCH  # that engine call's requests, no other
    assert min(bad) >= taken - 1  # none before the fault (1 s: the poll's slack)
    assert {(c, r) for _, c, r in refused} <= {
        ("INTERNAL", "ENGINE_RETURNED_NO_LOGITS"), ("UNAVAILABLE", "ENGINE_DIED"),
        ("UNAVAILABLE", "UNAVAILABLE")}  # held by the dead engine; then reloading
    assert tally.mixed == tally.lost == 0  # no answer came from the bad call
    assert tally.answered == tally.sent - len(refused)
    assert "reloading the model after an engine failure" in daemon.log()


def test_out_of_memory_refuses_that_call_only_and_keeps_the_engine(daemon, refs):
    old = daemon.wait_engine()
    tally, statuses, _ = asyncio.run(fault_under_load(daemon, refs, "oom", lambda s: True))
    assert statuses == [SERVING]  # health never left SERVING
    assert daemon.engine_pids() == [old]
    assert set(tally.errors) == {("RESOURCE_EXHAUSTED", "ENGINE_OUT_OF_MEMORY")}
    assert 1 <= sum(tally.errors.values()) <= MAX_BATCH
    assert tally.mixed == tally.lost == 0


def test_a_short_hang_delays_the_load_and_refuses_nothing(daemon, refs):
    old = daemon.wait_engine()
    tally, statuses, taken = asyncio.run(fault_under_load(daemon, refs, "hang:2",
                                                          lambda s: True))
    assert statuses == [SERVING] and daemon.engine_pids() == [old]
    assert (tally.mixed, tally.lost, dict(tally.errors)) == (0, 0, {})
    assert tally.answered == tally.sent


def test_a_stale_pass_alone_is_refused_even_for_other_labels(daemon, refs):
    """No load: a yes/no, then a stale pass for a scale question on the same text. The
    scale reads the yes/no's rows; refused, or answered with its own reference."""
    reqs, answers = refs
    with grpc.insecure_channel(daemon.address) as channel:
        decide = pb_grpc.DeciderStub(channel).Decide
        decide(reqs[0], timeout=60)  # text 0, yes/no
        daemon.fault_file.write_text("stale-logits")
        try:
            reply = decide(reqs[4], timeout=60)  # text 0, scale
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.INTERNAL
            return
    assert soak.fingerprint(reply) == answers[4]
