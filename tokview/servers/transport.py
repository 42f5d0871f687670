"""A small keep-alive HTTP/1.1 client on `asyncio.Protocol`, for the requests a batch makes by the thousand.

Why not httpx here: a batch sends one JSON POST per sample and reads back one JSON body of a few
thousand ids. httpx (httpcore + anyio) spends ~1–2 ms of Python per such request on pool
bookkeeping, socket liveness probes and stream wrappers, which on a 2,000-token sample was more
than the whole analysis. aiohttp is leaner but still costs ~0.2 s to import and ~0.2 ms per request.
This client does only what those requests need, with no per-request task or stream objects:

- plain `http://` origins (the caller keeps httpx for `https://`, proxies and streams);
- one TCP connection per request in flight, reused while the server keeps it alive, at most
  `max_connections` at once (further requests wait, like httpx's pool limit);
- bodies framed by `content-length`, `transfer-encoding: chunked` or the close of the connection;
- a request that meets a kept-alive connection the server had just closed is sent once more on a
  new one (nothing of the answer had arrived), as browsers and httpx do;
- a deadline: the request fails when its answer is not complete `timeout` seconds after it got its
  connection slot (connecting included). A read timeout alone let a server that sends one byte every
  few seconds hold a request forever;
- a size limit: an answer longer than `max_body` bytes fails as soon as that is known (at once when
  its content-length says so, else when the bytes read pass it), and the rest is never read.

Errors are raised as `ConnectFailed`, `TimedOut`, `ConnectionLost` or `ResponseTooLarge`;
`servers/http.py` turns them into its retry classification, as it does httpx's.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from urllib.parse import quote

from tokview.response_size import DEFAULT_MAX_RESPONSE_BYTES
from tokview.servers.codings import UnreadableCoding, decoded

MAX_HEAD_BYTES = 1 << 16
"""A status line plus headers longer than this is not an HTTP server we can talk to."""
DEFAULT_MAX_BODY = DEFAULT_MAX_RESPONSE_BYTES
"""Bytes of one answer body read at most (see `tokview.response_size`)."""


class TransportError(Exception):
    """A request got no complete answer."""


class ConnectFailed(TransportError):
    """No connection could be made (refused, unreachable, or the connect timed out)."""


class TimedOut(TransportError):
    """The answer was not complete `timeout` seconds after the request started."""


class ConnectionLost(TransportError):
    """The connection closed, or the server spoke something that is not HTTP/1.x, mid-answer."""


class ResponseTooLarge(TransportError):
    """The answer's body is longer than the limit; `size` is its announced length (None: not announced)."""

    def __init__(self, limit: int, size: int | None = None) -> None:
        if size is not None:
            super().__init__(f"its body is {size:,} bytes, over the {limit:,}-byte limit")
        else:
            super().__init__(f"its body passed the {limit:,}-byte limit")
        self.limit, self.size = limit, size


