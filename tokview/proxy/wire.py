"""HTTP/1.1 on asyncio protocols: the proxy's front (its clients' connections) and its keep-alive pool to
each upstream.

uvicorn on pure-Python h11 plus httpx cost the proxy ~1 ms of CPU a request and halved throughput at 64
concurrent streams on a 2-core box (issue 24 item 5): two general HTTP stacks, each with its own
parser, event objects, ASGI dicts, anyio layers and header models, for what is a byte relay. A proxy
needs a small part of HTTP/1.1: a request line and headers, a body by length or chunked, keep-alive, and
an answer relayed by length, chunked or until close, read by read. That part is here, on the loop's
protocol callbacks (no stream reader, no task per connection), and a request costs a few string splits.

What it does not do: pipelined requests are answered one after the other (as HTTP/1.1 requires);
upgrades (WebSocket) are not forwarded; request trailers are read and dropped. A client that shuts its
sending side (a FIN) before its answer is taken as gone and its upstream request is closed, as nginx does by
default: TCP cannot tell a half-close from a harness that gave up, and a generation nobody will read must stop.
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import cast
from urllib.parse import urlsplit

from tokview.servers.transport import head_end

MAX_HEAD = 1 << 16
"""A request or response head longer than this is refused (431 to a client, an error from an upstream)."""
MAX_BODY = 1 << 30
"""A request body larger than this is refused (413): the front holds a request whole before forwarding it."""
_FIRST_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz\r\n")
"""What a request's first byte can be: a method's first letter, or the empty line a client may send before it."""
NOT_HTTP = "not an HTTP request (the proxy speaks plain HTTP: a client given an https:// URL sends TLS)"
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,15})[ \t]*(?:;[^\r\n]*)?")
"""A chunk-size line: hex digits only (no sign, `0x` or `_`, which `int(…, 16)` accepts), then extensions."""
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""An HTTP token: a method or a header name."""
_FIELD_CONTROLS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
"""Characters no header value may hold: a bare LF forwarded inside a value is a new header line (or a new
request) to an upstream that splits on LF, so it is refused, not passed on."""
BUFFERED = 1 << 20
"""An upstream's answer waiting for a slow client beyond this pauses reading from the upstream."""
IDLE_KEPT = 256
"""Idle connections kept open to each upstream."""
NO_BODY_STATUS = frozenset({204, 304})
CONNECT_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 75.0
"""A client connection with no request under way (or one whose request stalls) for this long is closed, as
uvicorn's `timeout_keep_alive` was set: harnesses keep their connections, vanished clients must not."""


