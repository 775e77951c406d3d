"""Where and how the HTTP API listens: the [http] section, the refusals before start, bearer
keys stored as digests, TLS with client certificates, and unix sockets."""

from __future__ import annotations

import hashlib
import ssl
import stat
from dataclasses import replace

import httpx2
import pytest
from typesafe_sdk import RetryPolicy, TypeSafeAPIConnectionError, TypeSafeClient

from decider.config import Config, HttpSection, TlsSection, parse_config
from decider.errors import ConfigError
from decider.http.auth import Keys
from decider.http.serve import check_http
from helpers.daemon_thread import KEY, MODEL, DaemonThread
from helpers.pki import write_pki

DIGEST = "sha256:" + hashlib.sha256(KEY.encode()).hexdigest()


def test_the_http_section_parses_and_refuses_bad_values():
    cfg = parse_config(f'[http]\naddress = "127.0.0.1:8080"\napi_keys = ["{DIGEST}"]\n'
                       'model_aliases = ["jev-latest"]\nrequest_timeout_seconds = 5\n', "f.toml")
    assert cfg.http.address == "127.0.0.1:8080" and cfg.http.api_keys == (DIGEST,)
    assert cfg.http.request_timeout_seconds == 5.0 and cfg.http.model_aliases == ("jev-latest",)
    assert Config().http.address == ""  # no HTTP unless asked for
    for text, words in (('[http]\napi_keys = "k"\n', "http.api_keys: must be a list of strings"),
                        ("[http]\nport = 1\n", "unknown key http.port"),
                        ("[http]\nmax_body_bytes = -1\n", "must not be negative")):
        with pytest.raises(ConfigError, match=words):
            parse_config(text, "f.toml")


def plan(tls: TlsSection = TlsSection(), **http):
    return check_http(replace(Config(source="f.toml"), http=HttpSection(**http), tls=tls))


@pytest.mark.parametrize("http, tls, words", [
    ({}, {}, "http.address: give host:port"),
    ({"address": "0.0.0.0:8080"}, {}, "not loopback: give API keys"),
    ({"address": "10.1.2.3:8080", "api_keys": (KEY,)}, {}, "not loopback: give a TLS"),
    ({"address": "example.org:443", "api_keys": (KEY,)}, {}, "not loopback: give a TLS"),
    ({"address": "127.0.0.1:http"}, {}, "expected host:port"),
    ({"address": "127.0.0.1:8080", "api_keys": ("short",)}, {}, "at least 16 printable"),
    ({"address": "127.0.0.1:8080", "api_keys": ("sha256:abc",)}, {}, "64 hex digits"),
    ({"address": "127.0.0.1:8080", "key_file": "/no/such/file"}, {}, "cannot read it"),
    ({"address": "127.0.0.1:8080", "tls_cert": "c.pem"}, {}, "certificate and key go together"),
    ({"address": "127.0.0.1:8080"}, {"client_ca": "ca.pem"}, "a client CA needs"),
    ({"address": "127.0.0.1:8080", "request_timeout_seconds": 0.0}, {}, "must be positive"),
    ({"address": "127.0.0.1:8080", "model_aliases": (" ",)}, {}, "must not be empty"),
])
def test_a_setup_that_must_not_start_is_refused_naming_the_key(http, tls, words):
    with pytest.raises(ConfigError, match=words):
        plan(TlsSection(**tls), **http)


def test_beyond_loopback_keys_and_tls_or_an_explicit_plaintext_allowance(tmp_path):
    assert plan(TlsSection(cert="c.pem", key="k.pem"), address="[::]:8443",
                api_keys=(KEY,)).host == "::"
    assert plan(TlsSection(allow_insecure_tcp=True), address="0.0.0.0:80",
                api_keys=(KEY,)).cert == ""  # a TLS proxy in front; keys still required
    assert plan(address="localhost:8080").keys.digests == ()  # loopback may go without
    assert plan(address="unix:///run/d.sock").path == "/run/d.sock"


def test_keys_are_kept_as_digests_from_the_config_and_a_key_file(tmp_path):
    key_file = tmp_path / "keys"
    key_file.write_text(f"# one a line\n{DIGEST}\n\nanother-key-0123456789\n")
    keys = Keys.load(["third-key-0123456789abc"], str(key_file), "f.toml")
    assert len(keys.digests) == 3 and all(len(d) == 32 for d in keys.digests)
    assert KEY.encode() not in b"".join(keys.digests)
    assert keys.accepts(KEY) and keys.accepts("another-key-0123456789")
    assert keys.accepts("third-key-0123456789abc") and not keys.accepts(KEY + "x")
    assert not Keys() and not Keys().accepts(KEY)


def test_tls_with_client_certificates(cache_dir, model_path, tmp_path):
    pki = write_pki(tmp_path)
    http = HttpSection(address="127.0.0.1:0", api_keys=(DIGEST,), tls_cert=str(pki["server_cert"]),
                       tls_key=str(pki["server_key"]), tls_client_ca=str(pki["ca"]))
    with DaemonThread(cache_dir, http) as s:
        assert s.url.startswith("https://127.0.0.1:")
        with_cert = ssl.create_default_context(cafile=str(pki["ca"]))
        with_cert.load_cert_chain(pki["client_cert"], pki["client_key"])
        with TypeSafeClient(api_key=KEY, base_url=s.url, retry=RetryPolicy(max_retries=0),
                            http_client=httpx2.Client(verify=with_cert)) as client:
            assert [m.name for m in client.models.list().models] == [MODEL]
        with TypeSafeClient(api_key=KEY, base_url=s.url, retry=RetryPolicy(max_retries=0),
                            http_client=httpx2.Client(verify=ssl.create_default_context(
                                cafile=str(pki["ca"])))) as anonymous:
            with pytest.raises(TypeSafeAPIConnectionError):
                anonymous.models.list()
        with pytest.raises(httpx2.HTTPError):
            httpx2.get(s.url.replace("https", "http") + "/healthz")


def test_a_unix_socket_for_the_group(cache_dir, model_path, tmp_path):
    path = tmp_path / "http.sock"
    with DaemonThread(cache_dir, HttpSection(address=f"unix://{path}")) as s:
        assert s.url == f"unix://{path}"
        assert stat.S_IMODE(path.stat().st_mode) == 0o660
        with httpx2.Client(transport=httpx2.HTTPTransport(uds=str(path))) as c:
            assert c.get("http://decider/healthz").json() == {"status": "ok"}
            assert c.get("http://decider/v1/models").json()["models"][0]["name"] == MODEL


def test_serve_refuses_a_bad_http_listener_before_loading_anything(run_cli, tmp_path):
    r = run_cli("serve", "--http", "0.0.0.0:8080", "--listen", f"unix://{tmp_path}/d.sock")
    assert r.returncode == 2 and b"not loopback: give API keys" in r.stderr
