"""Hostile input through HTTP: every bad body gets a clear 4xx naming the field (or the
limit), bad keys and slow clients are refused, and the server goes on serving."""

from __future__ import annotations

import json
import socket
import time

import httpx2
import pytest

from decider.config import HttpSection
from helpers.daemon_thread import KEY, MODEL, DaemonThread

TIMEOUT = 3.0  # the server's request_timeout_seconds: a slow body is refused after it
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}


def body(**fields) -> dict:
    return {"model": MODEL, "state": "The parcel is late.",
            "questions": {"q": {"type": "noul", "instructions": "Is it late?"}}, **fields}


def nested(depth: int) -> dict:
    value: object = "x"
    for _ in range(depth):
        value = [value]
    return body(state={"deep": value})


@pytest.fixture(scope="module")
def served(cache_dir, model_path):
    http = HttpSection(address="127.0.0.1:0", api_keys=(KEY,), request_timeout_seconds=TIMEOUT)
    with DaemonThread(cache_dir, http) as s:
        yield s
        # after all of it: still serving, and answering with the model
        r = httpx2.post(f"{s.url}/v1/systemone", json=body(), headers=AUTH, timeout=300)
        assert r.status_code == 200 and 0 < r.json()["answers"]["q"]["noul"] < 1


def post(served, content: bytes, headers=AUTH) -> httpx2.Response:
    return httpx2.post(f"{served.url}/v1/systemone", content=content, headers=headers,
                       timeout=60)


CASES = {
    "malformed JSON": (b'{"model": "x", "state": ', ["body"], "json_invalid"),
    "not an object": (b"[1, 2]", ["body"], "model_type"),
    "empty body": (b"", ["body"], "json_invalid"),
    "invalid UTF-8": (json.dumps(body()).encode().replace(b"late", b"l\xffte"), ["body"],
                      "json_invalid"),
    "a lone surrogate": (json.dumps(body(state="\ud800"), ensure_ascii=True).encode(),
                         ["body"], "json_invalid"),
    "NaN in the state": (json.dumps(body(state={"n": float("nan")})).encode(),
                         ["body", "state"], "value_error"),
    "model of a wrong type": (json.dumps(body(model=7)).encode(), ["body", "model"],
                              "string_type"),
    "questions as a list": (json.dumps(body(questions=[{"type": "noul"}])).encode(),
                            ["body", "questions"], "dict_type"),
    "no questions": (json.dumps(body(questions={})).encode(), ["body", "questions"],
                     "too_short"),
    "an unknown question type": (json.dumps(body(questions={"q": {"type": "guess"}})).encode(),
                                 ["body", "questions", "q"], "union_tag_invalid"),
    "a question without a type": (json.dumps(body(questions={"q": {"instructions": "?"}})
                                             ).encode(), ["body", "questions", "q"],
                                  "union_tag_not_found"),
    "256 choice options": (json.dumps(body(questions={"q": {"type": "choice", "criteria": {
        f"option {i}": None for i in range(256)}}})).encode(),
        ["body", "questions", "q", "choice", "criteria"], "too_long"),
    "no choice options": (json.dumps(body(questions={"q": {"type": "choice", "criteria": {}}})
                                     ).encode(), ["body", "questions", "q", "choice", "criteria"],
                          "too_short"),
    "a threshold past 1": (json.dumps(body(questions={"q": {
        "type": "decider.multi_label", "criteria": {"a": None}, "threshold": 1.5}})).encode(),
        ["body", "questions", "q", "decider.multi_label", "threshold"], "less_than_equal"),
    "an empty state": (json.dumps(body(state="  ")).encode(), ["body", "state"], "value_error"),
    "an empty object state": (json.dumps(body(state={})).encode(), ["body", "state"],
                              "value_error"),
    "a 10 MB state": (json.dumps(body(state="word " * 2_000_000)).encode(), ["body", "state"],
                      "value_error"),
    "nesting 300 deep": (json.dumps(nested(300)).encode(), ["body"], "json_invalid"),
    "option names differing in case": (json.dumps(body(questions={"q": {
        "type": "choice", "criteria": {"Yes": None, "yes": "twice"}}})).encode(),
        ["body", "questions", "q", "choice", "criteria", "yes"], "value_error"),
    "instructions neither text nor JSON": (json.dumps(body(questions={"q": {
        "type": "noul", "instructions": 5}})).encode(),
        ["body", "questions", "q", "noul", "instructions"], "content_type"),
    "a multi-line option name": (json.dumps(body(questions={"q": {
        "type": "choice", "criteria": {"a\nb": None, "c": None}}})).encode(),
        ["body", "questions", "q", "choice", "criteria", "a\nb"], "value_error"),
}


