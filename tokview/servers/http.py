"""One server's HTTP connection: JSON requests and SSE streams, each one attempt, classified.

Every failure is turned into either `Retryable` (connection errors, timeouts, 408/409/425/429/5xx,
malformed bodies) or `CaptureFailed` (any other status, with the server's own message), so the
pool's retry loop never has to look at transport exceptions.

Two transports: JSON requests to a plain `http://` server with no proxy in the environment (a
batch's thousands of captures) go over `transport.HTTPPool`, a small keep-alive client that costs
a fraction of httpx's per-request Python; `https://`, proxies and SSE streams use httpx, created on
first use (so a batch that never needs it never imports it). Bodies are encoded and decoded with
orjson (a 2,000-id answer parses ~10x faster than with `json`), falling back to `json` for what
orjson refuses (NaN, integers beyond 64 bits).

Redirects, the same through both transports (`ServerClient._redirect_target`): a 307 or 308 on the
server the user gave (same scheme, host and port: FastAPI's trailing-slash redirect, a gateway moving a
path) is followed with the same method and body, at most `MAX_REDIRECTS` times, and the redirects of one
request together get one more `timeout`; a GET follows a 301/302/303 on that server too. Everything else
fails at once, as a `CaptureFailed` naming the status and the Location: a redirect to another server (the
request carries the user's credentials, which must never leave the server they were given for; pointing
`--server` at the other one is the user's decision), a 301/302/303 of a POST (a client would re-send it as
a GET without its body: never what a generation request means), a redirect without a Location, and a
loop. Asking again would be redirected again, so none of these is retried.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import itertools
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urljoin, urlsplit

import orjson

from tokview.errors import UserError
from tokview.response_size import MAX_RESPONSE_ENV, max_response_bytes
from tokview.secrets import API_KEY_ENV, Secrets, api_key_from_env, check_header_value, redact_url
from tokview.servers import transport
from tokview.servers.codings import UnreadableCoding
from tokview.servers.errors import CaptureFailed, Retryable, error_message, stream_abort
from tokview.servers.urls import credential_notes, parse_server_url
from tokview.untrusted_text import printable_line

if TYPE_CHECKING:
    from types import TracebackType

    import httpx

    Answer = httpx.Response | transport.Response
    """What `_request` returns: the two have the same attribute names (status_code, headers, content)."""

CONNECTION_LOST = "connection lost during"
"""How a request's failure begins when no whole HTTP answer came (the connection closed, or the bytes were not
HTTP): `features.detect` tells a port that never answered HTTP by it."""
RETRY_STATUSES = frozenset({408, 409, 425, 429})
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
KEEPS_METHOD = frozenset({307, 308})
"""The redirects that keep the method and body; a client turns a POST into a bodiless GET on the others."""
MAX_REDIRECTS = 5
"""Redirects followed for one request: a gateway moving a path needs one or two; more is a loop."""
JSON_HEADERS = {"content-type": "application/json", "accept": "application/json"}
_JSON_BLOCK = transport.header_block(JSON_HEADERS)
USER_AGENT = "tokview"
PROXY_VARIABLES = ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY")
REQUEST_SENT: ContextVar[Callable[[], None] | None] = ContextVar("tokview_request_sent", default=None)
"""Called as each request made in this context goes out (`ServerPool.capture` sets it for a capture's
requests: a `--workers` batch spawns its children once its first generation is in flight). Over the fast
transport once the request's bytes are in the socket; over httpx just before it connects and sends."""


def dumps(body: object) -> bytes:
    """A request body as JSON bytes (orjson; `json` for what it refuses, e.g. integers beyond 64 bits)."""
    try:
        return orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        return json.dumps(body).encode()


def loads(data: bytes | str) -> Any:
    """A response body parsed as JSON; ValueError when it is not JSON, or nested deeper than Python's json reads (a
    RecursionError, which is no ValueError, failed the whole run)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(data)  # NaN / Infinity / huge integers, which Python's json accepts
    except RecursionError:
        raise ValueError("JSON nested too deeply to parse") from None


def plain_http_origin(url: str) -> tuple[str, int, str] | None:
    """(host, port, path prefix) when the small transport may serve `url`: plain http, no proxy set."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or any(os.environ.get(v) for v in PROXY_VARIABLES):
        return None
    return parts.hostname, parts.port or 80, parts.path.rstrip("/")


def is_retry_status(status: int) -> bool:
    return status in RETRY_STATUSES or 500 <= status <= 599


