"""A gate in front of the simulator: real generations past the first `free` wait until the test opens it.

What the landing tests need: a run with one answer in and the rest in flight, held there for as long as
the test looks (no sleeps, no timing). Probes (max_tokens ≤ 16) and every other path pass straight
through."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
from loopback import serve_asgi

GENERATION_PATHS = {"/v1/completions", "/v1/chat/completions", "/generate"}


class Gate:
    def __init__(self, upstream: str, free: int, close: bool = False) -> None:
        self.upstream, self.free, self.close = upstream, free, close
        self.opened = threading.Event()
        self.real = 0
        """Real generation requests received."""
        self.answered = 0
        """Real generations answered upstream (and about to be sent back)."""

    def open(self) -> None:
        self.opened.set()

    async def handle(self, scope, receive, send) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        real = scope["path"] in GENERATION_PATHS and _max_tokens(body) > 16
        if real:
            self.real += 1
            if self.real > self.free:
                await asyncio.to_thread(self.opened.wait, 60)
        headers = {k.decode(): v.decode() for k, v in scope["headers"] if k.decode() in ("content-type", "accept")}
        async with httpx.AsyncClient(timeout=60) as client:
            r = await client.request(scope["method"], self.upstream + scope["path"], content=body, headers=headers)
        if real:
            self.answered += 1
        out = [(b"content-type", r.headers.get("content-type", "application/json").encode())]
        if self.close:  # no kept-alive connection: each request connects first
            out.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": r.status_code, "headers": out})
        await send({"type": "http.response.body", "body": r.content})


def _max_tokens(body: bytes) -> int:
    try:
        payload = json.loads(body or b"{}")
    except ValueError:
        return 0
    value = payload.get("max_tokens") or payload.get("max_completion_tokens") or 0
    if not value and isinstance(payload.get("sampling_params"), dict):
        value = payload["sampling_params"].get("max_new_tokens") or 0
    return int(value)


@contextmanager
def gated(upstream: str, free: int = 1, close: bool = False) -> Iterator[tuple[str, Gate]]:
    """`close`: every answer closes its connection (a client must connect before each request)."""
    gate = Gate(upstream, free, close)

    async def app(scope, receive, send) -> None:  # a plain function: uvicorn takes a bound method for ASGI2
        await gate.handle(scope, receive, send)

    with serve_asgi(app) as url:
        try:
            yield url, gate
        finally:
            gate.open()  # before the server stops: it waits for the requests it holds
