"""Published System One clients, each with its defaults, against a daemon with no HTTP
configuration but its address and a key (the real gemma-3-270m): TypeSafe's SDK and five
independent clients from PyPI get the in-process answers. And the API as they speak it:
model names, unknown fields, images, error bodies, a trailing slash."""

from __future__ import annotations

import json

import httpx2
import jsonschema
import pytest
from typesafe_sdk import Choice, Noul, RetryPolicy, Score, TypeSafeClient

from decider.config import HttpSection
from helpers.daemon_thread import KEY, MODEL, DaemonThread

TEXT = "I was charged twice for order A-104. Please refund me today."
QUESTIONS = {"refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
             "team": {"type": "choice", "instructions": "Which team should answer?",
                      "criteria": {"billing": None, "tech": "bugs and errors"}},
             "urgency": {"type": "score", "instructions": "How urgent is it?",
                         "criteria": ["can wait", "this week", "today"]}}
WITHOUT_TEAM = {k: v for k, v in QUESTIONS.items() if k != "team"}
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def served(cache_dir, model_path):
    with DaemonThread(cache_dir, HttpSection(address="127.0.0.1:0", api_keys=(KEY,))) as s:
        yield s


def in_process(decider, questions: dict) -> dict:
    """What the in-process API answers for these questions (on llama.cpp a question's
    numbers move a little with the others asked beside it: the same set is compared)."""
    out = decider.decide_systemone({"model": MODEL, "state": TEXT, "questions": questions})
    a = out["answers"]
    return {k: a[k].get("noul", a[k].get("choice", a[k].get("score"))) for k in a}


def typesafe_sdk(url):
    with TypeSafeClient(api_key=KEY, base_url=url, retry=RetryPolicy(max_retries=0),
                        timeout=300) as c:
        r = c.system_one(state=TEXT, questions={
            "refund": Noul(instructions=QUESTIONS["refund"]["instructions"]),
            "team": Choice(instructions=QUESTIONS["team"]["instructions"],
                           criteria=QUESTIONS["team"]["criteria"]),
            "urgency": Score(instructions=QUESTIONS["urgency"]["instructions"],
                             criteria=QUESTIONS["urgency"]["criteria"])})
    return r.nouls["refund"].noul, r.choices["team"].choice, r.scores["urgency"].score


def jev_lite(url):
    from jev_lite import TypeSafe

    r = TypeSafe(api_key=KEY, base_url=url, timeout=300).system_one.create(
        state=TEXT, questions=QUESTIONS)
    return r.answers["refund"].noul, r.answers["team"].choice, r.answers["urgency"].score


def system_one(url):
    from system_one import SystemOne
    from system_one.settings import TypesafeConfig  # its TypeSafe preset: jev-latest

    r = SystemOne(TypesafeConfig(base_url=url, api_key=KEY, timeout=300)).ask(TEXT, QUESTIONS)
    return r.answers["refund"].noul, r.answers["team"].choice, r.answers["urgency"].score


def pydecide(url):
    from decide import Choice as DChoice
    from decide import Client
    from decide import Noul as DNoul
    from decide import Score as DScore
    from decide.backends.typesafe import TypeSafeBackend

    q = QUESTIONS
    r = Client(backends=[TypeSafeBackend(KEY, base_url=url, timeout=300)]).decide(TEXT, {
        "refund": DNoul(q["refund"]["instructions"]),
        "team": DChoice(q["team"]["instructions"], q["team"]["criteria"]),
        "urgency": DScore(q["urgency"]["instructions"], q["urgency"]["criteria"])})
    return r["refund"].noul, r["team"].choice, r["urgency"].score


def systemone_client(url):
    from systemone import Client

    r = Client(base_url=url, api_key=KEY, timeout=300).system_one(TEXT, QUESTIONS)
    return r.nouls["refund"].noul, r.choices["team"].choice, r.scores["urgency"].score