class BadRequest(Exception):
    """A client sent something that is not HTTP/1.1 this front reads: answered 400 (or 431) and closed."""

    def __init__(self, message: str, status: int = 400, *, body: bytes | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        """The answer's JSON body (else the message, as text)."""


Admit = Callable[[dict[str, str]], bytes | None]
"""Judges a request by its head, before its body is read: None lets it in, else the JSON body of a 401."""


class ClientGone(Exception):
    """The client's connection closed before its answer was complete."""


class UpstreamError(Exception):
    """The upstream could not be reached, or its connection broke; `str()` says what happened."""


class UpstreamUnreachable(UpstreamError):
    pass


class UpstreamNotConnected(UpstreamUnreachable):
    """No connection could be made: nothing of the request was sent, so another upstream may take it. `refused`: the
    upstream's host answered no at once (no server on the port), not a connection that never came (a dead host)."""

    def __init__(self, what: str, *, refused: bool) -> None:
        super().__init__(what)
        self.refused = refused


class UpstreamBrokeOff(UpstreamError):
    pass


class AnswerTooLarge(UpstreamBrokeOff):
    """An answer past the most bytes one may hold (`TOKVIEW_MAX_RESPONSE_MB`): a looping model or an upstream
    sending without end grew the proxy until the kernel killed it, and every answer in flight with it."""


@dataclass(slots=True)
class Request:
    method: str
    path: str
    query: str
    """Without the `?`; empty when there is none."""
    headers: dict[str, str]
    """Names lower-cased; a repeated header keeps its last value."""
    body: bytes
    http10: bool


Handler = Callable[[Request, "Responder"], Awaitable[None]]


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b"Unknown"


# -- the front: one protocol per client connection --------------------------------------------------------
SHUTTING_DOWN = (
    b'{"error": {"message": "tokview proxy is shutting down: this request was not answered (its upstream request was '
    b'closed); send it again", "type": "service_unavailable", "code": 503}}'
)
"""The 503's body for a request in flight when the proxy's shutdown came, in the OpenAI error shape."""
DRAIN_S = 2.0
"""How long the shutdown lets a client read what is buffered for it (the 503, an earlier pipelined answer)."""


class Responder(asyncio.Protocol):
    """One client connection: reads its requests one at a time, hands each to the handler, and writes the
    answer the handler gives (`start`, `send`, `end`, or `whole`). A client that goes away mid-answer
    cancels the handler's task, so whatever it awaits upstream is closed at once."""

    def __init__(self, handler: Handler, server: FrontServer) -> None:
        self._handler, self._server = handler, server
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._head: tuple[str, str, str, dict[str, str], bool, int, bool] | None = None
        self._task: asyncio.Task[None] | None = None
        self._drained: asyncio.Future[None] | None = None
        self._continued = False
        self.lost = False
        self.started = False
        self.finished = False
        """The last byte of the answer was handed to the transport."""
        self.cut_by_shutdown = False
        """Closed by the proxy's shutdown with an answer in flight (not left by its client)."""
        self._chunked = False
        self._keep_alive = True
        self._head_only = False
        self._http10 = False
        self._idle: asyncio.TimerHandle | None = None
        self._chunks = _Chunks()

    def _wait_idle(self) -> None:
        """Close the connection unless a whole request arrives within the idle timeout."""
        self._idle = asyncio.get_running_loop().call_later(self._server.idle_timeout_s, self._close_idle)

    def _close_idle(self) -> None:
        if self._task is None and self._transport is not None:
            self._transport.close()

    # -- asyncio.Protocol ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses
        self._server.connections.add(self)
        self._wait_idle()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._task is None:
            self._next_request()
            if self._task is None and self._idle is not None and not self.lost:  # a request still coming in:
                self._idle.cancel()  # a slow upload that moves is not idle, only one that stops
                self._wait_idle()
        elif len(self._buffer) > BUFFERED and self._transport is not None:
            self._transport.pause_reading()  # a client pipelining faster than it is answered

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._server.connections.discard(self)
        if self._idle is not None:
            self._idle.cancel()
        if self._drained is not None and not self._drained.done():
            self._drained.set_exception(ClientGone())
        if self._task is not None and not self.finished:
            self._task.cancel()

    def pause_writing(self) -> None:
        if self._drained is None or self._drained.done():
            self._drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    # -- reading requests -------------------------------------------------------------------------------
    def _next_request(self) -> None:
        try:
            request = self._parse()
        except BadRequest as exc:
            self._refuse(exc)
            return
        if request is None:
            return
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        self.started = self.finished = self._chunked = self._head_only = False
        options = {t.strip() for t in request.headers.get("connection", "").lower().split(",")}  # a token list
        self._keep_alive = "close" not in options and not (request.http10 and "keep-alive" not in options)
        self._head_only, self._http10 = request.method == "HEAD", request.http10
        self._task = asyncio.get_running_loop().create_task(self._run(request))

    async def _run(self, request: Request) -> None:
        try:
            await self._handler(request, self)
        except (ClientGone, asyncio.CancelledError):
            self._keep_alive = False
        except Exception:  # a bug in the handler: said, and this client's answer ends here
            import logging

            logging.getLogger("tokview.proxy").exception("tokview proxy: the request failed")
            if not self.started and not self.lost:
                await self.whole(500, [(b"content-type", b"text/plain")], b"tokview proxy: internal error")
            self._keep_alive = False
        finally:
            self._task = None
            if not self.finished:
                self._keep_alive = False
            if self._transport is not None and not self.lost:
                if not self._keep_alive:
                    self._transport.close()
                else:
                    self._transport.resume_reading()
                    self._wait_idle()
                    if self._buffer:
                        self._next_request()

    def _parse(self) -> Request | None:
        """The next whole request in the buffer, or None until it has all arrived."""
        buffer = self._buffer
        if self._head is None:
            # a TLS hello (an https:// base URL) or garbage: said now, not after the idle timeout (75 s) that a head
            # which never ends would wait for
            if buffer and buffer[0] not in _FIRST_BYTES:
                raise BadRequest(NOT_HTTP)
            end = buffer.find(b"\r\n\r\n")
            if end < 0 and b"\n\n" in buffer:
                raise BadRequest("the request's lines must end in CRLF")
            if end > MAX_HEAD or (end < 0 and len(buffer) > MAX_HEAD):
                raise BadRequest("request head too large", 431)
            if end < 0:
                return None
            self._head = _request_head(bytes(buffer[:end]).decode("latin-1"))
            del buffer[: end + 4]
            self._chunks = _Chunks()
            refusal = self._server.admit(self._head[3]) if self._server.admit is not None else None
            if refusal is not None:  # before its body is read (up to MAX_BODY) or a 100 Continue invites it
                raise BadRequest("unauthorised", 401, body=refusal)
        method, path, query, headers, http10, length, chunked = self._head
        if chunked:
            parsed = self._chunks.read(buffer)
            if parsed is None:
                self._continue(headers, http10)
                return None
            body, used = parsed
        else:
            if len(buffer) < length:
                self._continue(headers, http10)
                return None
            body, used = bytes(buffer[:length]), length
        del buffer[:used]
        self._head, self._continued = None, False
        return Request(method, path, query, headers, body, http10)

    def _continue(self, headers: dict[str, str], http10: bool = False) -> None:
        """`100 Continue` to a client that expects it (never to an HTTP/1.0 one, which cannot: RFC 9110 10.1.1)."""
        if http10:
            return
        if not self._continued and headers.get("expect", "").lower() == "100-continue" and self._transport:
            self._continued = True
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _refuse(self, exc: BadRequest) -> None:
        body, kind = (exc.body, b"application/json") if exc.body is not None else (str(exc).encode(), b"text/plain")
        if self._transport is not None:
            self._transport.write(
                b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
                % (exc.status, _reason(exc.status), kind, len(body), body)
            )
            self._transport.close()

    # -- writing the answer --------------------------------------------------------------------------------
    def _head_bytes(
        self, status: int, reason: bytes | None, headers: list[tuple[bytes, bytes]], length: int | None
    ) -> bytes:
        lines = [b"HTTP/1.1 %d %s\r\n" % (status, reason or _reason(status))]
        lines += [b"%s: %s\r\n" % pair for pair in headers]
        if length is not None:
            lines.append(b"content-length: %d\r\n" % length)
        elif not (self._head_only or status in NO_BODY_STATUS or status < 200):
            if self._http10:
                self._keep_alive = False  # the body ends where the connection closes
            else:
                self._chunked = True
                lines.append(b"transfer-encoding: chunked\r\n")
        if not self._keep_alive:
            lines.append(b"connection: close\r\n")
        elif self._http10:  # an HTTP/1.0 client keeps the connection only when the answer says so
            lines.append(b"connection: keep-alive\r\n")
        lines.append(b"\r\n")
        return b"".join(lines)

    def _write(self, data: bytes) -> None:
        if self.lost or self._transport is None:
            raise ClientGone()
        self._transport.write(data)

    async def start(
        self, status: int, headers: list[tuple[bytes, bytes]], length: int | None, reason: bytes | None = None
    ) -> None:
        """Send the head: `length` None means a body of unknown length (chunked; until close for HTTP/1.0)."""
        self.started = True
        self._write(self._head_bytes(status, reason, headers, length))

    async def send(self, data: bytes) -> None:
        """One piece of the body, out at once (a stream's events reach the client as they come)."""
        if not data or self._head_only:
            return
        self._write(b"%x\r\n%s\r\n" % (len(data), data) if self._chunked else data)
        if self._drained is not None and not self._drained.done():
            await self._drained  # the client reads slower than the upstream answers

    async def end(self, data: bytes = b"") -> None:
        if data and not self._head_only:
            self._write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data) if self._chunked else data)
        elif self._chunked:
            self._write(b"0\r\n\r\n")
        elif self.lost:
            raise ClientGone()
        self.finished = True

    async def whole(
        self, status: int, headers: list[tuple[bytes, bytes]], body: bytes, reason: bytes | None = None
    ) -> None:
        """A complete answer in one write."""
        self.started = True
        head = self._head_bytes(status, reason, headers, len(body))
        self._write(head if self._head_only else head + body)
        self.finished = True

    def unavailable(self) -> None:
        """The proxy's shutdown came before any byte of this answer: a 503 the client (and an OpenAI client's
        retry) can read, where a dropped connection looked like a network fault. The handler is cancelled, so it
        closes its upstream request and records the generation as cut off by the shutdown."""
        self.started = self.finished = True
        self._keep_alive = False
        transport = self._transport
        if transport is not None and not self.lost:
            head = (
                b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                b"connection: close\r\n\r\n" % len(SHUTTING_DOWN)
            )
            transport.write(head if self._head_only else head + SHUTTING_DOWN)  # after any pipelined answer, in order
            transport.close()
            # close() waits for the client to read what is buffered; one that reads nothing would hold the proxy
            # (from Python 3.12 the server's wait_closed() waits for every connection): cut after DRAIN_S.
            asyncio.get_running_loop().call_later(DRAIN_S, transport.abort)
        if self._task is not None:
            self._task.cancel()

    def cut(self) -> None:
        """End the connection without ending the answer: the client sees it was cut off."""
        self._keep_alive = False
        if self._transport is not None:
            self._transport.abort()


