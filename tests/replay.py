"""Real-server recordings replayed over a real socket: the scripted server and the routes shared by the
servers and batch tests (tests/recordings/ holds the verbatim bodies vLLM 0.32 and SGLang 0.5.23 sent).

A tiny Starlette app under uvicorn on 127.0.0.1 answers each path with the recorded body (or a
scripted fault), so the clients parse exactly the bytes the real servers sent.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from facts import KIMI_CHAIN_OUTPUT, KIMI_PROMPT_6X7
from facts import RECORDINGS as REC
from loopback import serve_asgi
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tokview.core.profiles import get_profile
from tokview.servers import CaptureRequest, ServerPool

PROMPT = KIMI_PROMPT_6X7
OUTPUT = KIMI_CHAIN_OUTPUT
MESSAGES = [{"role": "user", "content": "What is 6 times 7?"}]


def rec(name: str) -> Any:
    text = (REC / name).read_text()
    return text if name.endswith(".txt") else json.loads(text)


class Replay:
    """path → list of scripted answers (used in order; the last one repeats).

    An answer is a dict: {"json": obj} | {"sse": [lines]} | {"status": n, "json"/"text": …,
    "headers": {…}} | {"stall": seconds}. Every request body is kept in `seen`.
    """

    def __init__(self, routes: dict[str, list[dict[str, Any]]]) -> None:
        self.routes = routes
        self.seen: list[tuple[str, Any, dict[str, str]]] = []
        self.counts: dict[str, int] = {}

    async def handle(self, request: Request) -> Response:
        path = request.url.path
        body = await request.body()
        self.seen.append((path, json.loads(body) if body else None, dict(request.headers)))
        script = self.routes.get(path)
        if not script:
            return Response('{"detail":"Not Found"}', status_code=404, media_type="application/json")
        n = self.counts.get(path, 0)
        self.counts[path] = n + 1
        answer = script[min(n, len(script) - 1)]
        if "stall" in answer:
            await asyncio.sleep(answer["stall"])
        if "sse" in answer:

            async def gen() -> Any:
                for line in answer["sse"]:
                    yield line

            return StreamingResponse(gen(), media_type="text/event-stream")
        content = answer["text"] if "text" in answer else json.dumps(answer.get("json"))
        return Response(
            content, status_code=answer.get("status", 200), headers=answer.get("headers"), media_type="application/json"
        )


@contextmanager
def serve(replay: Replay) -> Iterator[str]:
    app = Starlette(routes=[Route("/{path:path}", replay.handle, methods=["GET", "POST"])])
    with serve_asgi(app) as url:
        yield url


def sglang_routes(**overrides: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    routes: dict[str, list[dict[str, Any]]] = {
        "/get_model_info": [{"json": {"model_path": "tiny-kimi", "is_generation": True}}],
        "/get_server_info": [{"json": {"version": "0.5.23"}}],
        "/v1/models": [{"json": {"object": "list", "data": [{"id": "tiny-kimi"}]}}],
        "/v1/chat/completions": [{"json": rec("sgl_chat_ns.json")}],
        "/generate": [{"json": rec("sgl_generate.json")}],
    }
    routes.update(overrides)
    return routes


def vllm_routes() -> dict[str, list[dict[str, Any]]]:
    comp = {
        "id": "cmpl-1",
        "object": "text_completion",
        "model": "tiny-kimi",
        "choices": [
            {
                "index": 0,
                "text": "Okay, let me think about this carefully.</think>The answer is forty-two!<|im_end|>",
                "finish_reason": "stop",
                "stop_reason": None,
                "prompt_token_ids": PROMPT,
                "token_ids": OUTPUT,
            }
        ],
        "usage": {"prompt_tokens": 28, "total_tokens": 46, "completion_tokens": 18},
    }
    return {
        "/version": [{"json": {"version": "0.32.0"}}],
        "/v1/models": [{"json": {"object": "list", "data": [{"id": "tiny-kimi", "max_model_len": 2048}]}}],
        "/v1/chat/completions": [{"json": rec("vllm_chat_kimi_k2.json")}],
        "/v1/completions": [{"json": comp}],
        "/tokenize": [{"json": {"count": 28, "tokens": PROMPT, "max_model_len": 2048}}],
    }


def stream_lines(name: str) -> list[str]:
    return [line + "\n\n" for line in rec(name).splitlines() if line.strip()]


def fast_pool(url: str | list[str], **kw: Any) -> ServerPool:
    kw.setdefault("profile", get_profile("kimi-k2.5"))
    kw.setdefault("timeout", 2.0)
    kw.setdefault("retries", 2)
    kw.setdefault("backoff", 0.01)
    return ServerPool(url, **kw)


def request(mode: str = "raw", stream: bool = False, **settings: Any) -> CaptureRequest:
    return CaptureRequest(
        messages=MESSAGES,
        prompt_ids=PROMPT if mode != "chat" else None,
        settings={"temperature": 0.0, "max_new_tokens": 64, "thinking": True, "seed": 7, **settings},
        mode=mode,
        stream=stream,
    )


# -- SGLang ---------------------------------------------------------------------------------
