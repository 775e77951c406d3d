"""Three real daemons on loopback (the tiny model), 16 clients looping for RUN_SECONDS a
run, reached two ways: through decider.client's channel (gRPC's own round_robin over
the replicas its health checks find SERVING, its retry policy for UNAVAILABLE), and
through Debian's HAProxy with the shipped deploy/haproxy/decider.cfg (one address; the
proxy checks each replica's /readyz). Either way: the load spreads over the replicas; a
replica sent SIGTERM mid-run drains (health NOT_SERVING first) and no request fails; a
replica killed mid-run fails no request either (the calls in flight on it, which it
never answered, are retried) and, restarted on its port, comes back into rotation.
Answers under load equal each request's answer alone."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from decider.bench import soak
from decider.client import SERVICE
from helpers.daemon import free_port, spawn

CLIENTS, REPLICAS = 16, 3
RUN_SECONDS = 30  # the run length: long enough for the health checks to settle
# a replica's share of the calls, at least: round_robin gives each a third, and the
# replica that is slower a moment (2 cores for three daemons) fewer
FAIR_SHARE = 0.2
HAPROXY_CFG = Path(__file__).parent.parent / "deploy" / "haproxy" / "decider.cfg"


class Replicas:
    """The daemons, by index, each on its own gRPC and HTTP ports (kept across restarts)."""

    def __init__(self, tmp_factory, tiny) -> None:
        self.tmp_factory, self.tiny = tmp_factory, tiny
        self.ports = [(free_port(), free_port()) for _ in range(REPLICAS)]
        self.daemons = [self.start(i) for i in range(REPLICAS)]

    def start(self, i: int):
        grpc_port, http_port = self.ports[i]
        # one engine thread each: three engines share the 2 cores
        return spawn(self.tmp_factory.mktemp(f"replica{i}"), "--model", str(self.tiny),
                     "--threads", "1", "--metrics-port", "0", "--http",
                     f"127.0.0.1:{http_port}", address=f"127.0.0.1:{grpc_port}")

    def env(self) -> dict[str, str]:
        """deploy/haproxy/decider.cfg's variables for these replicas."""
        env = {}
        for i, (grpc_port, http_port) in enumerate(self.ports, 1):
            env |= {f"DECIDER_R{i}": f"127.0.0.1:{grpc_port}",
                    f"DECIDER_R{i}_HTTP": f"127.0.0.1:{http_port}",
                    f"DECIDER_R{i}_HTTP_PORT": str(http_port)}
        return env


@pytest.fixture(scope="module")
def replicas(tmp_path_factory, tiny):
    r = Replicas(tmp_path_factory, tiny)
    yield r
    for d in r.daemons:
        d.stop(60)