def _request_head(head: str) -> tuple[str, str, str, dict[str, str], bool, int, bool]:
    """The request line and headers, checked as strictly as the servers behind the proxy read them: anything
    the proxy and an upstream could read two ways (a value holding a line break, two lengths, a coding other
    than chunked, both a length and chunked) is refused, never forwarded."""
    lines = head.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[2] not in ("HTTP/1.1", "HTTP/1.0") or not _TOKEN.fullmatch(parts[0]):
        raise BadRequest("not an HTTP/1.1 request line")
    method, target, version = parts
    if not target or _FIELD_CONTROLS.search(target):
        raise BadRequest("bad request target")
    headers: dict[str, str] = {}
    framing: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.fullmatch(name):
            raise BadRequest("malformed header line")
        value = value.strip(" \t")
        if _FIELD_CONTROLS.search(value):
            raise BadRequest("a header value holds a control character")
        name = name.lower()
        if name in ("content-length", "transfer-encoding"):
            if framing.get(name, value) != value:
                raise BadRequest(f"two different {name} headers")
            framing[name] = value
        headers[name] = value
    path, _, query = target.partition("?")
    chunked = "transfer-encoding" in framing
    if chunked and (framing["transfer-encoding"].lower() != "chunked" or "content-length" in framing):
        raise BadRequest("unsupported transfer-encoding (only chunked, and without a content-length)")
    length = 0
    if "content-length" in framing:
        text = framing["content-length"]
        if not (text.isascii() and text.isdigit()) or len(text) > 18:
            raise BadRequest("bad content-length")
        length = int(text)
        if length > MAX_BODY:
            raise BadRequest("request body too large", 413)
    return method, path, query, headers, version == "HTTP/1.0", length, chunked


