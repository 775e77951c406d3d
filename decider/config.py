"""The daemon's configuration file (TOML). Every key is known and checked: an unknown key
or a bad value is refused with the file, the key and the reason, before READY=1.

    [server]   listen, socket_group, max_queue, max_batch, frontends, grace_seconds,
               request_timeout_seconds, engine_call_limit_seconds, metrics_port,
               log_format, log_level, log_text
    [tls]      cert, key, client_ca, allow_insecure_tcp
    [model]    name, engine, n_ctx, threads, gpu_layers, gpu, dtype, calibration
    [limits]   what one request may ask (decider.questions.Limits): max_text_bytes,
               max_questions, max_labels, max_question_chars, max_label_chars,
               max_description_chars, max_instructions_chars, max_work_tokens
    [cache]    enabled, max_bytes (the engine's prefix cache)
    [paths]    cache_dir, catalog
    [http]     address, api_keys, key_file, tls_cert, tls_key, tls_client_ca, model_aliases,
               vendor_names, legacy_names, max_body_bytes, request_timeout_seconds,
               max_connections (decider/http)

Flags of `decider serve` (and the load flags of `run`) override the file, through the
same checks, before anything loads; a flag never means "the default": leave it out.
With neither, the defaults below apply.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from .engines import DTYPES, ENGINES
from .errors import ConfigError
from .questions import Limits

DEFAULT_LISTEN = "127.0.0.1:50051"


@dataclass(frozen=True, slots=True)
class ServerSection:
    listen: tuple[str, ...] = (DEFAULT_LISTEN,)
    socket_group: str = ""  # group owning unix sockets (client apps join it); "" keeps ours
    max_queue: int = 256
    max_batch: int = 16
    frontends: int = 1  # front-end processes; past 1 they share TCP listeners (SO_REUSEPORT)
    grace_seconds: float = 20.0  # in-flight requests finish within this on SIGTERM
    request_timeout_seconds: float = 120.0  # the deadline of a gRPC call sent without one
    # an engine silent this long (no chunk of a call done, no answer to a ping between
    # calls) is hung: killed and replaced
    engine_call_limit_seconds: float = 120.0
    metrics_port: int | None = None
    log_format: str = "json"
    log_level: str = "info"
    log_text: bool = False  # log request text (off: never)


@dataclass(frozen=True, slots=True)
class TlsSection:
    cert: str = ""
    key: str = ""
    client_ca: str = ""  # require client certificates signed by this CA
    allow_insecure_tcp: bool = False  # plaintext on non-loopback addresses


@dataclass(frozen=True, slots=True)
class ModelSection:
    name: str = ""  # catalog name or .gguf path; "" is the catalog's default
    engine: str = ""  # "" is the catalog's engine for the model
    n_ctx: int = 0  # 0 is the catalog's window
    threads: int = 0  # CPU threads; 0 is all cores
    gpu_layers: int = 0  # layers offloaded to the GPU by llama.cpp (-1: all)
    gpu: str = ""  # CUDA device(s) to use, as CUDA_VISIBLE_DEVICES takes them
    dtype: str = ""  # activations of the triton and reference engines; "": the engine's
    calibration: str = ""  # a `decider calibrate` file applied to every answer; "": none


@dataclass(frozen=True, slots=True)
class CacheSection:
    """The engine's prefix cache (docs/design.md, "The prefix cache")."""

    enabled: bool = True
    max_bytes: int = 0  # 0: the engine's default share of memory

    def budget(self) -> int | None:
        """Decider's prefix_cache_bytes: 0 off, None the engine's default."""
        return (self.max_bytes or None) if self.enabled else 0


@dataclass(frozen=True, slots=True)
class PathsSection:
    cache_dir: str = ""  # model cache; "" is $DECIDER_CACHE_DIR or ~/.cache/decider
    catalog: str = ""  # user catalog; "" is $DECIDER_CATALOG or ~/.config/decider/models.toml