def jevzilla(url):
    from jevzilla import JEVzilla

    r = JEVzilla(backend="typesafe", api_key=KEY, url=url + "/v1/systemone").evaluate(
        {"state": TEXT, "questions": WITHOUT_TEAM})
    return r.answers["refund"]["noul"], None, r.answers["urgency"]["score"]


@pytest.mark.parametrize("client", [typesafe_sdk, jev_lite, system_one, pydecide,
                                    systemone_client, jevzilla], ids=lambda c: c.__name__)
def test_a_published_client_with_its_defaults_gets_the_in_process_answers(served, decider,
                                                                          client):
    """jev-latest, or no model at all (systemone-client), is the served model. jevzilla
    sends a null option description as the text "None": it is asked without the choice."""
    noul, choice, score = client(served.url)
    here = in_process(decider, QUESTIONS if choice is not None else WITHOUT_TEAM)
    assert noul == pytest.approx(here["refund"], abs=1e-9)
    assert choice == here.get("team")
    assert score == pytest.approx(here["urgency"], abs=1e-9)


def post(served, body, path="/v1/systemone", **headers):
    return httpx2.post(served.url + path, json=body, headers={**AUTH, **headers}, timeout=300)


@pytest.mark.parametrize("model", ["jev-latest", "jev-1.13.0", "typesafe/jev-1.13",
                                   "~typesafe/jev-latest", MODEL, f"openrouter/{MODEL}", None])
def test_the_served_model_answers_to_typesafes_names_and_openrouters_forms(served, model):
    body = {"state": TEXT, "questions": {"refund": QUESTIONS["refund"]}}
    r = post(served, body if model is None else {**body, "model": model})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == MODEL


def test_unknown_fields_are_ignored_and_counted_and_decider_adds_only_x_names(served):
    before = served.daemon.metrics.exposed()
    body = {"model": "jev-latest", "state": TEXT, "x_trace_id": "t-1", "seed": 7,
            "questions": {"refund": {**QUESTIONS["refund"], "abstain_option": True},
                          "team": QUESTIONS["team"]}}
    r = post(served, body)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert set(doc) == {"model", "answers", "usage", "x_decider"}
    ours = {"x_label_mass", "x_calibrated", "x_abstained", "x_abstain_reason"}
    assert set(doc["answers"]["refund"]) == {"type", "noul", *ours}
    assert set(doc["answers"]["team"]) == {"type", "choice", "confidence", "probabilities",
                                           *ours}
    metrics = httpx2.get(served.url + "/metrics", headers=AUTH).text
    assert "decider_http_ignored_fields_total 3.0" in metrics, before


def test_images_are_refused_plainly_as_json_assets_and_as_multipart(served):
    body = {"state": "<image:0123>", "questions": {"q": QUESTIONS["refund"]},
            "assets": {"<image:0123>": {"type": "image", "format": "png", "data_base64": ""}}}
    r = post(served, body)
    assert r.status_code == 422
    [error] = r.json()["detail"]
    assert error["loc"] == ["body", "assets"] and "images are not supported" in error["msg"]
    multipart = httpx2.post(served.url + "/v1/systemone", headers=AUTH, timeout=60,
                            files={"request": (None, json.dumps(body), "application/json"),
                                   "asset-0": ("asset-0", b"\x89PNG....", "image/png")})
    assert multipart.status_code == 415
    assert multipart.json()["detail"]["error_type"] == "api_usage_error"
    assert "images are not supported" in multipart.json()["detail"]["message"]


