"""Reading a request body: bounded in size (after decompression too) and in time.

Bodies may come compressed as Content-Encoding zstd (what TypeSafe's Python SDK sends
when zstd is available) or gzip; the limit applies to the decompressed bytes, so a small
compressed body cannot unpack into a large one.
"""

from __future__ import annotations

import asyncio
import sys
import zlib
from collections.abc import Callable

from starlette.requests import Request

from .errors import Refused

if sys.version_info >= (3, 14):
    from compression.zstd import ZstdDecompressor, ZstdError
else:
    from backports.zstd import ZstdDecompressor, ZstdError

Decoder = Callable[[bytes, int], bytes]  # (compressed chunk, at most this many) -> bytes


class _Zstd:
    def __init__(self) -> None:
        self._d = ZstdDecompressor()

    def __call__(self, data: bytes, most: int) -> bytes:
        return self._d.decompress(data, max_length=most)

    def complete(self) -> bool:
        return self._d.eof


class _Gzip:
    def __init__(self) -> None:
        self._d = zlib.decompressobj(wbits=31)

    def __call__(self, data: bytes, most: int) -> bytes:
        return self._d.decompress(data, most)

    def complete(self) -> bool:  # and nothing after the gzip member
        return self._d.eof and not self._d.unused_data


DECODERS = {"zstd": _Zstd, "gzip": _Gzip}


def _too_large(limit: int) -> Refused:
    return Refused(413, "BODY_TOO_LARGE", f"the request body is over the limit of {limit} "
                   "bytes", limit=limit)


async def read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The whole body, decoded; Refused when it is too large, too slow or undecodable."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise _too_large(limit)
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("identity", *DECODERS):
        raise Refused(415, "UNSUPPORTED_ENCODING", f"Content-Encoding {encoding!r} is not "
                      f"supported; send identity, {' or '.join(DECODERS)}")
    decode = DECODERS[encoding]() if encoding in DECODERS else None
    chunks, size, more = [], 0, True
    try:
        async with asyncio.timeout(timeout):
            while more:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    raise Refused(499, "CLIENT_GONE", "the client closed the connection")
                chunk, more = message.get("body", b""), message.get("more_body", False)
                out = decode(chunk, limit - size + 1) if decode and chunk else chunk
                size += len(out)
                if size > limit:
                    raise _too_large(limit)
                chunks.append(out)
    except TimeoutError:
        raise Refused(408, "BODY_TIMEOUT", f"the request body did not arrive within "
                      f"{timeout:g} s") from None
    except (ZstdError, zlib.error, EOFError) as e:  # EOFError: data after the frame
        raise Refused(400, "BAD_ENCODING", f"the {encoding} body cannot be decoded: {e}"
                      ) from None
    if decode and not decode.complete():
        raise Refused(400, "BAD_ENCODING", f"the {encoding} body ends before its data does")
    return b"".join(chunks)