@dataclass(frozen=True, slots=True)
class HttpSection:
    """The System One HTTP API (docs/systemone.md); checked by decider.http.serve."""

    address: str = ""  # host:port or unix:///path; "" serves no HTTP
    api_keys: tuple[str, ...] = ()  # bearer keys, or "sha256:<hex>" of a key
    key_file: str = ""  # a file of keys or "sha256:<hex>" lines
    tls_cert: str = ""  # "" uses [tls] cert
    tls_key: str = ""  # "" uses [tls] key
    tls_client_ca: str = ""  # "" uses [tls] client_ca
    model_aliases: tuple[str, ...] = ()  # more names the served model answers to
    vendor_names: bool = True  # it answers to jev-latest, jev-*, gpt-6-luna* too
    legacy_names: bool = False  # deprecated: label_mass, decider beside the x_ names
    max_body_bytes: int = 16 * 2**20
    request_timeout_seconds: float = 30.0  # past it a request is answered 504
    max_connections: int = 512  # past it new connections get 503
    requests_per_minute: int = 0  # per API key (per host without keys); 0: no limit
    requests_per_day: int = 0


@dataclass(frozen=True, slots=True)
class Config:
    server: ServerSection = ServerSection()
    tls: TlsSection = TlsSection()
    model: ModelSection = ModelSection()
    limits: Limits = Limits()
    cache: CacheSection = CacheSection()
    paths: PathsSection = PathsSection()
    http: HttpSection = HttpSection()
    source: str = field(default="(defaults)", compare=False)


_SECTIONS = {"server": ServerSection, "tls": TlsSection, "model": ModelSection,
             "limits": Limits, "cache": CacheSection, "paths": PathsSection,
             "http": HttpSection}
_CHOICES = {"log_format": ("json", "console", "auto"),
            "log_level": ("debug", "info", "warning", "error"),
            "dtype": ("", *DTYPES), "engine": ("", *ENGINES)}
_POSITIVE = {"max_queue", "max_batch", "frontends", "grace_seconds",
             "engine_call_limit_seconds", "request_timeout_seconds",
             *(f.name for f in fields(Limits))}
# Flags (argparse dest) -> the key each overrides; the flag is --dest-with-dashes.
FLAGS = {"listen": "server.listen", "max_queue": "server.max_queue",
         "max_batch": "server.max_batch", "frontends": "server.frontends",
         "metrics_port": "server.metrics_port",
         "log_format": "server.log_format", "tls_cert": "tls.cert", "tls_key": "tls.key",
         "tls_client_ca": "tls.client_ca", "allow_insecure_tcp": "tls.allow_insecure_tcp",
         "model": "model.name", "engine": "model.engine", "n_ctx": "model.n_ctx",
         "threads": "model.threads", "dtype": "model.dtype",
         "calibration": "model.calibration", "prefix_cache": "cache.enabled",
         "max_work_tokens": "limits.max_work_tokens", "http": "http.address"}


def _fail(where: str, what: str, value, key: str) -> None:
    raise ConfigError(f"{where}: {what}, got {value!r}", key=key)