class _Chunks:
    """A chunked request body read as it arrives, where the last read stopped (a slow upload that sends a byte
    at a time is not parsed again from its start on every read)."""

    def __init__(self) -> None:
        self.pos = 0
        self.size = 0
        self.parts: list[bytes] = []

    def read(self, buffer: bytearray) -> tuple[bytes, int] | None:
        """(the body, bytes it used) once it has all come, else None; BadRequest for bad framing."""
        while True:
            line_end = buffer.find(b"\r\n", self.pos)
            if line_end < 0:
                if len(buffer) - self.pos > MAX_HEAD:
                    raise BadRequest("bad chunk size")
                return None
            match = _CHUNK_SIZE.fullmatch(buffer, self.pos, line_end)
            if match is None:
                raise BadRequest("bad chunk size")
            size = int(match.group(1), 16)
            if self.size + size > MAX_BODY:  # as declared, before its data is held: a client could send for ever
                raise BadRequest("request body too large", 413)
            data = line_end + 2
            if size == 0:
                end = buffer.find(b"\r\n\r\n", line_end)  # trailers, if any, end with a blank line
                return (b"".join(self.parts), end + 4) if end >= 0 else None
            if len(buffer) < data + size + 2:
                return None
            if buffer[data + size : data + size + 2] != b"\r\n":
                raise BadRequest("a chunk's data does not end in CRLF")
            self.size += size
            self.parts.append(bytes(buffer[data : data + size]))
            self.pos = data + size + 2


