"""An answer past `TOKVIEW_MAX_RESPONSE_MB` never grows the proxy without end.

The proxy held every streamed answer whole (for the recorder) and read every JSON answer whole, with no limit: a
looping model or an upstream that never stops sent it to 1 GB in 20 s, until the kernel killed it with every
answer in flight. Now a stream past the limit is forwarded on, no longer held, and recorded as a failure; a JSON
answer past it is a 502; an event that never ends is cut. A scripted upstream on a real socket."""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from loopback import serve_asgi

from tokview.proxy.serve import ProxyConfig, start_proxy
from tokview.store import Store

EVENTS = 60
EVENT_BYTES = 50_000  # 60 events of 50 kB: 3 MB, past a 1 MiB limit


def _text(i: int) -> str:
    """Text that compresses about as a model's does (gzipped, one read never inflates past the limit at once)."""
    return random.Random(i).randbytes(EVENT_BYTES // 2).hex()


def _event(i: int) -> bytes:
    chunk: dict[str, Any] = {
        "id": "c",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": _text(i)}, "finish_reason": None, "token_ids": [i]}],
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def _upstream(kind: str) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    async def info(request: Request) -> Response:
        if request.url.path == "/version":
            return JSONResponse({"version": "0.32.0"})
        return JSONResponse({"data": [{"id": "m", "max_model_len": 4096}]})

    async def chat(request: Request) -> Response:
        if kind == "json":
            body = {"choices": [{"message": {"content": "x" * 2_000_000}, "finish_reason": "stop"}]}
            return JSONResponse(body)

        async def events() -> Any:
            if kind == "endless_event":
                yield b"data: " + b"x" * 1000
                for _ in range(3000):  # 3 MB with no blank line
                    yield b"y" * 1000
                return
            for i in range(EVENTS):
                yield _event(i)
            yield b"data: [DONE]\n\n"

        async def gzipped() -> Any:  # a gateway's "gzip always", flushed event by event
            packer = zlib.compressobj(wbits=31)
            async for event in events():
                yield packer.compress(event) + packer.flush(zlib.Z_SYNC_FLUSH)
            yield packer.flush()

        if kind == "gzip_stream":
            headers = {"content-encoding": "gzip"}
            return StreamingResponse(gzipped(), media_type="text/event-stream", headers=headers)
        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(
        routes=[
            Route("/version", info),
            Route("/v1/models", info),
            Route("/v1/chat/completions", chat, methods=["POST"]),
        ]
    )


@pytest.fixture
def proxied(tmp_path, kimi_tok, kimi_profile, monkeypatch) -> Iterator[Any]:
    monkeypatch.setenv("TOKVIEW_MAX_RESPONSE_MB", "1")

    def start(kind: str) -> Any:
        return serve_asgi(_upstream(kind))

    yield start, tmp_path, kimi_tok, kimi_profile


def _run(proxied: Any, kind: str, stream: bool) -> tuple[Any, list[tuple[str]], int]:
    start, tmp_path, tok, profile = proxied
    db = tmp_path / f"{kind}.duckdb"
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    with start(kind) as url:
        config = ProxyConfig([url], listen="127.0.0.1:0", db=str(db), tokenizer=tok, profile=profile)
        with start_proxy(config) as proxy:
            try:
                got: Any = httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=30)
            except httpx.HTTPError as exc:  # the connection cut
                got = exc
    with Store(db) as store:
        return got, store.query("SELECT reason FROM failures"), store.query("SELECT count(*) FROM samples")[0][0]


@pytest.mark.parametrize("kind", ["stream", "gzip_stream"])
def test_a_stream_past_the_limit_is_forwarded_whole_and_recorded_as_a_failure(proxied, kind) -> None:
    """Gzipped too: its decoder counted the whole stream against the limit and cut the client mid-answer."""
    got, failures, samples = _run(proxied, kind, stream=True)
    assert got.status_code == 200
    assert got.content.count(b"data: ") == EVENTS + 1 and got.content.endswith(b"data: [DONE]\n\n")
    assert b'"token_ids":[' not in got.content  # the ids the proxy asked for are still taken out
    assert samples == 0
    (reason,) = [r for (r,) in failures]
    assert "passed 1 MiB (TOKVIEW_MAX_RESPONSE_MB): forwarded, not held" in reason


def test_a_json_answer_past_the_limit_is_a_502_and_a_failure(proxied) -> None:
    got, failures, samples = _run(proxied, "json", stream=False)
    assert got.status_code == 502 and "passed 1 MiB" in got.json()["error"]["message"]
    assert samples == 0 and len(failures) == 1 and "passed 1 MiB" in failures[0][0]


def test_an_event_that_never_ends_is_cut_past_the_limit(proxied) -> None:
    got, failures, samples = _run(proxied, "endless_event", stream=True)
    assert isinstance(got, httpx.HTTPError) or (got.status_code == 200 and b"[DONE]" not in got.content)
    assert samples == 0 and len(failures) == 1 and "without an end" in failures[0][0]