def _check(where: str, key: str, value, default, flag: bool = False):
    """`value` for `key` as the file or a flag gives it (where: "file: section.key" or
    "--flag"); a flag's value is never the key's "not set" value (0, "")."""
    if key == "metrics_port":
        if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 65536):
            _fail(where, "must be a port number in [0, 65535]", value, key)
        return value
    if key == "listen":
        if not (isinstance(value, (list, tuple)) and value
                and all(isinstance(v, str) for v in value)):
            _fail(where, "must be a non-empty list of addresses", value, key)
        for address in value:
            _check_address(where, address)
        return tuple(value)
    if isinstance(default, tuple):  # lists of strings that may be empty
        if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise ConfigError(f"{where}: must be a list of strings", key=key)
        return tuple(value)
    kind = type(default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        _fail(where, f"must be {kind.__name__}", value, key)
    if flag and value == "":
        _fail(where, "must not be empty (leave the flag out for the default)", value, key)
    if key in _CHOICES and value not in _CHOICES[key]:
        _fail(where, f"must be one of {', '.join(c for c in _CHOICES[key] if c)}", value, key)
    if kind in (int, float) and value < 0 and key != "gpu_layers":
        _fail(where, "must not be negative", value, key)
    if key in _POSITIVE and value <= 0:
        _fail(where, "must be positive", value, key)
    if key == "n_ctx" and (0 < value < 32 or flag and value == 0):
        _fail(where, "must be at least 32 (0 in the file: the catalog's window)", value, key)
    if key == "threads" and flag and value == 0:
        _fail(where, "must be at least 1 (0 in the file: all cores)", value, key)
    if key == "frontends" and value > (os.cpu_count() or 1):
        _fail(where, f"must be at most {os.cpu_count()} (this machine's cores)", value, key)
    if key == "threads" and value > (os.cpu_count() or 1):
        _fail(where, f"must be at most {os.cpu_count()} (this machine's cores)", value, key)
    return value


def _check_address(where: str, address: str) -> None:
    """unix:///path, or host:port with a port in [1, 65535]."""
    if address.startswith("unix:"):
        if not socket_path(address).name:
            _fail(where, "a unix socket address needs a file name", address, "listen")
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        _fail(where, "each address must be unix:///path or host:port, the port in "
                     "[1, 65535]", address, "listen")


def socket_path(address: str) -> Path:
    return Path(address.removeprefix("unix://").removeprefix("unix:"))


def check_socket_dirs(cfg: Config) -> None:
    """At start, before the model loads: each unix socket's directory exists (under
    systemd, RuntimeDirectory= makes it)."""
    for address in cfg.server.listen:
        folder = socket_path(address).parent
        if address.startswith("unix:") and not folder.is_dir():
            raise ConfigError(f"listen address {address!r}: the directory {str(folder)!r} "
                              "does not exist", key="listen", listen=address)


def parse_config(text: str, origin: str) -> Config:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{origin}: not valid TOML: {e}", file=origin) from e
    sections = {}
    for name, raw in data.items():
        cls = _SECTIONS.get(name)
        if cls is None:
            raise ConfigError(f"{origin}: unknown section [{name}]; known: "
                              f"{', '.join(_SECTIONS)}", file=origin, key=name)
        if not isinstance(raw, dict):
            raise ConfigError(f"{origin}: {name} must be a [table]", file=origin, key=name)
        defaults = {f.name: f.default for f in fields(cls)}
        values = {}
        for key, value in raw.items():
            if key not in defaults:
                raise ConfigError(f"{origin}: unknown key {name}.{key}", file=origin,
                                  key=f"{name}.{key}")
            values[key] = _check(f"{origin}: {name}.{key}", key, value, defaults[key])
        sections[name] = cls(**values)
    return Config(**sections, source=origin)


def load_config(path: str | Path | None) -> Config:
    if path is None:
        return Config()
    try:
        text = Path(path).read_text("utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the config file: {e.strerror}",
                          file=str(path)) from e
    return parse_config(text, str(path))


def with_flags(cfg: Config, flags: dict[str, object]) -> Config:
    """The flags given (argparse dest -> value; None: not given) over the file's values,
    each checked as the file's are and named as the user typed it."""
    sections: dict[str, dict] = {}
    for dest, value in flags.items():
        if value is None:
            continue
        section, key = FLAGS[dest].split(".")
        default = getattr(getattr(Config(), section), key)
        flag = "--" + dest.replace("_", "-")
        sections.setdefault(section, {})[key] = _check(flag, key, value, default, flag=True)
    return replace(cfg, **{name: replace(getattr(cfg, name), **values)
                           for name, values in sections.items()})
