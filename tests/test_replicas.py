"""Three real daemons on loopback behind one client (decider.client's channel: gRPC's own
round_robin over the replicas its health checks find SERVING, and its retry policy for
UNAVAILABLE), 16 clients looping for RUN_SECONDS each run, on the tiny model: the load
spreads over the replicas; a replica sent SIGTERM mid-run drains (health NOT_SERVING
first) and no request fails; a replica killed mid-run fails no request either (gRPC
retries the calls in flight on it, which it never answered) and, restarted on its port,
comes back into rotation. Answers under load equal each request's answer alone."""

from __future__ import annotations

import asyncio
import signal

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from decider.bench import soak
from decider.client import SERVICE
from helpers.daemon import free_port, spawn

CLIENTS, REPLICAS = 16, 3
RUN_SECONDS = 30  # the run length: long enough for the health watch to settle
# a replica's share of the calls, at least: round_robin gives each a third, and the
# replica that is slower a moment (2 cores for three daemons) fewer
FAIR_SHARE = 0.2


@pytest.fixture(scope="module")
def replicas(tmp_path_factory, tiny):
    ports = [free_port() for _ in range(REPLICAS)]
    daemons = [start(tmp_path_factory.mktemp(f"replica{i}"), tiny, port)
               for i, port in enumerate(ports)]
    yield daemons
    for d in daemons:
        d.stop(60)


def start(tmp, tiny, port: int):
    # one engine thread each: three engines share the 2 cores
    return spawn(tmp, "--model", str(tiny), "--threads", "1", "--metrics-port", "0",
                 address=f"127.0.0.1:{port}")


@pytest.fixture(scope="module")
def refs(replicas):
    reqs = soak.requests()
    return reqs, asyncio.run(soak.references(replicas[0].address, reqs))


def answered(daemon) -> float:
    return daemon.metric("decider_requests_total")


async def run(replicas, refs, during=None):
    """The load over every replica's address for RUN_SECONDS; `during()` after a third of
    it. Returns the tally."""
    reqs, answers = refs
    load = asyncio.create_task(soak.load(
        [d.address for d in replicas], reqs, answers, clients=CLIENTS, seconds=RUN_SECONDS,
        balanced=True))
    if during is not None:
        await asyncio.sleep(RUN_SECONDS / 3)
        await asyncio.to_thread(during)
    tally = await load
    print(f"{tally.sent} sent, {tally.answered} answered in {tally.seconds:.1f} s, "
          f"errors {dict(tally.errors)}, lost {tally.lost}, mixed {tally.mixed}")
    return tally


def test_the_load_spreads_over_every_replica(replicas, refs):
    before = [answered(d) for d in replicas]
    tally = asyncio.run(run(replicas, refs))
    shares = [(answered(d) - b) / tally.answered for d, b in zip(replicas, before, strict=True)]
    print(f"shares {[round(s, 3) for s in shares]}")
    assert tally.ok()
    assert min(shares) >= FAIR_SHARE


async def health_watch(address: str, statuses: list[str]) -> None:
    """Every status the replica's health service sends, until its stream ends."""
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            async for reply in health_pb2_grpc.HealthStub(channel).Watch(
                    health_pb2.HealthCheckRequest(service=SERVICE)):
                statuses.append(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
        except grpc.aio.AioRpcError:
            pass  # the replica went


def test_a_replica_stopped_mid_run_drains_and_no_request_fails(replicas, refs, tiny,
                                                              tmp_path):
    victim, statuses = replicas[1], []

    async def main():
        watch = asyncio.create_task(health_watch(victim.address, statuses))
        tally = await run(replicas, refs, during=lambda: victim.stop(60))
        await watch
        return tally

    tally = asyncio.run(main())
    assert victim.proc.returncode == 0
    assert tally.ok(), tally.errors
    assert statuses == ["SERVING", "NOT_SERVING"]  # out of rotation before it went
    replicas[1] = start(tmp_path, tiny, int(victim.address.rpartition(":")[2]))


def test_a_replica_killed_mid_run_fails_no_request_and_comes_back(replicas, refs, tiny,
                                                                  tmp_path):
    victim = replicas[2]
    port = int(victim.address.rpartition(":")[2])

    def kill_and_restart() -> None:
        victim.signal_all(signal.SIGKILL)
        victim.proc.wait(10)
        replicas[2] = start(tmp_path, tiny, port)

    tally = asyncio.run(run(replicas, refs, during=kill_and_restart))
    assert tally.ok(), tally.errors
    assert answered(replicas[2]) > 0  # back in rotation within the run