def test_every_refusal_has_typesafes_shape_and_is_in_the_openapi_document(served):
    doc = httpx2.get(served.url + "/openapi.json").json()
    refusals = {
        401: httpx2.get(served.url + "/v1/models"),
        404: httpx2.get(served.url + "/v1/nothing-here", headers=AUTH),
        405: httpx2.get(served.url + "/v1/systemone", headers=AUTH),
        415: httpx2.post(served.url + "/v1/systemone", content=b"{}", headers={
            **AUTH, "Content-Encoding": "br"}),
        400: post(served, {"state": "word " * 3000, "questions": {"q": QUESTIONS["refund"]}}),
    }
    unknown_model = post(served, {"model": "gpt-4", "state": TEXT,
                                  "questions": {"q": QUESTIONS["refund"]}})
    assert unknown_model.status_code == 404
    refusals[404.1] = unknown_model
    types = {}
    for status, r in refusals.items():
        assert r.status_code == int(status), (status, r.text)
        schema = {"$ref": "#/components/schemas/Refusal", "components": doc["components"]}
        jsonschema.validate(r.json(), schema)
        types[status] = r.json()["detail"]["error_type"]
    assert types == {401: "authentication_error", 404: "not_found", 405: "api_usage_error",
                     415: "api_usage_error", 400: "max_tokens_exceeded", 404.1: "not_found"}
    post_op = doc["paths"]["/v1/systemone"]["post"]["responses"]
    assert {"400", "401", "404", "405", "408", "413", "415", "422", "429", "500", "503",
            "504"} <= set(post_op)


def test_a_trailing_slash_is_served_not_redirected(served, decider):
    one = {"refund": QUESTIONS["refund"]}
    r = post(served, {"state": TEXT, "questions": one}, path="/v1/systemone/")
    assert r.status_code == 200
    assert r.json()["answers"]["refund"]["noul"] == pytest.approx(
        in_process(decider, one)["refund"], abs=1e-9)


def test_decider_0_1s_names_come_beside_the_x_names_only_when_asked(decider):
    """[http] legacy_names: label_mass and decider (deprecated) beside x_label_mass and
    x_decider; decider.multi_label is still read, and answered under its own name."""
    from decider.systemone.mapping import legacy_names

    body = {"model": MODEL, "state": TEXT, "questions": {
        "refund": QUESTIONS["refund"],
        "tags": {"type": "decider.multi_label", "criteria": {"refund": None, "angry": None}}}}
    doc = decider.decide_systemone(body)
    assert "decider" not in doc and "label_mass" not in doc["answers"]["refund"]
    assert doc["answers"]["tags"]["type"] == "decider.multi_label"
    old = legacy_names(doc)
    assert old["decider"] == old["x_decider"]
    assert all(a["label_mass"] == a["x_label_mass"] for a in old["answers"].values())


def test_openais_client_gets_its_decisions_answered_as_system_one_would(served, decider):
    """OpenAI's Decisions API through openai-python: predicate, choice and score ask what
    System One's noul, choice and score ask, in question order, under their names."""
    from openai import OpenAI

    client = OpenAI(api_key=KEY, base_url=served.url + "/v1", max_retries=0, timeout=300)
    q = QUESTIONS
    d = client.decisions.create(model="gpt-6-luna", input=TEXT, questions=[
        {"type": "predicate", "name": "refund", "instructions": q["refund"]["instructions"]},
        {"type": "choice", "name": "team", "instructions": q["team"]["instructions"],
         "choices": [{"value": "billing"}, {"value": "tech", "description": "bugs and errors"}]},
        {"type": "score", "name": "urgency", "instructions": q["urgency"]["instructions"],
         "levels": [{"label": lv} for lv in q["urgency"]["criteria"]]}])
    here = in_process(decider, QUESTIONS)
    refund, team, urgency = d.answers
    assert (refund.type, refund.name) == ("predicate", "refund")
    assert refund.probability == pytest.approx(here["refund"], abs=1e-9)
    assert team.choice == here["team"] and [p.value for p in team.probabilities] == [
        "billing", "tech"]
    assert urgency.score == pytest.approx(here["urgency"], abs=1e-9)
    assert [(p.value, p.label) for p in urgency.probabilities] == list(
        enumerate(q["urgency"]["criteria"]))
    assert d.model == MODEL and d.usage.input_tokens == d.usage.total_tokens > 0


