"""HTTP body compression as Triton's HTTP endpoint does it: ``Content-Encoding: gzip`` or
``deflate`` request bodies are inflated, and an infer answer is compressed when the client's
``Accept-Encoding`` asks for one of them (tritonclient's ``request_compression_algorithm`` and
``response_compression_algorithm``).

Why bounded here: a small compressed body can inflate to gigabytes (a decompression bomb), so a
body is inflated in steps of at most ``limit + 1`` bytes and refused (413) the moment it passes
``server.max_payload_bytes``, never inflated past it. ``deflate`` is the zlib format (RFC 9110),
what tritonclient sends; a raw deflate stream is accepted too, as browsers and aiohttp do.
"""

from __future__ import annotations

import zlib

ENCODINGS = ("gzip", "deflate")
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


class BodyTooLarge(ValueError):
    """The inflated body passed the payload limit."""


class BadEncoding(ValueError):
    """The body is not valid for its Content-Encoding, or the encoding is not supported."""


def inflate(body: bytes, encoding: str, limit_bytes: int) -> bytes:
    """``body`` decoded per its ``Content-Encoding``, at most ``limit_bytes`` long."""
    enc = encoding.strip().lower()
    if enc in ("", "identity"):
        return body
    wbits = _WBITS.get(enc)
    if wbits is None:
        raise BadEncoding(f"Content-Encoding {encoding!r} is not supported "
                          "(supported: gzip, deflate, identity)")
    if enc == "deflate" and body[:1] and (body[0] & 0x0F) != 8:
        wbits = -zlib.MAX_WBITS  # a raw deflate stream, without the zlib header
    d = zlib.decompressobj(wbits)
    try:
        out = d.decompress(body, limit_bytes + 1)
    except zlib.error as exc:
        raise BadEncoding(f"body: not valid {enc} data ({exc})") from None
    if len(out) > limit_bytes or d.unconsumed_tail:
        raise BodyTooLarge(f"body: inflates past the limit of {limit_bytes} bytes (server.max_payload_bytes)")
    if not d.eof:
        raise BadEncoding(f"body: truncated {enc} data")
    return out


def response_encoding(accept: str | None) -> str | None:
    """The encoding an ``Accept-Encoding`` value asks for (gzip before deflate), or None."""
    if not accept:
        return None
    wanted = {}
    for part in accept.split(","):
        name, _, params = part.partition(";")
        q = 1.0
        for p in params.split(";"):
            k, _, v = p.strip().partition("=")
            if k == "q":
                try:
                    q = float(v)
                except ValueError:
                    q = 0.0
        wanted[name.strip().lower()] = q
    for enc in ENCODINGS:
        if wanted.get(enc, 0.0) > 0:
            return enc
    return None


def compress(data: bytes, encoding: str) -> bytes:
    """``data`` in ``encoding`` (gzip or deflate: the zlib format), at a fast level: an answer
    is compressed on the event loop."""
    c = zlib.compressobj(1, zlib.DEFLATED, _WBITS[encoding])
    return c.compress(data) + c.flush()
