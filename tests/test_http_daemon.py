"""The System One HTTP API as one of the daemon's front ends, each test with a daemon of its
own: the queue and the drain, requests whose time ran out or whose client left never
reaching the engine process, and the same answers over HTTP, over gRPC and in process."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from dataclasses import replace

import grpc
import httpx2
import pytest
from typesafe_sdk import (
    Noul,
    RetryPolicy,
    TypeSafeClient,
    TypeSafeInternalServerError,
    TypeSafeRateLimitError,
)

from decider import YesNo
from decider.answers import Outcome
from decider.client import AsyncDeciderClient
from decider.config import HttpSection, ServerSection
from decider.service.convert import decision_from_proto, request_to_proto
from decider.systemone.mapping import parse_body, to_decider
from decider.v1 import decider_pb2_grpc as pb_grpc
from helpers.daemon_thread import KEY, MODEL, DaemonThread

AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
LATE = json.dumps({"model": MODEL, "state": "The parcel is late.", "questions": {
    "q": {"type": "noul", "instructions": "Is it late?"}}}).encode()


def test_queue_full_and_not_ready_say_when_to_retry(cache_dir, model_path):
    with DaemonThread(cache_dir, server=ServerSection(max_queue=0)) as full, TypeSafeClient(
            api_key=KEY, base_url=full.url, retry=RetryPolicy(max_retries=0)) as client:
        with pytest.raises(TypeSafeRateLimitError) as busy:
            client.system_one(state="x", questions={"q": Noul(instructions="Ok?")}, model=MODEL)
        assert busy.value.retry_after_ms == 1000
        assert busy.value.body["detail"]["reason"] == "QUEUE_FULL"
        full.daemon.frontend.accepting = False  # as while draining or reloading
        with pytest.raises(TypeSafeInternalServerError) as down:
            client.system_one(state="x", questions={"q": Noul(instructions="Ok?")}, model=MODEL)
        assert down.value.status == 503 and down.value.headers["retry-after"] == "5"
        ready = httpx2.get(f"{full.url}/readyz")
        assert ready.status_code == 503 and ready.headers["retry-after"] == "5"


def test_one_api_key_flooding_a_half_full_queue_leaves_other_keys_room(cache_dir, model_path):
    """Queue 16, the engine held: 12 requests at once under one key (12 connections) get 8
    places, the other 4 are 429 QUEUE_FULL; a request under another key is answered."""
    other_key = "another-key-0123456789"
    http = HttpSection(address="127.0.0.1:0", api_keys=(KEY, other_key))
    with DaemonThread(cache_dir, http, server=ServerSection(max_queue=16, max_batch=1)) as s:
        s.fault_file.write_text("hang:3")

        async def scenario():
            async with httpx2.AsyncClient(base_url=s.url, headers=AUTH, timeout=120) as c:
                sent = [asyncio.create_task(c.post("/v1/systemone", content=LATE))
                        for _ in range(12)]
                while sum(t.done() for t in sent) < 4:  # the refusals come at once
                    await asyncio.sleep(0.02)
                other = await c.post("/v1/systemone", content=LATE,
                                     headers={"Authorization": f"Bearer {other_key}"})
                return other, [r.status_code for r in await asyncio.gather(*sent)]

        other, statuses = asyncio.run(scenario())
        assert other.status_code == 200
        assert sorted(statuses) == [200] * 8 + [429] * 4


def test_expired_and_abandoned_requests_never_reach_the_engine(cache_dir, model_path):
    http = HttpSection(address="127.0.0.1:0", api_keys=(KEY,), request_timeout_seconds=3.0)
    with DaemonThread(cache_dir, http) as s:

        def reached() -> float:  # the engine process's counter, as /metrics sums it
            return s.daemon.metrics.exposed().get_sample_value("decider_engine_requests_total")

        async def scenario():
            # the first over gRPC, with no deadline: its call outlasts the HTTP timeout
            async with httpx2.AsyncClient(base_url=s.url, headers=AUTH, timeout=60) as c, \
                    AsyncDeciderClient(s.grpc_address, timeout=None) as patient:
                first = asyncio.create_task(patient.decide("The parcel is late.",
                                                           [YesNo("Is it late?")]))
                await asyncio.sleep(0.3)
                late = await c.post("/v1/systemone", content=LATE)  # its 3 s pass waiting
                return await first, late

        before = reached()
        s.fault_file.write_text("hang:4")  # the first call holds the engine 4 s
        first, late = asyncio.run(scenario())
        assert first.answers[0].question == "Is it late?" and late.status_code == 504
        assert late.json()["detail"]["reason"] == "DEADLINE_EXCEEDED"
        assert reached() == before + 1
        head = (f"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                f"Content-Length: {len(LATE)}\r\n\r\n").encode()
        host, port = s.url.removeprefix("http://").rsplit(":", 1)
        s.fault_file.write_text("hang:1")
        with socket.create_connection((host, int(port))) as holder:
            holder.sendall(head + LATE)
            time.sleep(0.3)
            with socket.create_connection((host, int(port))) as gone:
                gone.sendall(head + LATE)  # queued behind the holder; then its client leaves
                time.sleep(0.2)
            assert b"200 OK" in holder.recv(65536)
        time.sleep(0.5)
        assert reached() == before + 2  # the holder's request, not the one whose client left


def test_grpc_and_http_give_the_in_process_answers(cache_dir, decider):
    """One request of every question type, over both front ends of one daemon and in this
    process. Equal to the last bit: each is alone in its engine call, and llama.cpp on the
    CPU computes the same tokens alike in any process (measured: no difference at all), so
    any difference is a different prompt, window or model reaching the engine."""
    body = {"model": MODEL, "state": {"ticket": "I was charged twice. Refund me today!"},
            "questions": {
                "refund": {"type": "noul", "instructions": "Does `ticket` ask for a refund?"},
                "spam": {"type": "noul", "criteria": {"true": "ads", "false": "a customer"}},
                "topic": {"type": "choice", "criteria": {"billing": "charges",
                                                         "shipping": None}},
                "urgency": {"type": "score", "criteria": ["can wait", "this week", "today"]},
                "tags": {"type": "decider.multi_label", "criteria": {"refund": None,
                                                                     "angry": "upset"}}}}
    asked = to_decider(parse_body(body))
    with DaemonThread(cache_dir) as s:
        over_http = httpx2.post(f"{s.url}/v1/systemone", json=body, headers=AUTH,
                                timeout=300).json()
        with grpc.insecure_channel(s.grpc_address) as channel:
            reply = pb_grpc.DeciderStub(channel).Decide(
                request_to_proto(asked.request, MODEL), timeout=300)
    over_grpc = decision_from_proto(reply)
    # the gRPC request read the state the HTTP one left in the daemon's prefix cache
    assert over_grpc.usage.cached_tokens > 0
    assert _uncached(over_grpc) == _uncached(decider.decide_request(asked.request))
    here = decider.decide_systemone(body)
    assert (over_http["answers"], over_http["usage"]) == (here["answers"], here["usage"])
    as_systemone = asked.response(Outcome(over_grpc, 0.0, 0.0, reply.provenance.model_sha256,
                                          reply.provenance.template_version)
                                  ).model_dump(mode="json")
    assert as_systemone["answers"] == over_http["answers"]
    for provenance in (over_http["x_decider"], as_systemone["x_decider"]):
        assert provenance["model_sha256"] == here["x_decider"]["model_sha256"]
        assert provenance["template_version"] == here["x_decider"]["template_version"]


def _uncached(decision):
    """A decision as a fresh read gives it: the prefix cache moves only cached_tokens."""
    return replace(decision, usage=replace(decision.usage, cached_tokens=0))
