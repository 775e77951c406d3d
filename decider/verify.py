"""Model files checked on every load, cheaply unless they changed.

Size always (against the catalog's size, or the size last verified). sha256 when the
catalog records one and the file was never verified, or whenever the file's size or
mtime differ from its last verification: a truncated copy, or bytes written over in
place, is caught before llama.cpp reads it. A file that passes is recorded (size,
mtime, sha256) under the cache's verified/ folder, so the next load costs one stat().
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .errors import ModelCorrupt


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


class Verifier:
    def __init__(self, records: Path) -> None:
        self.records = records  # one JSON file per verified model file

    def check(self, path: Path, *, name: str, size: int, sha256: str, repair: str,
              ours: bool) -> str:
        """The file's sha256, once it matches what is expected of it; ModelCorrupt with
        the repair (a command, or what to do) otherwise. ours: the cache made the file,
        so any change since its last verification is damage; a file of the user's may be
        replaced on purpose, and is then verified afresh."""
        st = path.stat()
        record = self._read(path)
        want_size = size or (record["size"] if ours and record else 0)
        if want_size and st.st_size != want_size:
            raise ModelCorrupt(name, path, f"{st.st_size} bytes, expected {want_size}", repair)
        unchanged = record and (record["size"], record["mtime_ns"]) == (st.st_size,
                                                                        st.st_mtime_ns)
        if unchanged and sha256 in ("", record["sha256"]):
            return record["sha256"]
        want = sha256 or (record["sha256"] if ours and record else "")
        actual = file_sha256(path)
        if want and actual != want:
            raise ModelCorrupt(name, path, f"sha256 {actual}, expected {want}", repair)
        self.remember(path, actual)
        return actual

    def remember(self, path: Path, sha256: str) -> None:
        """Record `path` as verified now (after an assembly or a download hashed it)."""
        st = path.stat()
        record = {"path": str(path.resolve()), "size": st.st_size,
                  "mtime_ns": st.st_mtime_ns, "sha256": sha256}
        try:
            self.records.mkdir(parents=True, exist_ok=True)
            tmp = self._where(path).with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(record))
            os.replace(tmp, self._where(path))
        except OSError:
            pass  # a read-only cache: verified all the same, again next time

    def forget(self, path: Path) -> None:
        self._where(path).unlink(missing_ok=True)

    def _where(self, path: Path) -> Path:
        key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:32]
        return self.records / f"{key}.json"

    def _read(self, path: Path) -> dict | None:
        try:
            record = json.loads(self._where(path).read_text())
            ok = {"size", "mtime_ns", "sha256"} <= set(record)
        except (OSError, ValueError, TypeError):
            return None
        return record if ok else None
