"""The System One HTTP API against TypeSafe's own published client (typesafe-sdk), served by
the real daemon: its uvicorn on a real socket, the real gemma-3-270m in its engine process
(tests/test_http_daemon.py: what needs a daemon of its own)."""

from __future__ import annotations

import io
import json
import re
import time

import httpx2
import jsonschema
import pytest
import structlog
from typesafe_sdk import (
    Choice,
    Noul,
    RetryPolicy,
    Score,
    TypeSafeAuthenticationError,
    TypeSafeBadRequestError,
    TypeSafeClient,
    TypeSafeError,
    TypeSafeInternalServerError,
    TypeSafeNotFoundError,
    TypeSafeUnprocessableEntityError,
)

from decider.config import HttpSection
from decider.logs import configure
from helpers.daemon_thread import KEY, MODEL, DaemonThread

STATE = {"ticket": {"subject": "Duplicate charge",
                    "text": "I was charged twice for order A-104. Please refund me today."},
         "customer": "Ana"}
QUESTIONS = {
    "refund": Noul(instructions="Does `ticket.text` ask for a refund?"),
    "spam": Noul(instructions="Is this message spam?",
                 criteria={"true": "unsolicited advertising", "false": "a real customer"}),
    "topic": Choice(instructions="What is `ticket` about?",
                    criteria={"billing": "charges and refunds", "shipping": None,
                              "technical": "bugs and errors"}),
    "urgency": Score(instructions="How urgent is it?",
                     criteria=["can wait", "this week", "today"]),
    "only": Choice(criteria={"billing": None}),
}
ALIAS = "jev-latest"  # the SDK's default model: an app that never names one works unchanged


@pytest.fixture(scope="module")
def served(cache_dir, model_path):
    http = HttpSection(address="127.0.0.1:0", api_keys=(KEY,), model_aliases=(ALIAS,))
    with DaemonThread(cache_dir, http) as s:
        yield s


def sdk(served, key=KEY) -> TypeSafeClient:
    return TypeSafeClient(api_key=key, base_url=served.url, retry=RetryPolicy(max_retries=0),
                          timeout=300)


def peak_confidence(ps) -> float:
    """TypeSafe's formula for a choice: (n*m - 1)/(n - 1), m the top probability."""
    ps = list(ps)
    return (len(ps) * max(ps) - 1) / (len(ps) - 1)


def concentration_confidence(ps) -> float:
    """TypeSafe's formula for a score: 1 - sum(p_i |i - mode|) / the uniform spread."""
    ps = list(ps)
    n, mode = len(ps), max(range(len(ps)), key=ps.__getitem__)
    uniform = sum(abs(i - (n - 1) / 2) for i in range(n)) / n
    return max(0.0, 1 - sum(p * abs(i - mode) for i, p in enumerate(ps)) / uniform)


def test_the_sdk_gets_every_question_type_answered_as_the_in_process_api_does(served, decider):
    with sdk(served) as client:  # no model named: the SDK's default, an alias here
        resp = client.system_one(state=STATE, questions=QUESTIONS)
    assert resp.model == MODEL and resp.usage.output_tokens == 0 and resp.usage.input_tokens > 0
    assert resp.request_id == resp.raw_http_response.headers["x-request-id"]
    for name in ("refund", "spam"):
        assert 0 < resp.nouls[name].noul < 1
    topic = resp.choices["topic"]
    assert list(topic.probabilities) == ["billing", "shipping", "technical"]
    assert sum(topic.probabilities.values()) == pytest.approx(1, abs=1e-9)
    assert topic.choice == max(topic.probabilities, key=topic.probabilities.get)
    assert topic.confidence == pytest.approx(peak_confidence(topic.probabilities.values()))
    only = resp.choices["only"]
    assert (only.choice, only.probabilities, only.confidence) == ("billing", {"billing": 1.0}, 1.0)
    urgency = resp.scores["urgency"]
    assert urgency.legend == {0: "can wait", 1: "this week", 2: "today"}
    assert sum(urgency.probabilities.values()) == pytest.approx(1, abs=1e-9)
    assert urgency.score == pytest.approx(sum(i * p for i, p in urgency.probabilities.items()))
    assert urgency.confidence == pytest.approx(
        concentration_confidence(urgency.probabilities.values()))
    # alone in its engine call, the HTTP answer is the in-process one to the last bit
    body = {"model": MODEL, "state": STATE,
            "questions": {k: q.model_dump() for k, q in QUESTIONS.items()}}
    here = decider.decide_systemone(body)
    there = resp.raw_http_response.json()
    assert there["answers"] == here["answers"]
    assert there["usage"] == here["usage"]
    assert there["x_decider"]["model_sha256"] == here["x_decider"]["model_sha256"]


