"""Per-key rate limits on the HTTP API (decider/http/rate_limits.py): a key past its
requests a minute is refused 429 with Retry-After and the IETF draft's RateLimit fields,
in each API's own error shape, before its body is read; other keys go on; every answer
to a limited key says what is left. The day's window, and the config's refusals, without
a server."""

from __future__ import annotations

import httpx2
import pytest

from decider.config import Config, HttpSection, ServerSection
from decider.errors import ConfigError
from decider.http.errors import Refused
from decider.http.rate_limits import RateLimits
from decider.http.serve import check_http
from helpers.daemon_thread import KEY, MODEL, DaemonThread

OTHER = "a-second-key-of-this-test"
PER_MINUTE = 3


@pytest.fixture(scope="module")
def served(cache_dir, model_path):
    http = HttpSection(address="127.0.0.1:0", api_keys=(KEY, OTHER),
                       requests_per_minute=PER_MINUTE, requests_per_day=1000)
    with DaemonThread(cache_dir, http) as s:
        yield s


def ask(served, key: str, path: str = "/v1/systemone", content: bytes | None = None):
    body = {"model": MODEL, "state": "The parcel is late.",
            "questions": {"q": {"type": "noul", "instructions": "Is it late?"}}}
    return httpx2.post(f"{served.url}{path}", json=None if content else body, content=content,
                       headers={"Authorization": f"Bearer {key}"}, timeout=300)


def test_a_key_past_its_minute_is_refused_429_and_others_go_on(served):
    policy = f'"minute";q={PER_MINUTE};w=60, "day";q=1000;w=86400'
    for left in range(PER_MINUTE - 1, -1, -1):
        r = ask(served, KEY)
        assert r.status_code == 200, r.text
        assert r.headers["ratelimit-policy"] == policy
        assert r.headers["ratelimit"].startswith(f'"minute";r={left};t=')
    refused = ask(served, KEY, content=b"not even JSON: the body is never read")
    assert refused.status_code == 429
    assert 0 < int(refused.headers["retry-after"]) <= 60
    assert refused.headers["ratelimit"].startswith('"minute";r=0;')
    detail = refused.json()["detail"]
    assert (detail["error_type"], detail["reason"], detail["limit"]) == \
        ("rate_limit_error", "RATE_LIMITED", PER_MINUTE)
    openai = ask(served, KEY, path="/v1/decisions").json()["error"]  # the same key's count
    assert (openai["type"], openai["code"]) == ("rate_limit_error", "RATE_LIMITED")
    other = ask(served, OTHER)
    assert other.status_code == 200
    assert other.headers["ratelimit"].startswith(f'"minute";r={PER_MINUTE - 1};')


def test_the_day_window_counts_apart_from_the_minute():
    limits = RateLimits(per_minute=10, per_day=2)
    assert limits.take("k")[1][1].startswith(b'"day";r=1;')  # the tighter window
    limits.take("k")
    with pytest.raises(Refused) as refused:
        limits.take("k")
    assert refused.value.status == 429 and refused.value.metadata["window"] == "day"
    assert 86000 < int(refused.value.headers["Retry-After"]) <= 86400
    assert limits.take("another")  # counted per caller
    assert not RateLimits()  # none configured: nothing is counted


@pytest.mark.parametrize(("http", "server", "words"), [
    (HttpSection(requests_per_minute=-1), ServerSection(), "requests_per_minute: must be 0"),
    (HttpSection(requests_per_day=5), ServerSection(frontends=2), "counted in one process"),
])
def test_bad_rate_limits_are_refused_naming_the_key(http, server, words):
    cfg = Config(server=server, http=HttpSection(**{
        **{f: getattr(http, f) for f in ("requests_per_minute", "requests_per_day")},
        "address": "127.0.0.1:8080"}), source="test.toml")
    with pytest.raises(ConfigError, match=words):
        check_http(cfg)
