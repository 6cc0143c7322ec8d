"""Request bodies inflate within the payload limit; Accept-Encoding picks the answer's encoding."""

from __future__ import annotations

import gzip
import zlib

import pytest

from jigsaw.runtime.compression import BadEncoding, BodyTooLarge, compress, inflate, response_encoding


def test_inflate_round_trips_and_stops_at_the_limit() -> None:
    body = b'{"inputs": []}' * 100
    assert inflate(gzip.compress(body), "gzip", 1 << 20) == body
    assert inflate(zlib.compress(body), "Deflate", 1 << 20) == body
    assert inflate(zlib.compress(body)[2:-4], "deflate", 1 << 20) == body  # raw deflate
    assert inflate(body, "identity", 10) == body  # not compressed: the caller's limit applies
    bomb = gzip.compress(b"\0" * (64 << 20), 9)  # 64 MiB in about 64 KB
    with pytest.raises(BodyTooLarge, match="4096"):
        inflate(bomb, "gzip", 4096)
    with pytest.raises(BadEncoding, match="truncated"):
        inflate(gzip.compress(body)[:20], "gzip", 1 << 20)
    with pytest.raises(BadEncoding, match="not supported"):
        inflate(body, "br", 1 << 20)


def test_response_encoding_follows_accept_encoding() -> None:
    assert response_encoding("gzip, deflate") == "gzip"
    assert response_encoding("deflate;q=0.5, br") == "deflate"
    assert response_encoding("gzip;q=0, deflate") == "deflate"
    assert response_encoding("br") is None and response_encoding(None) is None
    assert gzip.decompress(compress(b"x" * 1000, "gzip")) == b"x" * 1000
    assert zlib.decompress(compress(b"x" * 1000, "deflate")) == b"x" * 1000
