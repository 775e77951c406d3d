"""The daemon's configuration file: defaults, overrides, and a clear refusal for every
bad key or value."""

import pytest

from decider.config import Config, load_config, parse_config, with_flags
from decider.errors import ConfigError


def test_no_file_means_the_documented_defaults():
    cfg = load_config(None)
    assert cfg.server.listen == ("127.0.0.1:50051",)
    assert (cfg.server.max_queue, cfg.server.max_batch, cfg.server.log_text) == (256, 16, False)
    assert cfg.model.name == "" and cfg.tls.cert == ""


def test_the_shipped_example_parses(tmp_path):
    from pathlib import Path

    cfg = load_config(Path(__file__).parents[1] / "deploy" / "decider.toml")
    assert cfg.server.listen == ("unix:///run/decider/decider.sock",)
    assert cfg.model.name == "gemma-3-270m" and cfg.paths.cache_dir == "/var/cache/decider"


def test_flags_override_the_file():
    cfg = parse_config('[server]\nmax_batch = 4\nlisten = ["unix:///tmp/a.sock"]\n', "f.toml")
    out = with_flags(cfg, {"max_batch": 8, "listen": None, "n_ctx": 1024, "model": None})
    assert out.server.max_batch == 8 and out.server.listen == ("unix:///tmp/a.sock",)
    assert out.model.n_ctx == 1024 and isinstance(out, Config)
    assert with_flags(parse_config('[model]\ndtype = "bfloat16"\n', "f.toml"),
                      {"dtype": "float32"}).model.dtype == "float32"
    assert with_flags(Config(), {"max_work_tokens": 999}).limits.max_work_tokens == 999


def test_the_prefix_cache_is_on_with_the_hosts_budget_unless_turned_off():
    assert Config().cache.budget() is None  # Decider's default: a share of the host
    assert parse_config("[cache]\nmax_bytes = 1000\n", "f.toml").cache.budget() == 1000
    assert parse_config("[cache]\nenabled = false\n", "f.toml").cache.budget() == 0
    assert with_flags(Config(), {"prefix_cache": False}).cache.budget() == 0


@pytest.mark.parametrize(
    "text, words",
    [
        ("[cache]\nmax_bytes = -1\n", "cache.max_bytes: must not be negative"),
        ("[cache]\nenabled = 1\n", "cache.enabled: must be bool"),
        ("[server]\nmax_queue = 0\n", "server.max_queue: must be positive"),
        ("[server]\nmax_batch = 'many'\n", "server.max_batch: must be int"),
        ("[server]\nlisten = []\n", "server.listen: must be a non-empty list"),
        ("[server]\nlog_format = 'xml'\n", "server.log_format: must be one of"),
        ("[server]\nmetrics_port = 70000\n", "server.metrics_port: must be a port"),
        ("[server]\ncolour = 1\n", "unknown key server.colour"),
        ("[modle]\nname = 'x'\n", "unknown section [modle]"),
        ("[model]\nn_ctx = 16\n", "model.n_ctx: must be at least 32"),
        ("[model]\nthreads = -2\n", "model.threads: must not be negative"),
        ("[model]\ndtype = 'fp8'\n", "model.dtype: must be one of"),
        ("[tls]\nallow_insecure_tcp = 'yes'\n", "tls.allow_insecure_tcp: must be bool"),
        ("server = 3\n", "server must be a [table]"),
        ("[server\n", "not valid TOML"),
    ],
)
def test_bad_values_name_the_file_the_key_and_the_reason(text, words):
    with pytest.raises(ConfigError, match="^bad.toml: ") as info:
        parse_config(text, "bad.toml")
    assert words in str(info.value)


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config(tmp_path / "nope.toml")
