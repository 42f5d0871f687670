"""Answer bodies a server compressed though tokview asked for none (`accept-encoding: identity`), read as sent.

A server, or a gateway in front of it ("gzip always"), may compress anyway; RFC 9110 even lets it when a request
names no coding. The batch's small HTTP transport read such a body as text ("not JSON ('\\x08\\x00...')", and retried
it), and the proxy took its injected ids out of the compressed bytes, where they never match: the client got the
ids it never asked for. gzip and deflate are undone here, piece by piece for a stream; any other coding is refused
with its name. The decompressed size is bounded as a plain body is (a small body may hold gigabytes).
"""

from __future__ import annotations

import zlib


class UnreadableCoding(Exception):
    """An answer in a content coding tokview does not read, or whose compressed bytes are broken."""


def codings_of(header: str) -> list[str]:
    """The codings a `content-encoding` value names, in the order they were applied (identity left out)."""
    return [c for c in (part.strip().lower() for part in header.split(",")) if c and c != "identity"]


class _Stage:
    """One coding undone. deflate is zlib-wrapped as RFC 9110 says; some servers send it raw, told apart by the
    zlib header's first two bytes."""

    def __init__(self, coding: str) -> None:
        self.coding = coding
        self.pending = b""
        self.inflater: zlib._Decompress | None = None
        if coding in ("gzip", "x-gzip"):
            self.inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)

    def feed(self, data: bytes, limit: int) -> bytes:
        if self.inflater is None:  # deflate, until its first two bytes have come
            self.pending += data
            if len(self.pending) < 2:
                return b""
            first, second = self.pending[0], self.pending[1]
            wrapped = first & 0x0F == 8 and (first * 256 + second) % 31 == 0
            self.inflater = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
            data, self.pending = self.pending, b""
        out: list[bytes] = []
        while data:
            if self.inflater.eof:  # a gzip body may be members one after another (a gateway compressing each flush)
                if self.coding == "deflate":
                    raise UnreadableCoding("the answer's deflate body goes on past its end")
                self.inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
            try:
                out.append(self.inflater.decompress(data, limit + 1))  # past `limit`: the caller refuses it whole
            except zlib.error as exc:
                raise UnreadableCoding(f"the answer's {self.coding} body does not decompress ({exc})") from None
            if len(out[-1]) > limit:
                break
            data = self.inflater.unused_data if self.inflater.eof else b""
        return b"".join(out)

    def end(self) -> bytes:
        if self.inflater is None:
            raise UnreadableCoding(f"the answer's {self.coding} body is cut off before its end")
        try:
            out = self.inflater.flush()
        except zlib.error as exc:
            raise UnreadableCoding(f"the answer's {self.coding} body does not decompress ({exc})") from None
        if not self.inflater.eof:
            raise UnreadableCoding(f"the answer's {self.coding} body is cut off before its end")
        return out


class BodyDecoder:
    """Feed the compressed body as it comes; get back what it decompresses to so far. `end()` checks it was whole."""

    def __init__(self, header: str, limit: int, *, whole: bool = True) -> None:
        """`limit`: the most bytes the body may decompress to; `whole=False` (a stream forwarded as it comes, whose
        holding its reader bounds): the most one read may decompress to, a bomb's guard."""
        self._whole = whole
        self._stages: list[_Stage] = []
        for coding in reversed(codings_of(header)):  # the last coding applied is undone first
            if coding not in ("gzip", "x-gzip", "deflate"):
                raise UnreadableCoding(
                    f"the answer is compressed as {coding!r}: tokview reads gzip and deflate only, and asked for none "
                    "(accept-encoding: identity); turn compression off in the server or the gateway before it"
                )
            self._stages.append(_Stage(coding))
        self._limit = limit
        self._size = 0

    @property
    def active(self) -> bool:
        return bool(self._stages)

    def feed(self, data: bytes) -> bytes:
        for stage in self._stages:
            data = stage.feed(data, self._limit) if data else b""
        return self._counted(data)

    def end(self) -> bytes:
        """What is left; UnreadableCoding when a stage did not reach its end (the body was cut)."""
        out = b""
        for stage in self._stages:
            out = (stage.feed(out, self._limit) if out else b"") + stage.end()
        return self._counted(out)

    def _counted(self, data: bytes) -> bytes:
        self._size = self._size + len(data) if self._whole else len(data)
        if self._size > self._limit:
            raise UnreadableCoding(f"the answer decompresses past the {self._limit:,}-byte limit")
        return data


def decoded(body: bytes, header: str, limit: int) -> bytes:
    """A whole body as it was before the codings `header` names; UnreadableCoding when it cannot be."""
    decoder = BodyDecoder(header, limit)
    if not decoder.active or not body:  # an empty body (a 204, a HEAD) says nothing compressed
        return body
    return decoder.feed(body) + decoder.end()
