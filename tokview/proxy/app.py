"""The proxy's HTTP front: a plain ASGI app (uvicorn serves it) that forwards to the upstream with httpx.

Per request: check the proxy key (when one is required), read the body, add the id fields on the two
generation endpoints (`ids.inject`), forward, and send back what the upstream sends as it arrives: a
JSON answer whole with the added ids taken out (`ids.strip_body`), a stream event by event with the
id-only events dropped. Every other path goes through untouched. When the client goes away the upstream
request is closed at once (the server stops generating), and the request is recorded as abandoned.
A finished generation is handed to the recorder after its last byte went out, as the bytes that came
in (`recorder.Finished`): parsing them, the capture, the session and the analysis all happen in the
recorder (its threads, or its own process), never on the loop a client's bytes go through.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
import orjson

from tokview.proxy import ids
from tokview.proxy.capture import ENDPOINT_PATHS
from tokview.proxy.recorder import Failed, Finished, Recorder
from tokview.proxy.sessions import SESSION_HEADER
from tokview.proxy.sse import EventSplitter, data_of
from tokview.servers.http import error_message

if TYPE_CHECKING:
    from tokview.proxy.recorder_process import RecorderProcess

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

PROXY_KEY_HEADER = "x-tokview-proxy-key"
NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "accept-encoding",
    }
)
"""Request headers never forwarded as they are (httpx sets length and host; the answer must come unencoded)."""
STORED_HEADERS = ("content-type", "user-agent", "accept", SESSION_HEADER)
"""The only client headers a stored request keeps: never Authorization, cookies or keys."""


@dataclass
class Upstream:
    """One server behind the proxy: its public URL, kind, the Authorization it is sent, and the stamp
    a capture made there carries."""

    url: str
    kind: str
    auth: str | None = None
    stamp: dict[str, Any] = field(default_factory=dict)
    max_model_len: int | None = None
    client: httpx.AsyncClient | None = None

    def http(self) -> httpx.AsyncClient:
        if self.client is None:  # made inside the serving loop
            self.client = httpx.AsyncClient(
                base_url=self.url,
                timeout=httpx.Timeout(None, connect=10.0),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
                # no Nagle wait for the body after the headers (40 ms a request against a delayed ACK)
                transport=httpx.AsyncHTTPTransport(retries=0, socket_options=NODELAY),
            )
        return self.client


class Abandoned(Exception):
    """The client went away before the answer was complete."""


@dataclass
class _Exchange:
    """One request as it goes through: what the recorder needs once it is over."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    upstream: Upstream
    endpoint: str | None = None
    request: dict[str, Any] | None = None
    injection: ids.Injection | None = None
    started: float = field(default_factory=time.perf_counter)
    chunks_sent: int = 0
    started_response: bool = False
    answered: bool = False
    """The last byte of the answer was handed to the server."""


