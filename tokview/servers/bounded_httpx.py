"""An httpx transport that gives every request a deadline and every answer a size limit.

httpx's timeouts limit each read: a server that sends a byte every few seconds holds a request (and a
stream) forever, and nothing limits how many bytes an answer may hold. `servers/http.py` wraps its
httpx transport in `BoundedTransport`, so the requests it sends through httpx (https, proxies, SSE
streams, health checks) end like the small transport's: `timeout` seconds after they start, headers and
body, streamed or not, and as soon as the body passes `max_body` bytes (at once when its content-length
says so). A redirect's Location is percent-encoded where it is not printable ASCII, as the small transport's
is (`servers/http.py` decides whether to follow it). Imported only when httpx is (see `ServerClient.http`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx

from tokview.servers.transport import ResponseTooLarge, quoted_location


class BodyTooLarge(httpx.ReadError, ResponseTooLarge):
    """`ResponseTooLarge` for httpx's callers: also an httpx.TransportError, which they already catch."""

    def __init__(self, limit: int, size: int | None, request: httpx.Request) -> None:
        ResponseTooLarge.__init__(self, limit, size)
        self.request = request  # httpx.RequestError's attribute, set without its __init__


def timed_out(timeout: float, request: httpx.Request) -> httpx.ReadTimeout:
    return httpx.ReadTimeout(f"no complete answer within {timeout:g}s", request=request)


class _BoundedStream(httpx.AsyncByteStream):
    def __init__(
        self, inner: httpx.AsyncByteStream, request: httpx.Request, deadline: float, timeout: float, limit: int
    ) -> None:
        self.inner, self.request = inner, request
        self.deadline, self.timeout, self.limit = deadline, timeout, limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = self.inner.__aiter__()
        read = 0
        while True:
            try:
                async with asyncio.timeout_at(self.deadline):
                    chunk = await chunks.__anext__()
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise timed_out(self.timeout, self.request) from None
            read += len(chunk)
            if read > self.limit:
                raise BodyTooLarge(self.limit, None, self.request)
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class BoundedTransport(httpx.AsyncBaseTransport):
    """`inner`'s requests, each failing `timeout` seconds after it started or past `max_body` bytes."""

    def __init__(self, inner: httpx.AsyncBaseTransport, *, timeout: float, max_body: int) -> None:
        self.inner, self.timeout, self.max_body = inner, timeout, max_body

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        deadline = asyncio.get_running_loop().time() + self.timeout
        try:
            async with asyncio.timeout_at(deadline):
                response = await self.inner.handle_async_request(request)
        except TimeoutError:
            raise timed_out(self.timeout, request) from None
        size = _announced_length(response)
        if size is not None and size > self.max_body:
            await response.aclose()
            raise BodyTooLarge(self.max_body, size, request)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        stream = _BoundedStream(response.stream, request, deadline, self.timeout, self.max_body)
        headers = response.headers
        if "location" in headers:  # httpx fails a redirect whose Location it cannot parse as "connection lost"
            headers = headers.copy()
            headers["location"] = quoted_location(headers["location"])
        return httpx.Response(response.status_code, headers=headers, stream=stream, extensions=response.extensions)

    async def aclose(self) -> None:
        await self.inner.aclose()


def _announced_length(response: httpx.Response) -> int | None:
    try:
        return int(response.headers.get("content-length", "").split(",")[0])
    except ValueError:
        return None