class Response:
    """What callers read of an answer; the names are httpx.Response's, so one code path reads both."""

    __slots__ = ("content", "headers", "status_code")

    def __init__(self, status_code: int, headers: dict[str, str], content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


def head_end(buf: bytearray) -> tuple[int, int]:
    """(where the answer's head ends, the length of the blank line that ends it), or (-1, 0) while it has not come.
    A head whose lines end in a bare LF is read too (RFC 9112 lets a recipient accept one): waiting for a CR LF that
    never came said "timed out" of a server that had answered at once."""
    crlf, lf = buf.find(b"\r\n\r\n"), buf.find(b"\n\n")
    if lf >= 0 and (crlf < 0 or lf < crlf):
        return lf, 2
    return crlf, (4 if crlf >= 0 else 0)


class _Connection(asyncio.Protocol):
    """One socket: sends a request, parses one answer at a time, reports back through a future."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_body: int = DEFAULT_MAX_BODY) -> None:
        self.loop = loop
        self.max_body = max_body
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.buffer = bytearray()
        self.waiter: asyncio.Future[Response] | None = None
        self.keep_alive = True
        self.head_only = False
        self.received = False
        """Whether any byte of the current answer arrived (a request on a stale connection is resent only if not)."""
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: dict[str, str] | None = None
        self.length: int | None = None
        self.chunked = False
        self.until_close = False
        self.chunks: list[bytes] = []
        self.chunked_bytes = 0
        self.chunk_left = -1

    # -- asyncio callbacks ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():
            self._abort()  # bytes nobody asked for: the connection cannot be trusted any more
            return
        self.received = True
        self.buffer += data
        try:
            self._parse()
        except (ConnectionLost, ResponseTooLarge) as exc:
            self._fail(exc)
            self._abort()

    def eof_received(self) -> bool:
        return False  # let the transport close; connection_lost finishes or fails the answer

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        if self.until_close and self.headers is not None:
            self.keep_alive = False
            self._finish(bytes(self.buffer))
            return
        why = f": {exc}" if exc else ""
        self._fail(ConnectionLost(f"the server closed the connection before the answer was complete{why}"))

    # -- requests --------------------------------------------------------------------------------
    def send(self, data: bytes, head_only: bool) -> asyncio.Future[Response]:
        self.waiter = self.loop.create_future()
        self.received = False
        self.head_only = head_only
        assert self.transport is not None
        self.transport.write(data)
        return self.waiter

    def _abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, exc: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)

    def _finish(self, body: bytes) -> None:
        assert self.headers is not None
        response = Response(self.status, self.headers, body)
        self._reset()
        if self.buffer:  # bytes past the answer (more than its content-length): they would answer the next request
            self.keep_alive = False
            self.buffer.clear()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(response)

    # -- parsing -------------------------------------------------------------------------------------
    def _parse(self) -> None:
        buf = self.buffer
        while True:
            if self.headers is None:
                end, size = head_end(buf)
                if end < 0:
                    if len(buf) > MAX_HEAD_BYTES:
                        raise ConnectionLost("the answer's headers are too long (not an HTTP/1.x server?)")
                    return
                self._read_head(bytes(buf[:end]))
                del buf[: end + size]
                if self.headers is None:  # an informational 1xx answer: the real one follows
                    continue
                if self.length == 0 or self.head_only or self.status in (204, 304):
                    self._finish(b"")
                    return
                if self.length is not None and self.length > self.max_body:
                    raise ResponseTooLarge(self.max_body, self.length)  # refused before a byte of it is kept
            if self.length is not None:
                if len(buf) < self.length:
                    return
                if len(buf) == self.length:
                    body = bytes(buf)
                    buf.clear()
                else:
                    body = bytes(buf[: self.length])
                    del buf[: self.length]
                self._finish(body)
                return
            if self.chunked:
                if self._read_chunks():
                    self._finish(b"".join(self.chunks))
                return
            if len(buf) > self.max_body:
                raise ResponseTooLarge(self.max_body)
            return  # until_close: connection_lost finishes it

    def _read_head(self, head: bytes) -> None:
        lines = [line.removesuffix(b"\r") for line in head.split(b"\n")]
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise ConnectionLost(f"the server did not answer in HTTP/1.x ({lines[0][:60]!r})")
        status = int(parts[1])
        if 100 <= status < 200:
            return
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                continue
            key = name.strip().lower().decode("latin-1")
            text = value.strip().decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        self.status, self.headers = status, headers
        connection = headers.get("connection", "").lower()
        if "close" in connection or (parts[0] == b"HTTP/1.0" and "keep-alive" not in connection):
            self.keep_alive = False
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.chunked, self.chunk_left = True, -1
        elif "content-length" in headers:
            try:
                self.length = int(headers["content-length"].split(",")[0])
            except ValueError:
                raise ConnectionLost("the answer's content-length is not a number") from None
            if self.length < 0:
                raise ConnectionLost("the answer's content-length is negative")
        else:
            self.until_close, self.keep_alive = True, False

    def _read_chunks(self) -> bool:
        """Consume whole chunks from the buffer; True once the last (empty) chunk and trailers are in. Lines end in
        CR LF or, as a head's may (`head_end`), a bare LF."""
        buf = self.buffer
        while True:
            if self.chunk_left == -1:  # a chunk-size line
                end = buf.find(b"\n")
                if end < 0:
                    return False
                size_text = bytes(buf[:end]).rstrip(b"\r").split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise ConnectionLost(f"bad chunk size {size_text[:20]!r}") from None
                del buf[: end + 1]
                if size == 0:
                    self.chunk_left = -2
                else:
                    self.chunked_bytes += size
                    if self.chunked_bytes > self.max_body:
                        raise ResponseTooLarge(self.max_body)
                    self.chunk_left = size
            if self.chunk_left == -2:  # trailers end with an empty line
                end = buf.find(b"\n")
                while end >= 0 and bytes(buf[:end]).rstrip(b"\r"):
                    del buf[: end + 1]
                    end = buf.find(b"\n")
                if end < 0:
                    return False
                del buf[: end + 1]
                return True
            if len(buf) < self.chunk_left + 1:
                return False
            after = buf[self.chunk_left : self.chunk_left + 2]
            if after[:1] == b"\n":
                size = 1
            elif after == b"\r\n":
                size = 2
            elif after == b"\r":  # the LF is still to come
                return False
            else:
                raise ConnectionLost("a chunk is longer than its size says")
            self.chunks.append(bytes(buf[: self.chunk_left]))
            del buf[: self.chunk_left + size]
            self.chunk_left = -1


def quoted_location(value: str) -> str:
    """A redirect's Location with every byte outside printable ASCII percent-encoded, as browsers send it:
    a URL that can be parsed, followed and shown (a raw ESC or space in it is neither)."""
    if all("!" <= c <= "~" for c in value):
        return value
    return quote(value, safe="".join(chr(c) for c in range(0x21, 0x7F)), encoding="utf-8", errors="surrogateescape")


def header_block(headers: dict[str, str]) -> bytes:
    """`{"accept": "x"}` → `b"accept: x\\r\\n"`: header lines ready to go on the wire."""
    return "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode("utf-8")


class HTTPPool:
    """Keep-alive connections to one `http://host:port` origin."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        max_connections: int,
        timeout: float,
        connect_timeout: float,
        headers: dict[str, str] | None = None,
        max_body: int = DEFAULT_MAX_BODY,
    ) -> None:
        self.host, self.port = host, port
        self.timeout, self.connect_timeout = timeout, connect_timeout
        self.max_body = max_body
        host_header = host if ":" not in host else f"[{host}]"
        if port != 80:
            host_header = f"{host_header}:{port}"
        self._fixed = header_block({"host": host_header, "accept-encoding": "identity", **(headers or {})})
        self._idle: deque[_Connection] = deque()
        self._slots = asyncio.Semaphore(max(1, max_connections))
        self._all: set[_Connection] = set()

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: bytes = b"",
        on_sent: Callable[[], None] | None = None,
    ) -> Response:
        """One request; `headers` is a ready block of `name: value\\r\\n` lines added to the fixed ones.
        `on_sent` is called once, as its bytes are first handed to a socket (the request is in flight; on a
        kept-alive connection the server had just closed, before the request goes again on a new one)."""
        head = [f"{method} {path} HTTP/1.1\r\n".encode("latin-1"), self._fixed, headers]
        if body is not None or method in ("POST", "PUT", "PATCH"):
            head.append(b"content-length: %d\r\n" % len(body or b""))
        head.append(b"\r\n")
        data = b"".join(head) + (body or b"")
        async with self._slots:
            deadline = asyncio.get_running_loop().time() + self.timeout
            for attempt in (0, 1):
                conn, reused = await self._connection(deadline)
                try:
                    told = on_sent if attempt == 0 else None
                    response = await self._exchange(conn, data, method == "HEAD", deadline, told)
                except ConnectionLost:
                    self._drop(conn)
                    if reused and not conn.received and attempt == 0:
                        continue  # the server closed a kept-alive connection as we sent: once more, anew
                    raise
                except BaseException:
                    self._drop(conn)
                    raise
                if conn.keep_alive and not conn.closed:
                    self._idle.append(conn)
                else:
                    self._drop(conn)
                coding = response.headers.get("content-encoding")
                if coding:  # compressed though it asked for none (`codings`)
                    try:
                        response.content = decoded(response.content, coding, conn.max_body)
                    except UnreadableCoding:
                        if response.status_code < 300:
                            raise
                        # an error's body is only its reason: its status still says what to do (a 503 is retried)
                return response
        raise AssertionError("unreachable")

    async def _exchange(
        self, conn: _Connection, data: bytes, head_only: bool, deadline: float, on_sent: Callable[[], None] | None
    ) -> Response:
        waiter = conn.send(data, head_only)
        if on_sent is not None:
            on_sent()
        timer = conn.loop.call_at(deadline, self._expire, waiter)
        try:
            return await waiter
        finally:
            timer.cancel()

    def _expire(self, waiter: asyncio.Future[Response]) -> None:
        """The deadline passed: fail the request however many bytes are still trickling in."""
        if not waiter.done():
            waiter.set_exception(TimedOut(f"no complete answer within {self.timeout:g}s"))

    async def _connection(self, deadline: float) -> tuple[_Connection, bool]:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn, True
            self._all.discard(conn)
        loop = asyncio.get_running_loop()
        if loop.time() >= deadline:
            raise TimedOut(f"no complete answer within {self.timeout:g}s")
        wait = min(self.connect_timeout, deadline - loop.time())  # connecting counts toward the deadline
        try:
            async with asyncio.timeout(wait):
                _, conn = await loop.create_connection(lambda: _Connection(loop, self.max_body), self.host, self.port)
        except TimeoutError:
            raise ConnectFailed(f"connect timed out after {round(wait, 1):g}s") from None
        except OSError as exc:
            raise ConnectFailed(exc.strerror or str(exc) or type(exc).__name__) from None
        self._all.add(conn)
        return conn, False

    def _drop(self, conn: _Connection) -> None:
        self._all.discard(conn)
        if not conn.closed:
            conn._abort()

    async def aclose(self) -> None:
        for conn in list(self._all):
            self._drop(conn)
        self._idle.clear()
