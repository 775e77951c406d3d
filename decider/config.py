"""The daemon's configuration file (TOML). Every key is known and checked: an unknown key
or a bad value is refused with the file, the key and the reason, before READY=1.

    [server]   listen, socket_group, max_queue, max_batch, grace_seconds,
               engine_call_limit_seconds, metrics_port, log_format, log_level, log_text
    [tls]      cert, key, client_ca, allow_insecure_tcp
    [model]    name, engine, n_ctx, threads, gpu_layers, gpu, dtype
    [paths]    cache_dir, catalog
    [http]     address, api_keys, key_file, tls_cert, tls_key, tls_client_ca, model_aliases,
               max_body_bytes, request_timeout_seconds, max_connections (decider/http)

Flags of `decider serve` override the file; with neither, the defaults below apply.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from .engines import DTYPES
from .errors import ConfigError

DEFAULT_LISTEN = "127.0.0.1:50051"


@dataclass(frozen=True, slots=True)
class ServerSection:
    listen: tuple[str, ...] = (DEFAULT_LISTEN,)
    socket_group: str = ""  # group owning unix sockets (client apps join it); "" keeps ours
    max_queue: int = 256
    max_batch: int = 16
    grace_seconds: float = 20.0  # in-flight requests finish within this on SIGTERM
    engine_call_limit_seconds: float = 120.0  # past it, WATCHDOG=1 is withheld
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
    max_body_bytes: int = 16 * 2**20
    request_timeout_seconds: float = 30.0  # past it a request is answered 504
    max_connections: int = 512  # past it new connections get 503


@dataclass(frozen=True, slots=True)
class Config:
    server: ServerSection = ServerSection()
    tls: TlsSection = TlsSection()
    model: ModelSection = ModelSection()
    paths: PathsSection = PathsSection()
    http: HttpSection = HttpSection()
    source: str = field(default="(defaults)", compare=False)


_SECTIONS = {"server": ServerSection, "tls": TlsSection, "model": ModelSection,
             "paths": PathsSection, "http": HttpSection}
_CHOICES = {"log_format": ("json", "console", "auto"),
            "log_level": ("debug", "info", "warning", "error"),
            "dtype": ("", *DTYPES)}


def _check(origin: str, section: str, key: str, value, default):
    where = f"{origin}: {section}.{key}"
    if key == "metrics_port":
        if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 65536):
            raise ConfigError(f"{where}: must be a port number, got {value!r}", key=key)
        return value
    if key == "listen":
        if not (isinstance(value, list) and value and all(isinstance(v, str) for v in value)):
            raise ConfigError(f"{where}: must be a non-empty list of addresses", key=key)
        return tuple(value)
    if isinstance(default, tuple):  # lists of strings that may be empty
        if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise ConfigError(f"{where}: must be a list of strings", key=key)
        return tuple(value)
    kind = type(default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"{where}: must be {kind.__name__}, got {value!r}", key=key)
    if key in _CHOICES and value not in _CHOICES[key]:
        raise ConfigError(f"{where}: must be one of {_CHOICES[key]}, got {value!r}", key=key)
    if kind in (int, float) and value < 0 and key != "gpu_layers":
        raise ConfigError(f"{where}: must not be negative, got {value!r}", key=key)
    if key in ("max_queue", "max_batch", "grace_seconds", "engine_call_limit_seconds") \
            and value <= 0:
        raise ConfigError(f"{where}: must be positive, got {value!r}", key=key)
    if key == "n_ctx" and 0 < value < 32:
        raise ConfigError(f"{where}: must be 0 (the catalog's) or at least 32", key=key)
    return value


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
            values[key] = _check(origin, name, key, value, defaults[key])
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


def with_overrides(cfg: Config, server: dict, tls: dict, model: dict) -> Config:
    """Flags given on the command line win over the file (None means not given)."""
    def pick(d: dict) -> dict:
        return {k: v for k, v in d.items() if v is not None}

    return replace(cfg, server=replace(cfg.server, **pick(server)),
                   tls=replace(cfg.tls, **pick(tls)), model=replace(cfg.model, **pick(model)))
