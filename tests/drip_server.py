"""A misbehaving proxy in front of a real server, for the deadline and size-limit tests (a helper, no tests).

`serve_proxy(upstream, misbehave)` forwards every request to `upstream` (the simulator) and answers with
what it said, except the requests `misbehave` picks: those get an answer of its own making, streamed by
Starlette: one byte every few tenths of a second (a server that is alive but never finishes) or a body
larger than any answer should be. Probes and info requests pass through untouched, so tokview starts
as it would against the real server and meets the fault on its captures or scoring requests.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from loopback import serve_asgi
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

Misbehave = Callable[[str, Any], Response | None]
"""(path, parsed JSON body or None) -> the answer to send instead of the upstream's, or None to forward."""


@dataclass
class Served:
    """What the proxy's own answers did: bytes sent and whether the client stopped reading."""

    sent: list[int] = field(default_factory=list)
    hung_up: list[bool] = field(default_factory=list)


def is_generation(path: str, body: Any) -> bool:
    """A batch capture (more than the probe's one token) or a scoring request (prompt_logprobs)."""
    if not isinstance(body, dict):
        return False
    if "prompt_logprobs" in body:
        return True
    wanted = body.get("max_tokens", body.get("max_completion_tokens"))
    params = body.get("sampling_params")
    if isinstance(params, dict):
        wanted = params.get("max_new_tokens", wanted)
        if params.get("max_new_tokens") == 0:  # SGLang scoring
            return True
    return isinstance(wanted, int) and wanted > 1


def drip(served: Served, every: float, head: bytes = b'{"choices": [') -> StreamingResponse:
    """A 200 whose body starts like JSON and then gains one byte every `every` seconds, forever."""

    async def body() -> AsyncIterator[bytes]:
        sent = 0
        served.sent.append(0)
        try:
            for byte in head:
                yield bytes([byte])
                sent += 1
                served.sent[-1] = sent
                await asyncio.sleep(every)
            while True:
                yield b" "
                sent += 1
                served.sent[-1] = sent
                await asyncio.sleep(every)
        finally:
            served.hung_up.append(True)

    return StreamingResponse(body(), media_type="application/json")


def flood(served: Served, size: int, *, framed: bool, piece: int = 1 << 20) -> Response:
    """A 200 of `size` bytes of one JSON string, streamed in 1 MiB pieces: with a content-length
    (`framed`) or chunked. `served.sent` counts what left before the client stopped reading."""

    async def body() -> AsyncIterator[bytes]:
        served.sent.append(0)
        done = 0
        try:
            yield b'{"x": "'
            while done < size - 9:
                n = min(piece, size - 9 - done)
                yield b"a" * n
                done += n
                served.sent[-1] = done
                await asyncio.sleep(0.005)  # time for Starlette to notice a client that hung up
            yield b'"}'
        finally:
            served.hung_up.append(done < size - 9)

    headers = {"content-length": str(size)} if framed else None
    return StreamingResponse(body(), media_type="application/json", headers=headers)


@contextmanager
def serve_proxy(upstream: str, misbehave: Misbehave) -> Iterator[str]:
    """The proxy's base URL; requests `misbehave` leaves alone go to `upstream` and back unchanged."""
    client = httpx.AsyncClient(base_url=upstream, timeout=30)

    async def endpoint(request: Request) -> Response:
        raw = await request.body()
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = None
        own = misbehave(request.url.path, parsed)
        if own is not None:
            return own
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "accept", "authorization")}
        answer = await client.request(request.method, request.url.path, content=raw, headers=headers)
        keep = {k: v for k, v in answer.headers.items() if k.lower() in ("content-type", "retry-after")}
        return Response(answer.content, status_code=answer.status_code, headers=keep)

    app = Starlette(routes=[Route("/{path:path}", endpoint, methods=["GET", "POST"])])
    with serve_asgi(app) as url:
        yield url