class ProxyApp:
    def __init__(
        self,
        upstreams: list[Upstream],
        recorder: Recorder | RecorderProcess | None,
        *,
        profile: Any = None,
        key: str | None = None,
    ) -> None:
        self.upstreams, self.recorder, self.profile, self.key = upstreams, recorder, profile, key
        self._next = itertools.cycle(range(len(upstreams)))

    async def aclose(self) -> None:
        for upstream in self.upstreams:
            if upstream.client is not None:
                await upstream.client.aclose()
                upstream.client = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if self.key is not None and not self._authorised(headers):
            await _json_error(send, 401, "tokview proxy: missing or wrong proxy key (TOKVIEW_PROXY_KEY)")
            return
        body = await _read_body(receive)
        if body is None:
            return  # gone before it finished sending its request
        path = scope["path"]
        query = scope.get("query_string") or b""
        ex = _Exchange(scope["method"], path, headers, body, self.upstreams[next(self._next)])

        async def send_tracked(message: dict[str, Any]) -> None:
            ex.started_response = True
            if message["type"] == "http.response.body" and not message.get("more_body"):
                ex.answered = True  # from here on receive() says "disconnect" even with the client still there
            await send(message)

        forward = asyncio.ensure_future(self._forward(ex, query, send_tracked))
        watch = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait((forward, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
        if not forward.done() and ex.answered:
            await asyncio.wait((forward,))  # the answer is out: let it be recorded
        if not forward.done():
            forward.cancel()
            try:
                await forward
            except (asyncio.CancelledError, Exception):
                pass
            self._abandoned(ex)
            return
        try:
            forward.result()
        except Abandoned:
            self._abandoned(ex)

    def _authorised(self, headers: dict[str, str]) -> bool:
        assert self.key is not None
        given = headers.get(PROXY_KEY_HEADER)
        if given is None:
            auth = headers.get("authorization", "")
            given = auth[7:].strip() if auth[:7].lower() == "bearer " else None
        return given is not None and hmac.compare_digest(given.encode(), self.key.encode())

    # -- forwarding -----------------------------------------------------------------------------
    def _upstream_headers(self, ex: _Exchange) -> dict[str, str]:
        out = {k: v for k, v in ex.headers.items() if k not in HOP_BY_HOP and k != PROXY_KEY_HEADER}
        out["accept-encoding"] = "identity"
        if self.key is not None and "authorization" in out and PROXY_KEY_HEADER not in ex.headers:
            del out["authorization"]  # that was the proxy key: the upstream gets its own credentials
        if "authorization" not in out and ex.upstream.auth:
            out["authorization"] = ex.upstream.auth
        out.pop(SESSION_HEADER, None)
        return out

    def _prepare(self, ex: _Exchange) -> bytes:
        """The body to send: the client's, or on a generation endpoint the same with the id fields added."""
        endpoint = ENDPOINT_PATHS.get(ex.path) if ex.method == "POST" else None
        if endpoint is None:
            return ex.body
        try:
            request = orjson.loads(ex.body)
        except orjson.JSONDecodeError:
            return ex.body  # the upstream answers a broken body itself
        if not isinstance(request, dict):
            return ex.body
        ex.endpoint, ex.request = endpoint, request
        sent, ex.injection = ids.inject(request, ex.upstream.kind)
        return ex.body if sent is request else orjson.dumps(sent)

    async def _forward(self, ex: _Exchange, query: bytes, send: Send) -> None:
        content = self._prepare(ex)
        client = ex.upstream.http()
        url = httpx.URL(ex.path, query=query) if query else ex.path
        request = client.build_request(ex.method, url, content=content, headers=self._upstream_headers(ex))
        try:
            response = await client.send(request, stream=True)
        except httpx.HTTPError as exc:
            reason = f"upstream {ex.upstream.url} unreachable: {type(exc).__name__}"
            await _json_error(send, 502, f"tokview proxy: {reason}")
            self._failure(ex, reason)
            return
        try:
            if ex.endpoint is None:
                await self._pass_through(response, send)
            elif response.status_code != 200:
                body = await response.aread()
                await _start(send, response, len(body))
                await _send_body(send, body, False)
                self._failure(ex, f"refused by the upstream: HTTP {response.status_code}: {error_message(body)}")
            elif "text/event-stream" in response.headers.get("content-type", ""):
                await self._relay_stream(ex, response, send)
            else:
                await self._relay_json(ex, response, send)
        except httpx.HTTPError as exc:
            self._failure(ex, f"the upstream's answer broke off after {ex.chunks_sent} chunks: {type(exc).__name__}")
            if not ex.started_response:  # nothing sent yet: the harness gets an error, not a cut answer it might trust
                await _json_error(send, 502, f"tokview proxy: the upstream's answer broke off ({type(exc).__name__})")
            # else: the answer is left incomplete (no final chunk), so the client's connection is cut, as the
            # upstream cut the proxy's
        finally:
            await response.aclose()

    async def _pass_through(self, response: httpx.Response, send: Send) -> None:
        await _start(send, response, None, keep_length=True)
        async for piece in response.aiter_raw():
            await _send_body(send, piece, True)
        await _send_body(send, b"", False)

    async def _relay_json(self, ex: _Exchange, response: httpx.Response, send: Send) -> None:
        raw = await response.aread()
        injection = ex.injection
        out = ids.strip_body(raw, injection) if injection is not None else raw
        await _start(send, response, len(out))
        await _send_body(send, out, False)
        self._record_later(ex, raw, stream=False)

    async def _relay_stream(self, ex: _Exchange, response: httpx.Response, send: Send) -> None:
        injection = ex.injection
        assert injection is not None
        await _start(send, response, None)
        splitter = EventSplitter()
        pieces: list[bytes] = []  # the stream as it came, parsed by the recorder once the client has it all
        strips = injection.strips
        async for piece in response.aiter_raw():
            pieces.append(piece)
            whole = splitter.feed_whole(piece)
            if not whole:
                continue
            if not strips:
                out, n = whole, whole.count(b"\n\n")
            elif b"\r" not in whole and not ids.may_be_id_only(whole, injection):
                out, n = ids.strip_body(whole, injection), whole.count(b"\n\n")  # one pass over the read's events
            else:  # an id-only chunk may be there (or CRLF events): event by event
                kept = [
                    ids.strip_body(event, injection)
                    for event in EventSplitter().feed(whole)
                    if not (ids.may_be_id_only(event, injection) and ids.id_only_chunk(data_of(event), injection))
                ]
                out, n = b"".join(kept), len(kept)
            if out:
                await _send_body(send, out, True)
                ex.chunks_sent += n
        await _send_body(send, splitter.rest(), False)
        self._record_later(ex, b"".join(pieces), stream=True)

    # -- recording ------------------------------------------------------------------------------
    def _session_of(self, ex: _Exchange) -> tuple[str | None, str | None]:
        named = ex.headers.get(SESSION_HEADER) or None
        user = ex.request.get("user") if ex.request else None
        return named, user if isinstance(user, str) and user else None

    def _failure(self, ex: _Exchange, reason: str) -> None:
        if self.recorder is None or ex.endpoint is None:
            return
        named, user = self._session_of(ex)
        self.recorder.take(Failed(reason, ex.upstream.url, named, user))

    def _abandoned(self, ex: _Exchange) -> None:
        self._failure(ex, f"abandoned by the client after {ex.chunks_sent} chunks (the upstream request was closed)")

    def _record_later(self, ex: _Exchange, raw: bytes, *, stream: bool) -> None:
        """Hand the finished exchange over as the bytes that came in (the client has every one of them)."""
        if self.recorder is None or ex.request is None or ex.endpoint is None:
            return
        named, user = self._session_of(ex)
        up = ex.upstream
        self.recorder.take(
            Finished(
                ex.endpoint,
                up.kind,
                up.url,
                up.stamp,
                up.max_model_len,
                ex.request,
                self._stored_request(ex),
                raw,
                stream,
                time.perf_counter() - ex.started,
                named,
                user,
            )
        )

    def _stored_request(self, ex: _Exchange) -> dict[str, Any]:
        headers = {k: v for k, v in ex.headers.items() if k in STORED_HEADERS}
        return {
            "method": ex.method,
            "url": ex.upstream.url + ex.path,
            "headers": headers,
            "body": ex.request,
            "injected": list(ex.injection.fields) if ex.injection else [],
        }


# -- ASGI plumbing -------------------------------------------------------------------------------------
async def _read_body(receive: Receive) -> bytes | None:
    parts = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(parts)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _response_headers(response: httpx.Response, length: int | None, keep_length: bool) -> list[tuple[bytes, bytes]]:
    out = []
    for k, v in response.headers.raw:
        name = k.lower()
        if name in (b"content-length", b"transfer-encoding", b"connection", b"keep-alive") and not (
            keep_length and name == b"content-length"
        ):
            continue
        out.append((name, v))
    if length is not None:
        out.append((b"content-length", str(length).encode()))
    return out


async def _start(send: Send, response: httpx.Response, length: int | None, keep_length: bool = False) -> None:
    try:
        await send(
            {
                "type": "http.response.start",
                "status": response.status_code,
                "headers": _response_headers(response, length, keep_length),
            }
        )
    except OSError as exc:
        raise Abandoned() from exc


async def _send_body(send: Send, body: bytes, more: bool) -> None:
    try:
        await send({"type": "http.response.body", "body": body, "more_body": more})
    except OSError as exc:  # uvicorn's ClientDisconnected
        raise Abandoned() from exc


async def _json_error(send: Send, status: int, message: str) -> None:
    body = orjson.dumps({"error": {"message": message, "type": "tokview_proxy", "code": status}})
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