@pytest.fixture(scope="module")
def proxy(replicas):
    """HAProxy on the shipped config: its gRPC address and its HTTP API's URL."""
    if not shutil.which("haproxy"):
        pytest.skip("haproxy is not installed (Debian package haproxy; .ci/run installs it)")
    address, http = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    env = {**os.environ, **replicas.env(), "DECIDER_PROXY_GRPC": address,
           "DECIDER_PROXY_HTTP": http}
    proc = subprocess.Popen(["haproxy", "-db", "-f", str(HAPROXY_CFG)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    time.sleep(2)  # two good checks (rise 2, every 0.5 s) put every replica in rotation
    assert proc.poll() is None, proc.stdout.read().decode()
    yield address, f"http://{http}"
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="module")
def refs(replicas):
    reqs = soak.requests()
    return reqs, asyncio.run(soak.references(replicas.daemons[0].address, reqs))


@pytest.fixture(params=["client-side", "haproxy", "haproxy-http"])
def route(request, replicas):
    """What the clients dial: every replica's address, the proxy's gRPC address, or the
    proxy's System One HTTP API (an http:// URL)."""
    if request.param == "client-side":
        return [d.address for d in replicas.daemons]
    grpc_address, http_url = request.getfixturevalue("proxy")
    return grpc_address if request.param == "haproxy" else http_url


def answered(daemon) -> float:
    return daemon.metric("decider_requests_total")


BODY = {"model": "jev-latest",  # a published client's default, which decider answers to
        "state": "I was charged twice for order A-104; please refund me.",
        "questions": {"refund": {"type": "noul", "instructions": "Is a refund asked for?"},
                      "topic": {"type": "choice", "criteria": {"billing": None,
                                                              "shipping": None}}}}


async def http_load(url: str, seconds: float) -> soak.Tally:
    """CLIENTS loops posting BODY to the System One API, each retrying a 503 (a replica
    draining or gone: nothing computed) up to 5 times with backoff, as TypeSafe's SDK
    does by default; the first answer is each later one's reference."""
    tally, end, first = soak.Tally(), time.monotonic() + seconds, []
    async with aiohttp.ClientSession(url, timeout=aiohttp.ClientTimeout(total=60)) as http:
        async def client() -> None:
            while time.monotonic() < end:
                tally.sent += 1
                for attempt in range(5):
                    async with http.post("/v1/systemone", json=BODY) as reply:
                        status, answer = reply.status, await reply.json()
                    if status != 503:
                        break
                    await asyncio.sleep(0.05 * 2 ** attempt)
                if status != 200:
                    tally.errors[(str(status), answer["detail"]["reason"])] += 1
                    continue
                tally.answered += 1
                first[:] = first or [answer["answers"]]
                tally.mixed += answer["answers"] != first[0]

        started = time.monotonic()
        await asyncio.gather(*(client() for _ in range(CLIENTS)))
        tally.seconds = time.monotonic() - started
    return tally


async def run(route, refs, during=None):
    """The load for RUN_SECONDS; `during()` after a third of it. Returns the tally."""
    reqs, answers = refs
    load = asyncio.create_task(
        http_load(route, RUN_SECONDS) if isinstance(route, str) and route.startswith("http") else
        soak.load(route, reqs, answers, clients=CLIENTS, seconds=RUN_SECONDS, balanced=True))
    if during is not None:
        await asyncio.sleep(RUN_SECONDS / 3)
        await asyncio.to_thread(during)
    tally = await load
    print(f"{tally.sent} sent, {tally.answered} answered in {tally.seconds:.1f} s, "
          f"errors {dict(tally.errors)}, lost {tally.lost}, mixed {tally.mixed}")
    return tally


def test_the_load_spreads_over_every_replica(replicas, route, refs):
    before = [answered(d) for d in replicas.daemons]
    tally = asyncio.run(run(route, refs))
    shares = [(answered(d) - b) / tally.answered
              for d, b in zip(replicas.daemons, before, strict=True)]
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


def test_a_replica_stopped_mid_run_drains_and_no_request_fails(replicas, route, refs):
    victim, statuses = replicas.daemons[1], []

    async def main():
        watch = asyncio.create_task(health_watch(victim.address, statuses))
        tally = await run(route, refs, during=lambda: victim.stop(60))
        await watch
        return tally

    tally = asyncio.run(main())
    replicas.daemons[1] = replicas.start(1)
    assert victim.proc.returncode == 0
    assert tally.ok(), tally.errors
    assert statuses == ["SERVING", "NOT_SERVING"]  # out of rotation before it went


def test_a_replica_killed_mid_run_fails_no_request_and_comes_back(replicas, route, refs):
    victim = replicas.daemons[2]

    def kill_and_restart() -> None:
        victim.signal_all(signal.SIGKILL)
        victim.proc.wait(10)
        replicas.daemons[2] = replicas.start(2)

    tally = asyncio.run(run(route, refs, during=kill_and_restart))
    assert tally.ok(), tally.errors
    assert answered(replicas.daemons[2]) > 0  # back in rotation within the run
