"""One server's HTTP connection: JSON requests and SSE streams, each one attempt, classified.

Every failure is turned into either `Retryable` (connection errors, timeouts, 408/409/425/429/5xx,
malformed bodies) or `CaptureFailed` (any other status, with the server's own message), so the
pool's retry loop never has to look at httpx exceptions. Timeouts, connection limits and the
transport are httpx's own; nothing here re-implements them.
"""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from tokview.servers.errors import CaptureFailed, Retryable
from tokview.servers.urls import Secrets, api_key_from_env, credential_notes, parse_server_url

RETRY_STATUSES = frozenset({408, 409, 425, 429})
JSON_HEADERS = {"content-type": "application/json", "accept": "application/json"}


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


def error_message(body: bytes | str, limit: int = 300) -> str:
    """The server's own error message out of whatever shape it used (OpenAI, FastAPI, plain text)."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        data = json.loads(text)
    except ValueError:
        return " ".join(text.split())[:limit] or "(empty body)"
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:limit]
        for key in ("message", "detail", "error"):
            if data.get(key):
                value = data[key]
                return (value if isinstance(value, str) else json.dumps(value))[:limit]
    return json.dumps(data)[:limit]


class ServerClient:
    """An httpx.AsyncClient bound to one server URL, with tokview's failure classification."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 60.0,
        concurrency: int = 8,
        api_key: str | None = None,
        connect_timeout: float | None = None,
    ) -> None:
        """`url` may carry `user:password@` (sent as Basic auth, never kept in `self.url`); the API key
        defaults to `TOKVIEW_API_KEY` from the environment. Raises ValueError for a bad URL."""
        parts = parse_server_url(url)
        self.url = parts.url
        self.timeout = timeout
        api_key = api_key if api_key is not None else api_key_from_env()
        self.notes = (*parts.notes, *credential_notes(parts, api_key))
        self.secrets = Secrets.for_server(parts, api_key)
        # one Authorization header per request: the URL's user:password wins (see credential_notes)
        headers = {"authorization": f"Bearer {api_key}"} if api_key and parts.auth is None else {}
        self.http = httpx.AsyncClient(
            base_url=self.url,
            headers=headers,
            auth=httpx.BasicAuth(*parts.auth) if parts.auth else None,
            timeout=httpx.Timeout(timeout, connect=connect_timeout or min(timeout, 10.0)),
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
            transport=httpx.AsyncHTTPTransport(retries=0),
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    def audit_request(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        """The request as it will be stored: never the Authorization header."""
        headers = {k: v for k, v in self.http.headers.items() if k.lower() != "authorization"}
        if body is not None:
            headers.update(JSON_HEADERS)
        return {"method": method, "url": self.url + path, "headers": headers, "body": body}

    # -- one attempt ---------------------------------------------------------------------
    async def get_json(self, path: str) -> Any:
        """GET returning parsed JSON; raises Retryable / CaptureFailed like a POST."""
        with self._classify("GET", path):
            response = await self.http.get(path)
            return self._json_of(response, "GET", path)

    async def post_json(self, path: str, body: dict[str, Any]) -> Any:
        with self._classify("POST", path):
            response = await self.http.post(path, content=json.dumps(body), headers=JSON_HEADERS)
            return self._json_of(response, "POST", path)

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
                        chunk = json.loads(payload)
                    except ValueError:
                        raise Retryable(
                            f"malformed response from POST {path}: a stream chunk is not JSON ({payload[:80]!r})"
                        ) from None
                    if not isinstance(chunk, dict):
                        raise Retryable(f"malformed response from POST {path}: a stream chunk is not an object")
                    if chunk.get("error") is not None and not chunk.get("choices"):
                        raise CaptureFailed(
                            f"the server aborted the stream on POST {path}: {error_message(json.dumps(chunk))}",
                            url=self.url,
                        )
                    yield chunk
                if not done:
                    raise Retryable(f"malformed response from POST {path}: the stream ended without [DONE]")

    @asynccontextmanager
    async def _open_stream(self, path: str, body: dict[str, Any]) -> AsyncIterator[httpx.Response]:
        headers = {**JSON_HEADERS, "accept": "text/event-stream"}
        async with self.http.stream("POST", path, content=json.dumps(body), headers=headers) as response:
            if response.status_code != 200:
                await response.aread()
                self._raise_for_status(response, "POST", path)
            yield response

    # -- classification --------------------------------------------------------------------
    def _classify(self, method: str, path: str) -> _Classifier:
        return _Classifier(self, method, path)

    def _json_of(self, response: httpx.Response, method: str, path: str) -> Any:
        self._raise_for_status(response, method, path)
        try:
            return response.json()
        except ValueError:
            snippet = " ".join(response.text.split())[:80]
            raise Retryable(f"malformed response from {method} {path}: not JSON ({snippet!r})") from None

    def _raise_for_status(self, response: httpx.Response, method: str, path: str) -> None:
        status = response.status_code
        if status < 400:
            return
        message = error_message(response.content)
        reason = f"HTTP {status} from {method} {path}: {message}"
        if is_retry_status(status):
            raise Retryable(reason, status=status, retry_after=parse_retry_after(response.headers.get("retry-after")))
        raise CaptureFailed(reason, status=status, url=self.url)


class _Classifier:
    """Context manager mapping httpx transport errors to Retryable with a readable reason, and masking
    the API key and URL credentials in every reason raised inside it (a 401 body may echo the key)."""

    def __init__(self, client: ServerClient, method: str, path: str) -> None:
        self.client, self.method, self.path = client, method, path

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool:
        if isinstance(exc, (CaptureFailed, Retryable)):
            scrub_reason(exc, self.client.secrets)
            return False
        if isinstance(exc, (httpx.InvalidURL, httpx.UnsupportedProtocol, OverflowError)):
            raise CaptureFailed(
                f"bad server URL {self.client.url}: {type(exc).__name__}: {exc}", url=self.client.url
            ) from None
        if exc is None or not isinstance(exc, httpx.TransportError):
            return False
        where = f"{self.method} {self.client.url}{self.path}"
        scrub = self.client.secrets.scrub
        if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
            raise Retryable(
                scrub(f"cannot connect to {self.client.url} ({type(exc).__name__}: {exc or 'refused'})"),
                connection=True,
            ) from None
        if isinstance(exc, httpx.TimeoutException):
            raise Retryable(f"timed out after {self.client.timeout:g}s waiting for {where}") from None
        raise Retryable(scrub(f"connection lost during {where} ({type(exc).__name__}: {exc or 'closed'})")) from None


def scrub_reason(exc: CaptureFailed | Retryable, secrets: Secrets) -> None:
    """Mask secrets in an exception's reason in place, so whoever stores or prints it sees none."""
    exc.reason = secrets.scrub(exc.reason)
    exc.args = (exc.reason,)