def test_the_sdk_lists_the_model_under_its_name_and_aliases(served, decider):
    with sdk(served) as client:
        cards = client.models.list().models
    assert [c.name for c in cards] == [MODEL, ALIAS]
    assert all(re.fullmatch(r"\d{4}-\d{2}-\d{2}", c.release_date) and c.description
               for c in cards)
    raw = httpx2.get(f"{served.url}/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    assert raw.json()["models"][0]["x_n_ctx"] == decider.n_ctx == 2048


def test_the_sdk_raises_its_own_errors_for_bad_fields_keys_models_and_the_window(served):
    with sdk(served) as client:
        with pytest.raises(TypeSafeUnprocessableEntityError) as bad:
            client.system_one(state="x", questions={
                "q": {"type": "score", "criteria": [f"level {i}" for i in range(11)]}})
        assert bad.value.status == 422
        assert bad.value.body["detail"][0]["loc"] == ["body", "questions", "q", "score",
                                                      "criteria"]
        assert "questions.q.score.criteria" in str(bad.value)
        with pytest.raises(TypeSafeNotFoundError) as unknown:
            client.system_one(state="x", questions={"q": Noul(instructions="Is it?")},
                              model="no-such-model")
        assert unknown.value.body["detail"]["reason"] == "MODEL_NOT_FOUND"
        # over 1 KiB: the SDK sends it zstd-compressed; over the window: refused, not cut
        with pytest.raises(TypeSafeBadRequestError) as long:
            client.system_one(state="word " * 2500, questions={"q": Noul(instructions="Ok?")})
        detail = long.value.body["detail"]
        assert detail["reason"] == "PROMPT_TOO_LONG" and detail["n_ctx"] == 2048
        assert detail["prompt_tokens"] > 2048 and str(detail["prompt_tokens"]) in detail["message"]
    with sdk(served, key="not-the-key-0123456789") as stranger:
        with pytest.raises(TypeSafeAuthenticationError) as wrong:
            stranger.models.list()
    assert wrong.value.headers["www-authenticate"].startswith("Bearer")
    assert wrong.value.body["detail"]["message"] == "the API key is not valid"
    with pytest.raises(TypeSafeError, match="No API key"):  # the SDK never sends none...
        TypeSafeClient(api_key="", base_url=served.url)
    missing = httpx2.get(f"{served.url}/v1/models")  # ...so a bare client does
    assert missing.status_code == 401 and "Bearer" in missing.json()["detail"]["message"]


def test_compressed_bodies_are_decoded_and_bounded(served):
    import gzip

    from backports.zstd import compress

    body = json.dumps({"model": MODEL, "state": "x", "questions": {"q": {"type": "choice",
                       "criteria": {"a": None}}}}).encode()
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    for encoding, packed in (("zstd", compress(body)), ("gzip", gzip.compress(body))):
        r = httpx2.post(f"{served.url}/v1/systemone", content=packed,
                        headers={**auth, "Content-Encoding": encoding}, timeout=300)
        assert r.status_code == 200, r.text
        assert r.json()["answers"]["q"]["probabilities"] == {"a": 1.0}
    bomb = compress(b'{"state": "' + b" " * (17 * 2**20) + b'"}')  # 17 MiB in ~1 KiB
    r = httpx2.post(f"{served.url}/v1/systemone", content=bomb,
                    headers={**auth, "Content-Encoding": "zstd"})
    assert r.status_code == 413 and r.json()["detail"]["limit"] == 16 * 2**20
    r = httpx2.post(f"{served.url}/v1/systemone", content=body[:-5] + b"xxxxx",
                    headers={**auth, "Content-Encoding": "zstd"})
    assert r.status_code == 400 and r.json()["detail"]["reason"] == "BAD_ENCODING"
    r = httpx2.post(f"{served.url}/v1/systemone", content=body,
                    headers={**auth, "Content-Encoding": "br"})
    assert r.status_code == 415 and "zstd" in r.json()["detail"]["message"]


def test_the_openapi_document_describes_what_the_server_does(served):
    doc = httpx2.get(f"{served.url}/openapi.json").json()
    assert {"/v1/systemone", "/v1/models", "/healthz", "/readyz", "/metrics"} <= set(doc["paths"])
    post = doc["paths"]["/v1/systemone"]["post"]
    assert post["security"] == [{"HTTPBearer": []}]
    assert {"200", "400", "401", "404", "413", "422", "429", "500", "503", "504"} <= set(
        post["responses"])

    def check(instance, name: str, fits: bool = True) -> None:
        schema = {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}
        errors = list(jsonschema.Draft202012Validator(schema).iter_errors(instance))
        assert not errors if fits else errors, errors

    body = {"model": MODEL, "state": {"a": [1, 2]}, "questions": {
        "q": {"type": "noul", "criteria": {"true": "yes it is"}},
        "c": {"type": "choice", "criteria": {"x": None}},
        "s": {"type": "score", "instructions": {"task": "rate"}, "criteria": ["lo", "hi"]},
        "m": {"type": "decider.multi_label", "criteria": {"x": None, "y": "why"},
              "thresholds": {"y": 0.2}}}}
    check(body, "SystemOneRequest")
    check({**body, "questions": {"c": {"type": "choice", "criteria": {
        str(i): None for i in range(256)}}}}, "SystemOneRequest", fits=False)
    check({**body, "questions": {"b": {"type": "box"}}}, "SystemOneRequest", fits=False)
    auth = {"Authorization": f"Bearer {KEY}"}
    ok = httpx2.post(f"{served.url}/v1/systemone", json=body, headers=auth, timeout=300)
    assert ok.status_code == 200
    check(ok.json(), "SystemOneResponse")
    assert ok.json()["answers"]["m"]["labels"]["y"]["threshold"] == 0.2
    bad = httpx2.post(f"{served.url}/v1/systemone", json={"state": 3}, headers=auth)
    assert bad.status_code == 422
    check(bad.json(), "ValidationFailed")
    long = httpx2.post(f"{served.url}/v1/systemone", headers=auth, json={
        **body, "state": "word " * 2500})
    assert long.status_code == 400
    check(long.json(), "Refusal")
    check(httpx2.get(f"{served.url}/v1/models", headers=auth).json(), "ModelList")


def test_health_metrics_request_ids_and_json_logs_without_the_text(served):
    assert httpx2.get(f"{served.url}/healthz").json() == {"status": "ok"}
    assert httpx2.get(f"{served.url}/readyz").status_code == 200
    assert httpx2.get(f"{served.url}/metrics").status_code == 401
    auth = {"Authorization": f"Bearer {KEY}"}
    mine = httpx2.get(f"{served.url}/v1/models", headers={**auth, "X-Request-ID": "app-42.x"})
    assert mine.headers["x-request-id"] == mine.headers["x-typesafe-request-id"] == "app-42.x"
    odd = httpx2.get(f"{served.url}/v1/models", headers={**auth, "X-Request-ID": "a b\tc"})
    assert re.fullmatch(r"[0-9a-f]{32}", odd.headers["x-request-id"])
    lines = io.StringIO()
    configure(level="info", fmt="json", stream=lines)
    try:
        r = httpx2.post(f"{served.url}/v1/systemone", headers=auth, timeout=300, json={
            "model": MODEL, "state": "SECRET-TEXT the parcel is late",
            "questions": {"late": {"type": "noul", "instructions": "SECRET-QUESTION late?"}}})
        rid = r.headers["x-request-id"]
        for _ in range(100):  # the line is written once the response is out
            if rid in lines.getvalue():
                break
            time.sleep(0.05)
    finally:
        structlog.reset_defaults()
    assert r.status_code == 200
    logged = [json.loads(line) for line in lines.getvalue().splitlines()]
    [line] = [x for x in logged if x.get("request_id") == rid]
    assert (line["status"], line["outcome"], line["questions"]) == (200, "OK", 1)
    assert line["prompt_tokens"] == r.json()["usage"]["input_tokens"] and line["ms"] > 0
    assert "SECRET" not in lines.getvalue()
    text = httpx2.get(f"{served.url}/metrics", headers=auth).text
    assert re.search(r'decider_http_requests_total\{path="/v1/systemone",status="200"\} [1-9]',
                     text)
    assert re.search(r'decider_requests_total\{outcome="OK"\} [1-9]', text)
    assert re.search(r"decider_engine_requests_total [1-9]", text)  # the engine process's


def replaced(served, engine) -> list[int]:
    """/readyz's statuses, polled until a new engine process serves in place of `engine`."""
    seen, deadline = [], time.monotonic() + 120
    while served.daemon.engine in (engine, None) or seen[-1:] != [200]:
        assert time.monotonic() < deadline, seen
        seen.append(httpx2.get(f"{served.url}/readyz").status_code)
        time.sleep(0.1)
    return seen


def test_engine_failures_are_500_and_503_and_the_server_goes_on(served):
    """No logits: 500, and that engine process is replaced (not ready while the new one
    loads); out of memory: 503 for that call only, the same process goes on serving."""
    question = {"q": Noul(instructions="Is it late?")}
    with sdk(served) as client:
        engine = served.daemon.engine
        served.fault_file.write_text("zero-logits")
        with pytest.raises(TypeSafeInternalServerError) as broken:
            client.system_one(state="The parcel is late.", questions=question)
        assert broken.value.status == 500
        assert broken.value.body["detail"]["reason"] == "ENGINE_RETURNED_NO_LOGITS"
        assert 503 in replaced(served, engine)
        engine = served.daemon.engine
        served.fault_file.write_text("oom")
        with pytest.raises(TypeSafeInternalServerError) as oom:
            client.system_one(state="The parcel is late.", questions=question)
        assert oom.value.status == 503 and oom.value.headers["retry-after"] == "5"
        assert oom.value.body["detail"]["reason"] == "ENGINE_OUT_OF_MEMORY"
        assert 0 < client.system_one(state="The parcel is late.",
                                     questions=question).nouls["q"].noul < 1
        assert served.daemon.engine is engine


def test_one_request_file_works_over_http_in_the_cli_and_in_python(served, decider, run_cli,
                                                                    tmp_path):
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"model": MODEL, "state": STATE, "questions": {
        "refund": {"type": "noul", "instructions": "Does `ticket.text` ask for a refund?"},
        "topic": {"type": "choice", "criteria": {"billing": None, "shipping": "parcels"}}}}))
    over_http = httpx2.post(f"{served.url}/v1/systemone", content=request.read_bytes(),
                            headers={"Authorization": f"Bearer {KEY}"}, timeout=300).json()
    cli = run_cli("run", MODEL, "--systemone", str(request), "--n-ctx", "2048")
    assert cli.returncode == 0, cli.stderr.decode()
    in_python = decider.decide_systemone(request.read_bytes())
    for out in (json.loads(cli.stdout), in_python):
        assert (out["answers"], out["usage"], out["model"]) == (
            over_http["answers"], over_http["usage"], MODEL)
    request.write_text(json.dumps({"model": MODEL, "state": "x", "questions": {
        "q": {"type": "score", "criteria": []}}}))
    bad = run_cli("run", MODEL, "--systemone", str(request))
    assert bad.returncode == 2 and b"body.questions.q.score.criteria" in bad.stderr
    mixed = run_cli("run", MODEL, "text", "--systemone", str(request))
    assert mixed.returncode == 2 and b"--systemone" in mixed.stderr
