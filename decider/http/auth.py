"""Bearer API keys: from the config file's [http] api_keys and the file key_file names,
each given as the key itself or as "sha256:<hex digest of the key>". Only digests are
kept in memory; a presented key is hashed and compared with every digest in constant time.

    printf %s "$KEY" | sha256sum     # the digest to write as "sha256:<digest>"
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from collections.abc import Iterable
from pathlib import Path

import structlog

from ..errors import ConfigError

log = structlog.get_logger("decider.http")
PREFIX = "sha256:"


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def _entry(text: str, where: str) -> bytes:
    if text.startswith(PREFIX):
        hexed = text.removeprefix(PREFIX).lower()
        if len(hexed) != 64 or any(c not in "0123456789abcdef" for c in hexed):
            raise ConfigError(f"{where}: a sha256: entry needs 64 hex digits")
        return bytes.fromhex(hexed)
    if not text.isascii() or not text.isprintable() or " " in text or len(text) < 16:
        raise ConfigError(f"{where}: a key must be at least 16 printable ASCII characters "
                          "without spaces (or sha256:<digest>)")
    return digest(text)


class Keys:
    """The digests of the accepted keys; empty: no key is asked for."""

    def __init__(self, digests: Iterable[bytes] = ()) -> None:
        self.digests = tuple(dict.fromkeys(digests))

    def __bool__(self) -> bool:
        return bool(self.digests)

    def accepts(self, key: str) -> bool:
        presented = digest(key)
        ok = False
        for d in self.digests:  # every digest is compared: the time says nothing
            ok |= hmac.compare_digest(presented, d)
        return ok

    @classmethod
    def load(cls, entries: Iterable[str], key_file: str, source: str) -> Keys:
        digests = [_entry(e, f"{source}: http.api_keys[{i}]") for i, e in enumerate(entries)]
        if key_file:
            path = Path(key_file)
            try:
                lines = path.read_text("utf-8").splitlines()
            except (OSError, UnicodeDecodeError) as e:
                raise ConfigError(f"{source}: http.key_file {key_file}: cannot read it: "
                                  f"{getattr(e, 'strerror', None) or e}") from e
            if os.stat(path).st_mode & stat.S_IROTH:
                log.warning("the key file is readable by every user", key_file=key_file)
            for n, line in enumerate(lines, 1):
                if line.strip() and not line.lstrip().startswith("#"):
                    digests.append(_entry(line.strip(), f"{key_file}:{n}"))
        return cls(digests)
