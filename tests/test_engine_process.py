"""The daemon's process structure, from outside: a real `decider serve` whose engine runs
in a process of its own, the real gemma-3-270m, real unix sockets. An engine process that
dies is replaced while no client waits past its deadline; SIGTERM drains; what the engine
process or the front end refuses reaches the client as the one error it should be."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from decider import Choice, Request, YesNo
from decider.bench.daemon import requests
from decider.client import AsyncDeciderClient, DeciderClient, RemoteError
from decider.service.convert import request_to_proto
from decider.v1 import decider_pb2 as pb
from decider.v1 import decider_pb2_grpc as pb_grpc
from helpers.daemon import alive, error_details, free_port, health_status, spawn

TEXT = "I was charged twice for my order, please refund me."
QUEUE = 64  # a batch may hold a quarter of it: 16
WORK_LIMIT = 200  # a yes/no question on TEXT places 33 tokens, 40 labels 428
SERVING, NOT_SERVING = (health_pb2.HealthCheckResponse.SERVING,
                        health_pb2.HealthCheckResponse.NOT_SERVING)
FLAGS = ("--n-ctx", "512", "--max-queue", str(QUEUE), "--max-batch", "4")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, model_path):
    d = spawn(tmp_path_factory.mktemp("daemon"), *FLAGS, "--metrics-port", "0",
              "--max-work-tokens", str(WORK_LIMIT))
    yield d
    assert d.stop() == 0


@pytest.fixture
def own_daemon(tmp_path, model_path):
    """A daemon for a test that ends it; killed should the test fail first."""
    d = spawn(tmp_path, *FLAGS)
    yield d
    if d.proc.poll() is None:
        d.proc.kill()
        d.proc.wait()


def refusal(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def test_a_killed_engine_process_is_replaced_and_no_client_waits_past_its_deadline(daemon):
    """16 clients ask in a loop; the engine process is SIGKILLed at its first answer, with
    the others' requests in flight. Every call is answered or refused UNAVAILABLE, none
    at its deadline: what the dead engine held is refused at once as ENGINE_DIED. Health
    goes NOT_SERVING, then SERVING with a new engine process, and each client is
    answered again."""
    old = daemon.wait_engine()

    async def scenario():
        answered, replaced = asyncio.Event(), asyncio.Event()

        async def client(k: int) -> list[tuple[str, str, float]]:
            outcomes = []
            async with AsyncDeciderClient(daemon.address, timeout=120) as c:
                while True:
                    again = replaced.is_set()
                    try:
                        await c.decide(TEXT, [YesNo(f"Is this question {k}?")])
                        outcome = ("OK", "")
                    except RemoteError as e:
                        outcome = (e.code.name, e.reason)
                    outcomes.append((*outcome, time.monotonic()))
                    if outcome[0] != "OK":
                        await asyncio.sleep(0.2)  # a client's backoff before it retries
                        continue
                    answered.set()
                    if again:
                        return outcomes

        async with grpc.aio.insecure_channel(daemon.address) as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
            assert (await watch.read()).status == SERVING
            clients = [asyncio.create_task(client(k)) for k in range(16)]
            await answered.wait()
            os.kill(old, signal.SIGKILL)
            killed = time.monotonic()
            statuses = [(await watch.read()).status for _ in range(2)]
            replaced.set()
            watch.cancel()
            return killed, statuses, await asyncio.gather(*clients)

    killed, statuses, per_client = asyncio.run(scenario())
    assert statuses == [NOT_SERVING, SERVING]
    outcomes = [o for c in per_client for o in c]
    refused = {(code, reason) for code, reason, _ in outcomes if code != "OK"}
    assert refused <= {("UNAVAILABLE", "ENGINE_DIED"), ("UNAVAILABLE", "UNAVAILABLE")}
    died = [at - killed for code, reason, at in outcomes if reason == "ENGINE_DIED"]
    assert len(died) >= 8  # in flight: the 16 less at most a call or two of 4
    assert max(died) < 5
    [new] = daemon.engine_pids()  # the old one is reaped
    assert new != old and '"signal": "SIGKILL"' in daemon.log()


@pytest.mark.parametrize("raw", [b"\x12\x05ab", b"\x12\x02\xff\xfe"],
                         ids=["truncated", "invalid-utf8"])
def test_bytes_that_are_no_decide_request_are_invalid_argument(daemon, raw):
    with grpc.insecure_channel(daemon.address) as channel:
        decide = channel.unary_unary("/decider.v1.Decider/Decide")  # bytes in, bytes out
        e = refusal(lambda: decide(raw, timeout=30))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    info, bad = error_details(e)
    assert info.reason == "INVALID_REQUEST"
    [violation] = bad.field_violations
    assert violation.field == "request"
    assert "is not a valid Decide message" in violation.description


def test_a_batch_over_a_quarter_of_the_queue_is_refused_whole(daemon):
    item = pb.DecideRequest(text=TEXT, questions=[
        pb.Question(question="Refund?", yes_no=pb.YesNo())])
    before = daemon.metric("decider_engine_requests_total")
    with grpc.insecure_channel(daemon.address) as channel:
        batch = pb_grpc.DeciderStub(channel).DecideBatch
        e = refusal(lambda: batch(pb.DecideBatchRequest(requests=[item] * 17), timeout=30))
        assert daemon.metric("decider_engine_requests_total") == before  # no item ran
        full = batch(pb.DecideBatchRequest(requests=[item] * 16), timeout=120)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    [violation] = error_details(e)[1].field_violations
    assert violation.field == "requests"
    assert "17 items, over the limit of 16" in violation.description
    assert [i.WhichOneof("result") for i in full.items] == ["response"] * 16


def test_requests_about_one_text_in_one_call_share_a_job_and_answer_as_alone(daemon):
    """A batch's four items about one text reach the engine in one call (--max-batch 4):
    one job reads the text for all four, and every answer is the one its request gets
    alone, bit for bit (llama.cpp answers a question the same whatever shares its job)."""
    asked = [pb.Question(question="Is a refund requested?", yes_no=pb.YesNo()),
             pb.Question(question="Is the customer angry?", yes_no=pb.YesNo()),
             pb.Question(question="What is it about?", choice=pb.Choice(labels=[
                 pb.Label(name=n) for n in ("billing", "shipping", "login")])),
             pb.Question(question="Was the order charged twice?", yes_no=pb.YesNo())]
    items = [pb.DecideRequest(text=TEXT, questions=[q]) for q in asked]
    with grpc.insecure_channel(daemon.address) as channel:
        stub = pb_grpc.DeciderStub(channel)
        alone = [stub.Decide(item, timeout=120) for item in items]
        shared = daemon.metric("decider_engine_shared_prefix_requests_total")
        together = stub.DecideBatch(pb.DecideBatchRequest(requests=items), timeout=120)
    assert daemon.metric("decider_engine_shared_prefix_requests_total") - shared == 3
    assert [list(i.response.answers) for i in together.items] == [
        list(a.answers) for a in alone]


def test_a_request_waiting_past_a_full_batch_rides_on_a_taken_request_about_its_text(
        daemon):
    """The engine held, six requests queue: five texts, the first asked about twice. The
    next call (--max-batch 4) takes the second question about the first text in place of
    the fourth text, which keeps its turn: [A B C A'], [D E]. The metric counts one
    request that shared a job (none would in arrival order: [A B C D], [A' E]), and
    every request is answered."""
    texts = [f"{TEXT} Order {n}." for n in "ABCDE"]
    order = [texts[0], *texts[1:4], texts[0], texts[4]]

    async def scenario():
        async with AsyncDeciderClient(daemon.address, timeout=120) as client:
            daemon.fault_file.write_text("hang:2")
            held = asyncio.create_task(client.decide(TEXT, [YesNo("Is it urgent?")]))
            await asyncio.sleep(0.5)  # in the engine, stalled
            asked = []
            for i, text in enumerate(order):  # one at a time: arrival order is this order
                asked.append(asyncio.create_task(client.decide(text, [YesNo(f"Q{i}?")])))
                await asyncio.sleep(0.05)
            return await asyncio.gather(held, *asked)

    shared = daemon.metric("decider_engine_shared_prefix_requests_total")
    answers = asyncio.run(scenario())
    assert len(answers) == 7
    assert daemon.metric("decider_engine_shared_prefix_requests_total") - shared == 1


def test_one_connection_flooding_a_half_full_queue_leaves_the_others_room(tmp_path,
                                                                          model_path):
    """Queue 16 on TCP, the engine held: one connection sends 12 requests; it gets 8 places
    (the queue was under half full), its other 4 are QUEUE_FULL naming the share of 4.
    A second connection, asking into the half-full queue, is admitted and answered."""
    daemon = spawn(tmp_path, "--n-ctx", "512", "--max-queue", "16", "--max-batch", "1",
                   address=f"127.0.0.1:{free_port()}")
    try:
        daemon.fault_file.write_text("hang:3")

        async def scenario():
            # channels of one process share a connection unless told otherwise
            own = [("grpc.use_local_subchannel_pool", 1)]
            async with AsyncDeciderClient(daemon.address, timeout=120) as flood, \
                    grpc.aio.insecure_channel(daemon.address, options=own) as other:
                sent = [asyncio.create_task(flood.decide(TEXT, [YesNo(f"Question {i}?")]))
                        for i in range(12)]
                while sum(t.done() for t in sent) < 4:  # the refusals come at once
                    await asyncio.sleep(0.02)
                answer = await pb_grpc.DeciderStub(other).Decide(request_to_proto(
                    Request(TEXT, (YesNo("Is a refund asked for?"),))), timeout=120)
                return answer, await asyncio.gather(*sent, return_exceptions=True)

        answer, flooded = asyncio.run(scenario())
        assert answer.answers[0].question == "Is a refund asked for?"
        refused = [r for r in flooded if isinstance(r, RemoteError)]
        assert len(refused) == 4 and len(flooded) - len(refused) == 8
        assert {(r.code, r.reason) for r in refused} == {
            (grpc.StatusCode.RESOURCE_EXHAUSTED, "QUEUE_FULL")}
        assert "one caller may hold at most 4" in refused[0].message
    finally:
        assert daemon.stop() == 0


def test_work_over_the_bound_is_out_of_range_before_any_engine_pass(daemon):
    labels = [f"topic {i}" for i in range(40)]
    daemon.fault_file.write_text("oom")  # a pass that began would fail with OOM instead
    try:
        with DeciderClient(daemon.address) as c:
            started = time.monotonic()
            with pytest.raises(RemoteError) as info:
                c.decide(TEXT, [Choice("Which topic?", labels)])
            seconds = time.monotonic() - started
        assert daemon.fault_file.exists()  # no engine pass began
    finally:
        daemon.fault_file.unlink(missing_ok=True)
    e = info.value
    assert (e.code, e.reason) == (grpc.StatusCode.OUT_OF_RANGE, "WORK_TOO_LARGE")
    assert int(e.metadata["work_tokens"]) > int(e.metadata["max_work_tokens"]) == WORK_LIMIT
    assert seconds < 2


def test_a_request_past_its_deadline_stops_holding_the_engine(tmp_path, model_path):
    """A request of ~3,000 tokens (six 512-token chunks) sent with a deadline of a sixth
    of the time it takes alone: DEADLINE_EXCEEDED, and the engine drops it at the next
    chunk, so a short request queued behind it (one request per engine call) waits for
    about a chunk, not for the rest of the long one."""
    daemon = spawn(tmp_path, "--n-ctx", "4096", "--max-batch", "1")
    timed, long_request = requests(3000, 2)  # two texts: the second is not in the cache
    try:
        with DeciderClient(daemon.address, timeout=300) as c:
            alone_ms = c.decide_raw(timed).timings.compute_ms

        async def scenario():
            async with AsyncDeciderClient(daemon.address, timeout=alone_ms / 6000) as late, \
                    AsyncDeciderClient(daemon.address, timeout=300) as patient:
                held = asyncio.create_task(late.decide_request(long_request))
                await asyncio.sleep(0.2)  # the long request is in the engine
                short = await patient.decide_raw(Request(TEXT, (YesNo("Refund?"),)))
                with pytest.raises(RemoteError) as info:
                    await held
                return info.value, short

        expired, short = asyncio.run(scenario())
        assert expired.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert short.timings.queue_ms < alone_ms / 2, (short.timings.queue_ms, alone_ms)
    finally:
        assert daemon.stop() == 0


def test_sigterm_answers_what_runs_and_refuses_what_comes_after(own_daemon):
    """SIGTERM to every process of the service, as systemd's stop sends it: the engine
    process keeps serving what it holds while the daemon refuses new requests; exit 0."""
    daemon = own_daemon
    daemon.fault_file.write_text("hang:5")  # the first call holds the engine 5 s

    async def scenario():
        async with AsyncDeciderClient(daemon.address, timeout=60) as c:
            held = [asyncio.create_task(c.decide(TEXT, [YesNo(f"Question {i}?")]))
                    for i in range(4)]
            while daemon.fault_file.exists():  # until the engine pass takes the fault
                await asyncio.sleep(0.02)
            daemon.signal_all(signal.SIGTERM)
            while await asyncio.to_thread(health_status, daemon.address) != "NOT_SERVING":
                await asyncio.sleep(0.02)
            with pytest.raises(RemoteError) as info:
                await c.decide(TEXT, [YesNo("Too late?")])
            assert not any(t.done() for t in held)  # refused while those still ran
            return info.value, await asyncio.gather(*held)

    late, answers = asyncio.run(scenario())
    assert (late.code, late.reason) == (grpc.StatusCode.UNAVAILABLE, "UNAVAILABLE")
    assert [a.answers[0].question for a in answers] == [f"Question {i}?" for i in range(4)]
    assert daemon.proc.wait(60) == 0


def test_engines_that_keep_dying_end_the_daemon_with_1(own_daemon):
    """Each engine process is killed as soon as it serves: three are replaced, the fourth
    death within a minute says that restarting here will not help; systemd's
    Restart=on-failure restarts the whole service."""
    daemon = own_daemon
    engine = daemon.wait_engine()
    for _ in range(3):
        os.kill(engine, signal.SIGKILL)
        engine = daemon.wait_engine(other_than=engine)
        while health_status(daemon.address) != "SERVING":
            time.sleep(0.05)
    os.kill(engine, signal.SIGKILL)
    assert daemon.proc.wait(60) == 1
    assert ("3 engines replaced within 60 s and the last one ended too; exiting for the "
            "service manager to restart") in daemon.log()


def test_the_engine_process_never_outlives_the_daemon(own_daemon):
    """Not even while a pass holds it, deaf to its supervisor: the kernel ends it when
    the daemon dies (here SIGKILL; under systemd, SIGABRT for a withheld watchdog)."""
    daemon = own_daemon
    engine = daemon.wait_engine()
    daemon.fault_file.write_text("hang:60")
    with grpc.insecure_channel(daemon.address) as channel:
        call = pb_grpc.DeciderStub(channel).Decide.future(pb.DecideRequest(
            text=TEXT, questions=[pb.Question(question="Refund?", yes_no=pb.YesNo())]),
            timeout=60)
        while daemon.fault_file.exists():  # until the engine pass takes the fault
            time.sleep(0.02)
        daemon.proc.kill()
        assert call.exception(timeout=30).code() == grpc.StatusCode.UNAVAILABLE
    daemon.proc.wait()
    end = time.monotonic() + 10
    while alive(engine) and time.monotonic() < end:
        time.sleep(0.05)
    assert not alive(engine)