def test_decisions_keep_boolean_values_typed_and_refuse_in_openais_envelope(served):
    from openai import BadRequestError, OpenAI

    client = OpenAI(api_key=KEY, base_url=served.url + "/v1", max_retries=0, timeout=300)
    d = client.decisions.create(model="gpt-6-luna", input=[
        {"role": "user", "content": [{"type": "input_text", "text": TEXT},
                                     {"type": "input_json", "data": {"order": "A-104"}}]}],
        questions=[{"type": "choice", "instructions": "Is a refund asked for?",
                    "choices": [{"value": True}, {"value": False}]}])
    [answer] = d.answers
    assert isinstance(answer.choice, bool) and answer.name is None
    assert {p.value for p in answer.probabilities} == {True, False}
    with pytest.raises(BadRequestError) as image:
        client.decisions.create(model="gpt-6-luna", input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "https://example.com/a.png"}]}],
            questions=[{"type": "predicate", "instructions": "A cat?"}])
    assert "images are not supported" in image.value.message
    assert image.value.param == "input[0].content[0]"
    with pytest.raises(BadRequestError) as duplicate:
        client.decisions.create(model="gpt-6-luna", input=TEXT, questions=[
            {"type": "choice", "instructions": "Which?",
             "choices": [{"value": "Yes"}, {"value": "yes"}]}])
    assert duplicate.value.param == "questions[0].choices[1]"
    assert duplicate.value.code == "INVALID_REQUEST"


def test_the_openapi_document_validates_and_requires_each_answers_type(served):
    """Validated against the OpenAPI 3.1 schema by openapi-spec-validator; every route
    answers its refusals in a documented shape; the answers' type is required (clients
    pick the answer class by it)."""
    from openapi_spec_validator import validate

    doc = httpx2.get(served.url + "/openapi.json").json()
    validate(doc)
    schemas = doc["components"]["schemas"]
    for name in ("NoulAnswer", "ChoiceAnswer", "ScoreAnswer", "MultiLabelAnswer",
                 "DecisionPredicateAnswer", "DecisionChoiceAnswer", "DecisionScoreAnswer"):
        assert "type" in schemas[name]["required"], name
    assert doc["servers"] and "text/plain" in doc["paths"]["/metrics"]["get"]["responses"][
        "200"]["content"]
    for path in ("/v1/systemone", "/v1/decisions"):
        responses = doc["paths"][path]["post"]["responses"]
        assert all(r.get("content") for status, r in responses.items() if status >= "400")


def test_the_openapi_document_lints_clean_under_redoclys_recommended_rules(served, tmp_path):
    import subprocess
    from pathlib import Path

    redocly = Path(__file__).parents[1] / ".venv" / "redocly" / "node_modules" / ".bin" / \
        "redocly"
    if not redocly.exists():
        pytest.skip("@redocly/cli is not installed (scripts/setup.sh --test installs it with "
                    "npm where npm is present)")
    doc = tmp_path / "openapi.json"
    doc.write_text(httpx2.get(served.url + "/openapi.json").text)
    out = subprocess.run([str(redocly), "lint", str(doc), "--extends", "recommended",
                          "--format", "json"], capture_output=True, text=True, timeout=120)
    report = json.loads(out.stdout)
    assert report["totals"] == {"errors": 0, "warnings": 0, "ignored": 0}, report["problems"]


def test_a_255_option_choice_is_answered_as_in_process(served, decider):
    """The published limit of options, single- and multi-token names mixed, over HTTP: the
    in-process answer (docs/benchmarks.md has its time against one read of its prompt)."""
    names = [f"option {i}" if i % 3 else f"refund{i}" for i in range(255)]
    question = {"type": "choice", "instructions": "Which option fits the ticket?",
                "criteria": dict.fromkeys(names)}
    r = post(served, {"state": TEXT, "questions": {"q": question}})
    assert r.status_code == 200, r.text
    there = r.json()["answers"]["q"]
    here = decider.decide_systemone({"model": MODEL, "state": TEXT,
                                     "questions": {"q": question}})["answers"]["q"]
    assert there["choice"] == here["choice"]
    assert list(there["probabilities"]) == names
    assert there["probabilities"] == pytest.approx(here["probabilities"], abs=1e-9)
