"""Answer bodies compressed though tokview asked for none, read as the bytes they stand for (`servers/codings.py`)."""

from __future__ import annotations

import gzip
import zlib

import pytest

from tokview.servers.codings import BodyDecoder, UnreadableCoding, decoded

BODY = b'{"choices": [{"text": "caf\\u00e9", "token_ids": [1, 2, 3]}]}' * 50
LIMIT = 10**7


def _raw_deflate(data: bytes) -> bytes:
    squeeze = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return squeeze.compress(data) + squeeze.flush()


@pytest.mark.parametrize(
    ("coding", "packed"),
    [
        ("gzip", gzip.compress(BODY)),
        ("x-gzip", gzip.compress(BODY)),
        ("deflate", zlib.compress(BODY)),
        ("deflate", _raw_deflate(BODY)),  # some servers send deflate without its zlib header
        ("deflate, gzip", gzip.compress(zlib.compress(BODY))),  # applied in order, undone the other way
        ("gzip", gzip.compress(BODY[:700]) + gzip.compress(BODY[700:])),  # members one after another
        ("identity", BODY),
    ],
    ids=["gzip", "x-gzip", "deflate", "raw-deflate", "stacked", "gzip-members", "identity"],
)
def test_a_body_is_read_whole_and_piece_by_piece(coding, packed):
    assert decoded(packed, coding, LIMIT) == BODY
    decoder = BodyDecoder(coding, LIMIT)
    if decoder.active:
        pieces = [decoder.feed(packed[i : i + 7]) for i in range(0, len(packed), 7)]
        assert b"".join(pieces) + decoder.end() == BODY


@pytest.mark.parametrize(
    ("coding", "packed", "says"),
    [
        ("br", b"\x1b\x00x", "compressed as 'br'"),
        ("gzip", gzip.compress(BODY)[:-6], "cut off before its end"),
        ("gzip", b"not gzip at all", "does not decompress"),
        ("deflate", zlib.compress(BODY) + b"more", "goes on past its end"),
        ("gzip", gzip.compress(b"0" * (LIMIT + 10)), "past the 10,000,000-byte limit"),  # a small body, huge inside
    ],
    ids=["br", "cut", "not-gzip", "deflate-trailing", "bomb"],
)
def test_a_body_that_cannot_be_read_says_why(coding, packed, says):
    with pytest.raises(UnreadableCoding, match=says):
        decoded(packed, coding, LIMIT)


def test_an_empty_body_says_nothing_compressed():
    assert decoded(b"", "gzip", LIMIT) == b""  # a 204, a HEAD