class FrontServer:
    """The listening socket's server and the connections it has open (to wait for or close on shutdown)."""

    def __init__(self, handler: Handler, idle_timeout_s: float = IDLE_TIMEOUT_S, admit: Admit | None = None) -> None:
        self.handler, self.idle_timeout_s, self.admit = handler, idle_timeout_s, admit
        self.connections: set[Responder] = set()
        self.server: asyncio.Server | None = None

    async def start(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: Responder(self.handler, self), sock=sock, backlog=1024)

    async def shutdown(self, grace_s: float, hurry: asyncio.Event | None = None) -> None:
        """Stop accepting, let answers in progress finish for up to `grace_s` (or until `hurry` is set), then close
        every connection."""
        if self.server is not None:
            self.server.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while any(c._task is not None for c in self.connections) and loop.time() < deadline:
            if hurry is not None and hurry.is_set():
                break
            await asyncio.sleep(0.01)
        for connection in list(self.connections):
            if connection._transport is not None:
                connection.cut_by_shutdown = connection._task is not None
                if connection.cut_by_shutdown and not connection.started:
                    connection.unavailable()  # nothing sent yet: an answer the client can read, not a cut
                elif connection.cut_by_shutdown:  # its answer is cut anyway: now, so its handler sees it and records
                    connection._transport.abort()  # it (close() waits for the send buffer of a client that reads
                else:  # slowly or not at all, and the run's end cancelled the handler first: the answer vanished)
                    connection._transport.close()
        if self.server is not None:
            await self.server.wait_closed()