@pytest.mark.parametrize("name", CASES)
def test_a_bad_body_is_422_naming_the_field(served, name):
    content, loc, kind = CASES[name]
    r = post(served, content)
    assert r.status_code == 422, r.text
    errors = r.json()["detail"]
    assert any(e["loc"] == loc and e["type"] == kind and e["msg"] for e in errors), errors
    assert httpx2.get(f"{served.url}/healthz").status_code == 200


def test_a_wrong_method_is_405_naming_the_allowed_one(served):
    r = httpx2.get(f"{served.url}/v1/systemone", headers=AUTH, timeout=10)
    assert (r.status_code, r.headers["allow"]) == (405, "POST")


def test_the_limits_are_named_in_the_message(served):
    big = post(served, json.dumps(body(state="word " * 2_000_000)).encode()).json()["detail"]
    assert "over the limit of 262144" in big[0]["msg"]
    many = post(served, json.dumps(body(questions={f"q{i}": {"type": "noul", "instructions": "?"}
                                                   for i in range(33)})).encode())
    assert "over the limit of 32" in many.json()["detail"][0]["msg"]


def test_one_choice_option_is_answered_for_sure(served):
    r = post(served, json.dumps(body(questions={"q": {"type": "choice", "criteria": {
        "late": "the parcel has not come"}}})).encode())
    assert r.status_code == 200
    answer = r.json()["answers"]["q"]
    assert (answer["choice"], answer["probabilities"], answer["confidence"]) == (
        "late", {"late": 1.0}, 1.0)


def test_a_body_over_the_limit_is_413_before_it_is_read(served):
    r = post(served, b"x" * (16 * 2**20 + 1))
    assert r.status_code == 413 and r.json()["detail"]["limit"] == 16 * 2**20
    with socket.create_connection(_address(served)) as s:  # announced, never sent
        s.sendall(b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                  KEY.encode() + b"\r\nContent-Length: 999999999\r\n\r\n")
        status, reply = _reply(s)
        assert b" 413 " in status and b"BODY_TOO_LARGE" in reply


@pytest.mark.parametrize("auth, message", [
    ({}, "send an API key as Authorization: Bearer <key>"),
    ({"Authorization": "Bearer wrong-key-0123456789"}, "the API key is not valid"),
    ({"Authorization": f"Basic {KEY}"}, "send an API key as Authorization: Bearer <key>"),
    ({"Authorization": f"Bearer {KEY}x"}, "the API key is not valid"),
])
def test_a_missing_or_wrong_key_is_401_before_the_body_is_read(served, auth, message):
    r = post(served, b"{not json", headers=auth)
    assert r.status_code == 401 and r.json()["detail"]["message"] == message
    assert r.headers["www-authenticate"] == 'Bearer realm="decider"'


def _address(served) -> tuple[str, int]:
    host, port = served.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def _reply(sock: socket.socket) -> tuple[bytes, bytes]:
    """The status line and the body of one HTTP response read off a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(rest) < length:
        rest += sock.recv(65536)
    return head.split(b"\r\n")[0], rest


def test_a_slow_client_is_refused_and_others_are_served_meanwhile(served):
    content = json.dumps(body()).encode()
    with socket.create_connection(_address(served)) as slow:
        slow.sendall(b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                     KEY.encode() + f"\r\nContent-Length: {len(content)}\r\n\r\n".encode() +
                     content[:10])
        t0 = time.monotonic()
        other = httpx2.get(f"{served.url}/v1/models", headers=AUTH)  # not held up
        assert other.status_code == 200 and time.monotonic() - t0 < 1
        slow.settimeout(TIMEOUT + 10)
        status, reply = _reply(slow)
    assert time.monotonic() - t0 >= TIMEOUT - 0.5
    assert b" 408 " in status and json.loads(reply)["detail"]["reason"] == "BODY_TIMEOUT"


def test_a_client_slow_with_its_headers_is_cut_off(served):
    with socket.create_connection(_address(served)) as slow:
        slow.sendall(b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nAuthori")
        t0 = time.monotonic()
        assert httpx2.get(f"{served.url}/healthz").status_code == 200  # not held up
        slow.settimeout(TIMEOUT + 10)
        assert slow.recv(65536) == b""  # closed
    assert TIMEOUT - 0.5 <= time.monotonic() - t0 <= TIMEOUT + 5


def test_garbage_on_the_socket_is_refused_and_the_server_goes_on(served):
    for junk in (b"\x00\xff\xfe garbage\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n",
                 b"POST /v1/systemone HTTP/1.1\r\nContent-Length: -5\r\n\r\n"):
        with socket.create_connection(_address(served)) as s:
            s.sendall(junk)
            s.settimeout(5)
            reply = s.recv(65536)
        assert reply == b"" or b" 400 " in reply.split(b"\r\n")[0], reply
    assert httpx2.get(f"{served.url}/healthz").status_code == 200