def parse_retry_after(value: str | None) -> float | None:
    """`Retry-After` as seconds (it may be a number of seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class ServerClient:
    """HTTP to one server URL (see the module docstring for its two transports), with tokview's failure
    classification."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 60.0,
        concurrency: int = 8,
        api_key: str | None = None,
        connect_timeout: float | None = None,
        fast: bool = True,
    ) -> None:
        """`url` may carry `user:password@` (sent as Basic auth, never kept in `self.url`); the API key
        defaults to `TOKVIEW_API_KEY` from the environment. Raises ValueError for a bad URL.
        `fast=False` sends everything through httpx (tests compare the two transports)."""
        parts = parse_server_url(url)
        self.url = parts.url
        self.timeout = timeout
        api_key = api_key if api_key is not None else api_key_from_env()
        self.notes = (*parts.notes, *credential_notes(parts, api_key))
        self.secrets = Secrets.for_server(parts, api_key)
        # one Authorization header per request: the URL's user:password wins (see credential_notes)
        self.headers = {"user-agent": USER_AGENT}
        """What every request carries besides its authorization (recorded in each stored request)."""
        self._auth_header: dict[str, str] = {}
        if parts.auth is not None:
            pair = f"{parts.auth[0]}:{parts.auth[1]}".encode()
            self._auth_header = {"authorization": "Basic " + base64.b64encode(pair).decode("ascii")}
        elif api_key:
            try:
                check_header_value(api_key, API_KEY_ENV)
            except ValueError as exc:  # the user's to fix, said before any request goes out
                raise UserError(str(exc)) from None
            self._auth_header = {"authorization": f"Bearer {api_key}"}
        self._concurrency = concurrency
        self._connect_timeout = connect_timeout or min(timeout, 10.0)
        self.max_body = max_response_bytes()
        self._http: httpx.AsyncClient | None = None
        origin = plain_http_origin(self.url) if fast else None
        self._prefix = origin[2] if origin else ""
        self._fast = (
            transport.HTTPPool(
                origin[0],
                origin[1],
                max_connections=concurrency,
                timeout=timeout,
                connect_timeout=self._connect_timeout,
                headers={**self.headers, **self._auth_header},
                max_body=self.max_body,
            )
            if origin
            else None
        )

    @property
    def http(self) -> httpx.AsyncClient:
        """The httpx client (https, proxies, streams, health checks), made on first use."""
        if self._http is None:
            import httpx

            from tokview.servers.bounded_httpx import BoundedTransport

            inner = httpx.AsyncHTTPTransport(retries=0)
            self._http = httpx.AsyncClient(
                base_url=self.url,
                headers={**self.headers, **self._auth_header},
                timeout=httpx.Timeout(self.timeout, connect=self._connect_timeout),
                limits=httpx.Limits(max_connections=self._concurrency, max_keepalive_connections=self._concurrency),
                transport=BoundedTransport(inner, timeout=self.timeout, max_body=self.max_body),
                event_hooks={"request": [_tell_sent]},
            )
        return self._http

    async def aclose(self) -> None:
        if self._fast is not None:
            await self._fast.aclose()
        if self._http is not None:
            await self._http.aclose()

    def audit_request(self, method: str, path: str, body: object = None) -> dict[str, Any]:
        """The request as it will be stored: never the Authorization header."""
        headers = dict(self.headers)
        if body is not None:
            headers.update(JSON_HEADERS)
        return {"method": method, "url": self.url + path, "headers": headers, "body": body}

    # -- one attempt ---------------------------------------------------------------------
    async def get_json(self, path: str) -> Any:
        """GET returning parsed JSON; raises Retryable / CaptureFailed like a POST."""
        with self._classify("GET", path):
            return self._json_of(await self._request("GET", path), "GET", path)

    async def post_json(self, path: str, body: dict[str, Any]) -> Any:
        with self._classify("POST", path):
            return self._json_of(await self._request("POST", path, dumps(body)), "POST", path)

    async def _request(self, method: str, path: str, body: bytes | None = None) -> Answer:
        """One GET or POST and the redirects it is allowed to follow (module docstring)."""
        response = await self._send(method, path, body)
        url, deadline = self.url + path, None
        for hops in itertools.count():
            target = self._redirect_target(response, method, path, url, hops)
            if target is None:
                return response
            url = target
            loop = asyncio.get_running_loop()
            deadline = deadline if deadline is not None else loop.time() + self.timeout
            try:
                async with asyncio.timeout_at(deadline):
                    response = await self._send(method, url, body)
            except TimeoutError:
                raise transport.TimedOut(f"no complete answer within {self.timeout:g}s") from None
        raise AssertionError("unreachable")

    async def _send(self, method: str, target: str, body: bytes | None) -> Answer:
        """`target`: a path under the server URL, or an absolute URL on the same server (a redirect's).
        Returns an httpx.Response or a transport.Response (same attribute names)."""
        if self._fast is not None:
            on_wire = self._prefix + target if target.startswith("/") else _path_and_query(target)
            headers = _JSON_BLOCK if method == "POST" else b""
            return await self._fast.request(method, on_wire, body, headers, REQUEST_SENT.get())
        if method == "POST":
            return await self.http.post(target, content=body, headers=JSON_HEADERS)
        return await self.http.get(target)  # an absolute URL replaces the client's base URL

    async def stream_sse(self, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """POST and yield each SSE `data:` JSON object until `[DONE]`.

        A chunk holding `{"error": …}` ends the capture (the server gave up on this request);
        a stream that closes without `[DONE]` or carries non-JSON is retried as malformed.
        """
        with self._classify("POST", path):
            async with self._open_stream(path, body) as response:
                done = False
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        done = True
                        break
                    try:
                        chunk = loads(payload)
                    except ValueError:
                        raise Retryable(
                            f"malformed response from POST {path}: a stream chunk is not JSON ({payload[:80]!r})"
                        ) from None
                    if not isinstance(chunk, dict):
                        raise Retryable(f"malformed response from POST {path}: a stream chunk is not an object")
                    if (aborted := stream_abort(chunk)) is not None:
                        raise CaptureFailed(f"the server aborted the stream on POST {path}: {aborted}", url=self.url)
                    yield chunk
                if not done:
                    raise Retryable(f"malformed response from POST {path}: the stream ended without [DONE]")

    @asynccontextmanager
    async def _open_stream(self, path: str, body: dict[str, Any]) -> AsyncIterator[httpx.Response]:
        """The stream's answer once it is a 200, after the redirects it may follow (each within `timeout`)."""
        headers = {**JSON_HEADERS, "accept": "text/event-stream"}
        content = dumps(body)
        url, target = self.url + path, path
        for hops in itertools.count():
            async with self.http.stream("POST", target, content=content, headers=headers) as response:
                following = None
                if response.status_code != 200:
                    await response.aread()
                    following = self._redirect_target(response, "POST", path, url, hops)
                    if following is None:
                        self._raise_for_status(response, "POST", path)
                if following is None:
                    yield response
                    return
            url = target = following

    # -- classification --------------------------------------------------------------------
    def _classify(self, method: str, path: str) -> _Classifier:
        return _Classifier(self, method, path)

    def _json_of(self, response: Answer, method: str, path: str) -> Any:
        """The body of an httpx.Response or a transport.Response (same attribute names) as JSON."""
        self._raise_for_status(response, method, path)
        try:
            return loads(response.content)
        except ValueError:
            snippet = " ".join(response.content.decode("utf-8", "replace").split())[:80]
            raise Retryable(f"malformed response from {method} {path}: not JSON ({snippet!r})") from None

    def _redirect_target(self, response: Answer, method: str, path: str, url: str, hops: int) -> str | None:
        """None when `response` (the answer to `url`) is no redirect; the absolute URL to ask next when it is
        one to follow (same server, method kept, fewer than MAX_REDIRECTS so far); CaptureFailed naming the
        redirect and its Location otherwise (module docstring)."""
        status = response.status_code
        if status not in REDIRECT_STATUSES:
            return None
        said = f"HTTP {status} from {method} {path}"
        location = transport.quoted_location(response.headers.get("location", "").strip())
        if not location:
            raise CaptureFailed(
                f"{said}: a redirect without a Location (is --server the server itself?)", status=status
            )
        target = urljoin(url, location)
        shown = printable_line(redact_url(target))[:300]
        if not _same_origin(target, self.url):
            raise CaptureFailed(
                f"{said}: redirected to another server, {shown}, where tokview does not follow (the request "
                f"carries this server's credentials); pass --server {_origin(target)} if that is the server meant",
                status=status,
                url=self.url,
            )
        if status not in KEEPS_METHOD and method != "GET":
            raise CaptureFailed(
                f"{said}: redirected to {shown} as a GET without the request's body (only a 307 or 308 keeps "
                "a POST): point --server at the server itself",
                status=status,
                url=self.url,
            )
        if hops >= MAX_REDIRECTS:
            raise CaptureFailed(
                f"{said}: still redirected after {MAX_REDIRECTS} redirects (a loop?), the last to {shown}",
                status=status,
                url=self.url,
            )
        return target

    def _raise_for_status(self, response: Answer, method: str, path: str) -> None:
        status = response.status_code
        if status < 400:
            return
        message = error_message(response.content)
        reason = f"HTTP {status} from {method} {path}: {message}"
        if is_retry_status(status):
            raise Retryable(reason, status=status, retry_after=parse_retry_after(response.headers.get("retry-after")))
        raise CaptureFailed(reason, status=status, url=self.url)


async def _tell_sent(_request: object) -> None:
    """httpx's request hook, run in the task that sends (so it sees that task's `REQUEST_SENT`)."""
    on_sent = REQUEST_SENT.get()
    if on_sent is not None:
        on_sent()


def _origin_parts(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    try:
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:  # a port that is no number: no origin anything shares
        port = -1
    return parts.scheme.lower(), (parts.hostname or "").lower(), port


def _same_origin(url: str, server_url: str) -> bool:
    """Same scheme, host and port: where the server's credentials may go."""
    return _origin_parts(url) == _origin_parts(server_url)


def _origin(url: str) -> str:
    """`scheme://host:port` of `url`, without any `user:password@`, printable."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return printable_line(f"{parts.scheme}://{host}")[:200]


def _path_and_query(url: str) -> str:
    parts = urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


class _Classifier:
    """Context manager mapping httpx transport errors to Retryable with a readable reason, and masking
    the API key and URL credentials in every reason raised inside it (a 401 body may echo the key)."""

    def __init__(self, client: ServerClient, method: str, path: str) -> None:
        self.client, self.method, self.path = client, method, path

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        if exc is None:
            return False
        if isinstance(exc, (CaptureFailed, Retryable)):
            scrub_reason(exc, self.client.secrets)
            return False
        where = f"{self.method} {self.client.url}{self.path}"
        scrub = self.client.secrets.scrub
        if isinstance(exc, transport.ResponseTooLarge):  # asking again would read as much again
            raise CaptureFailed(
                f"the answer to {self.method} {self.path} was not read further: {exc} "
                f"({MAX_RESPONSE_ENV}, in MiB, allows larger answers)",
                url=self.client.url,
            ) from None
        if isinstance(exc, UnreadableCoding):  # asking again would be answered the same way
            raise CaptureFailed(f"{exc} ({self.method} {self.path})", url=self.client.url) from None
        if isinstance(exc, transport.TransportError):  # the small transport's three kinds
            if isinstance(exc, transport.ConnectFailed):
                raise Retryable(
                    scrub(f"cannot connect to {self.client.url} (ConnectError: {exc or 'refused'})"), connection=True
                ) from None
            if isinstance(exc, transport.TimedOut):
                raise Retryable(
                    f"timed out after {self.client.timeout:g}s waiting for {where}", timed_out=True
                ) from None
            raise Retryable(scrub(f"{CONNECTION_LOST} {where} (ConnectionLost: {exc or 'closed'})")) from None
        httpx = sys.modules.get("httpx")  # only httpx itself can have raised its exceptions
        if isinstance(exc, OverflowError) or (
            httpx is not None and isinstance(exc, (httpx.InvalidURL, httpx.UnsupportedProtocol))
        ):
            raise CaptureFailed(
                f"bad server URL {self.client.url}: {type(exc).__name__}: {exc}", url=self.client.url
            ) from None
        if httpx is None or not isinstance(exc, httpx.TransportError):
            return False
        if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
            raise Retryable(
                scrub(f"cannot connect to {self.client.url} ({type(exc).__name__}: {exc or 'refused'})"),
                connection=True,
            ) from None
        if isinstance(exc, httpx.TimeoutException):
            raise Retryable(f"timed out after {self.client.timeout:g}s waiting for {where}", timed_out=True) from None
        raise Retryable(scrub(f"{CONNECTION_LOST} {where} ({type(exc).__name__}: {exc or 'closed'})")) from None


def scrub_reason(exc: CaptureFailed | Retryable, secrets: Secrets) -> None:
    """Mask secrets in an exception's reason in place, so whoever stores or prints it sees none."""
    exc.reason = secrets.scrub(exc.reason)
    exc.args = (exc.reason,)
    if isinstance(exc, CaptureFailed):
        exc.message = exc.reason  # what the CLI prints and the app notifies