# -- the upstream side: a pool of keep-alive connections --------------------------------------------------
class UpstreamResponse(asyncio.Protocol):
    """One connection to the upstream, and the answer it is reading: its status and headers, then its body
    read by read (`next_piece`). After a complete answer the connection goes back to its pool."""

    def __init__(self, pool: UpstreamPool) -> None:
        self._pool = pool
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._pieces: deque[bytes] = deque()
        self._queued = 0
        self._waiter: asyncio.Future[None] | None = None
        self._head_only = False
        self._error: UpstreamError | None = None
        self.reused = False
        self.got_bytes = False
        self.closed = False
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        """Names lower-cased, in the order sent."""
        self._has_head = False
        self._framing = ""  # length | chunked | close | none
        self._remaining = 0
        self._done = False
        self._keep_alive = True
        self._idle_transport: asyncio.Transport | None = None
        """Its connection, once handed back to the pool (closed by the upstream while idle: forgotten)."""

    # -- asyncio.Protocol ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        self._buffer += data
        try:
            self._parse()
        except UpstreamError as exc:
            self._fail(exc)
            if self._transport is not None:
                self._transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._pool.forget(self)
        if self._framing == "close" and self._has_head and not self._done:
            self._done = True
            self._wake()
        elif not self._done:
            what = "the upstream closed the connection" + (f" ({exc})" if exc else "")
            self._fail(UpstreamBrokeOff(what) if self._has_head else UpstreamUnreachable(what))

    def pause_writing(self) -> None:  # a request body larger than the socket buffer: the loop buffers it
        pass

    def resume_writing(self) -> None:
        pass

    # -- reading the answer ------------------------------------------------------------------------------
    def _parse(self) -> None:
        while not self._has_head:  # interim 1xx answers (100 Continue, 103 Early Hints) are skipped
            end, size = head_end(self._buffer)  # a head whose lines end in a bare LF too, as the batch reads it
            if end < 0:
                if len(self._buffer) > MAX_HEAD:
                    raise UpstreamBrokeOff("the upstream's answer head is too large")
                return
            self._read_head(bytes(self._buffer[:end]))
            del self._buffer[: end + size]
        self._wake()
        if self._done or not self._buffer:
            return
        if self._framing == "chunked":
            self._read_chunks()
        else:
            data = bytes(self._buffer)
            self._buffer.clear()
            if self._framing == "length":
                if len(data) >= self._remaining:
                    data, extra = data[: self._remaining], data[self._remaining :]
                    if extra:
                        self._keep_alive = False  # more than it announced: not a connection to reuse
                    self._done = True
                self._remaining -= len(data)
            self._push(data)

    def _read_head(self, head: bytes) -> None:
        lines = [line.removesuffix(b"\r") for line in head.split(b"\n")]
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise UpstreamBrokeOff("the upstream's answer is not HTTP/1.1")
        self.status, self.reason = int(parts[1]), parts[2] if len(parts) > 2 else b""
        headers = []
        length, chunked, connection = None, False, b""
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                continue
            name, value = name.strip().lower(), value.strip()
            headers.append((name, value))
            if name == b"content-length":
                length = int(value) if value.isdigit() else None
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                connection = value.lower()
        if 100 <= self.status < 200 and self.status != 101:
            return  # interim: the real answer's head follows
        self.headers = headers
        self._has_head = True
        self._keep_alive = connection != b"close" and (parts[0] != b"HTTP/1.0" or connection == b"keep-alive")
        if self._head_only or self.status in NO_BODY_STATUS or self.status < 200:
            self._framing, self._done = "none", True
        elif chunked:
            self._framing = "chunked"
        elif length is not None:
            self._framing, self._remaining = "length", length
            self._done = length == 0
        else:
            self._framing, self._keep_alive = "close", False

    def _read_chunks(self) -> None:
        buffer, pos, parts = self._buffer, 0, list[bytes]()
        while True:
            if self._remaining > 0:  # inside a chunk's data
                take = min(self._remaining, len(buffer) - pos)
                if take <= 0:
                    break
                parts.append(bytes(buffer[pos : pos + take]))
                pos += take
                self._remaining -= take
                if self._remaining == 0:
                    self._remaining = -2  # its CRLF next
                continue
            if self._remaining == -2:  # a chunk's line end: CRLF, or a bare LF as its head's lines may end
                if len(buffer) - pos < 1 or buffer[pos : pos + 2] == b"\r":
                    break
                if buffer[pos : pos + 1] == b"\n":
                    pos += 1
                elif buffer[pos : pos + 2] == b"\r\n":
                    pos += 2
                else:
                    raise UpstreamBrokeOff("the upstream's chunk data does not end in CRLF")
                self._remaining = 0
                continue
            line_end = buffer.find(b"\n", pos)
            if line_end < 0:
                break
            text_end = line_end - 1 if line_end > pos and buffer[line_end - 1] == 13 else line_end  # without its CR
            if self._remaining == -1:  # trailers after the last chunk, up to a blank line
                blank = text_end == pos
                pos = line_end + 1
                if blank:
                    self._done = True
                    break
                continue
            match = _CHUNK_SIZE.fullmatch(buffer, pos, text_end)
            if match is None:
                raise UpstreamBrokeOff("the upstream sent a bad chunk size")
            size = int(match.group(1), 16)
            pos = line_end + 1
            if size == 0:
                self._remaining = -1
                continue
            self._remaining = size
        del buffer[:pos]
        if parts or self._done:
            self._push(b"".join(parts))

    def _push(self, data: bytes) -> None:
        if data:
            self._pieces.append(data)
            self._queued += len(data)
            if self._queued > BUFFERED and self._transport is not None:
                self._transport.pause_reading()
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, exc: UpstreamError) -> None:
        if self._error is None and not self._done:
            self._error = exc
        self._wake()

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def _head(self) -> None:
        while not self._has_head:
            if self._error is not None:
                raise self._error
            await self._wait()

    async def next_piece(self) -> bytes | None:
        """The body as it comes: every byte read since the last call (at least one), None at its end."""
        while not self._pieces:
            if self._done:
                self._release()
                return None
            if self._error is not None:
                raise self._error
            await self._wait()
        piece = b"".join(self._pieces) if len(self._pieces) > 1 else self._pieces[0]
        self._pieces.clear()
        if self._queued > BUFFERED and self._transport is not None:
            self._transport.resume_reading()
        self._queued = 0
        return piece

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body; AnswerTooLarge past `limit` bytes (the rest is not read)."""
        parts, held = [], 0
        while (piece := await self.next_piece()) is not None:
            parts.append(piece)
            held += len(piece)
            if limit is not None and held > limit:
                raise AnswerTooLarge(f"its answer passed {limit / 2**20:g} MiB (TOKVIEW_MAX_RESPONSE_MB)")
        return b"".join(parts)

    def header(self, name: bytes) -> bytes:
        for k, v in self.headers:
            if k == name:
                return v
        return b""

    def _release(self) -> None:
        if self._transport is None:
            return
        transport, self._transport = self._transport, None
        self._idle_transport = transport
        if self._keep_alive and not self.closed and not self._buffer:
            self._pool.give_back(transport)
        else:
            transport.close()

    def close(self) -> None:
        """Done with this answer: a connection whose answer was read whole goes back to the pool; one
        still answering is closed, so the upstream stops generating."""
        if self._transport is None:
            return
        if self._done and not self._pieces:
            self._release()
        else:
            self._transport.abort()
            self._transport = None


class UpstreamPool:
    """Keep-alive connections to one upstream (`http://` or `https://`, optionally under a path)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.https else 80)
        self.prefix = parts.path.rstrip("/")
        default = 443 if self.https else 80
        self.host_header = (self.host if ":" not in self.host else f"[{self.host}]") + (
            "" if self.port == default else f":{self.port}"
        )
        self._ssl = ssl.create_default_context() if self.https else None
        self._idle: list[asyncio.Transport] = []
        self._closed = False
        self._orphan: asyncio.Future[UpstreamResponse] | None = None
        """The connect going on after its request was cancelled (`_connection`)."""
        self.on_unreachable: Callable[[UpstreamNotConnected], None] | None = None
        """Told when a connection whose request was cancelled meanwhile could not be made. A client that gave up
        during a connect to a dead host (no answer until CONNECT_TIMEOUT_S) cancelled it, and nothing found the host
        dead: every next request stalled on it again. The connect now goes on without the request (`_connection`)."""

    @property
    def origin(self) -> bytes:
        """The URL this upstream's answers name it by (scheme, the host header it is sent, the path prefix)."""
        return f"{'https' if self.https else 'http'}://{self.host_header}{self.prefix}".encode()

    def forget(self, response: UpstreamResponse) -> None:
        """A connection closed (by the upstream while idle, or after its answer)."""
        transport = response._idle_transport
        if transport is not None and transport in self._idle:
            self._idle.remove(transport)

    def give_back(self, transport: asyncio.Transport) -> None:
        if len(self._idle) < IDLE_KEPT and not transport.is_closing() and not self._closed:
            self._idle.append(transport)
        else:
            transport.close()

    async def request(self, method: str, target: str, headers: list[tuple[str, str]], body: bytes) -> UpstreamResponse:
        """Send one request and wait for the answer's head. A kept connection the upstream closed while it
        sat idle (vLLM's uvicorn closes them after 5 s) is retried once on a new one, as nothing was read."""
        lines = [f"{method} {self.prefix}{target} HTTP/1.1\r\nhost: {self.host_header}\r\n"]
        lines += [f"{k}: {v}\r\n" for k, v in headers]
        if body or method in ("POST", "PUT", "PATCH"):
            lines.append(f"content-length: {len(body)}\r\n")
        lines.append("\r\n")
        data = "".join(lines).encode("latin-1") + body
        for attempt in (0, 1):
            response = await self._connection(method == "HEAD")
            assert response._transport is not None
            response._transport.write(data)
            try:
                await response._head()
                return response
            except UpstreamError:
                response.close()
                if attempt or not response.reused or response.got_bytes:
                    raise
            except BaseException:  # cancelled: the client went away before the answer's head; the upstream stops
                response.close()
                raise
        raise AssertionError("unreachable")

    async def _connection(self, head_only: bool) -> UpstreamResponse:
        while self._idle:
            transport = self._idle.pop()
            if transport.is_closing():
                continue
            response = UpstreamResponse(self)
            response._head_only, response.reused = head_only, True
            transport.set_protocol(response)
            response._transport = transport
            return response
        connecting = asyncio.ensure_future(self._connect())
        try:
            protocol = await asyncio.shield(connecting)
        except asyncio.CancelledError:  # the request went (its client left): the connect ends on its own
            if connecting.done():  # it ended in the same turn: its connection closed, or its failure told
                self._connected_for_no_one(connecting)
            elif self._orphan is not None and not self._orphan.done():
                connecting.cancel()  # one connect going on is enough to find out: not one socket per given-up request
            else:
                self._orphan = connecting
                connecting.add_done_callback(self._connected_for_no_one)
            raise
        protocol._head_only = head_only
        return protocol

    async def _connect(self) -> UpstreamResponse:
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(
                    lambda: UpstreamResponse(self),
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.host if self.https else None,
                ),
                CONNECT_TIMEOUT_S,
            )
        except TimeoutError:
            raise UpstreamNotConnected(f"no connection within {CONNECT_TIMEOUT_S:.0f} s", refused=False) from None
        except OSError as exc:
            raise UpstreamNotConnected(f"cannot connect: {exc.strerror or exc}", refused=True) from None
        return protocol

    def _connected_for_no_one(self, connecting: asyncio.Future[UpstreamResponse]) -> None:
        """A connect whose request was cancelled ended: a connection made is kept for the next request (nothing was
        sent on it: a connect to a slow host cost its time once), one that could not be made is told
        (`on_unreachable`)."""
        if connecting.cancelled():  # the proxy is closing
            return
        error = connecting.exception()
        if error is None:
            connecting.result()._release()
        elif isinstance(error, UpstreamNotConnected) and self.on_unreachable is not None:
            self.on_unreachable(error)

    def close(self) -> None:
        self._closed = True  # a connect still going on (`_orphan`) is closed when it ends, not kept
        for transport in self._idle:
            transport.close()
        self._idle.clear()
