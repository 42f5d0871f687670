"""A streaming client that closes its connection once it has read `data: [DONE]` got its whole answer: the proxy
records that generation as a sample, not as abandoned, even when the upstream's end of the stream (the last,
empty chunk of its chunked body) comes a moment later. The `openai` client does exactly this, and on real vLLM
one request in nine of the agent harness was stored as "abandoned by the client"."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from test_proxy_sim import QUESTION, _failures, _stored

from tokview.proxy.serve import ProxyConfig, start_proxy
from tokview.sim.config import SimConfig
from tokview.sim.server import start_simulator

END_DELAY_S = 0.4


def _slow_ending(sim_url: str) -> Any:
    """An upstream that relays the simulator's stream as it is, then waits before ending its body."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        async with httpx.AsyncClient() as client:
            answer = await client.post(
                sim_url + scope["path"], content=body, headers={"content-type": "application/json"}
            )
        headers = [(b"content-type", answer.headers["content-type"].encode())]
        await send({"type": "http.response.start", "status": answer.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": answer.content, "more_body": True})
        await asyncio.sleep(END_DELAY_S)
        await send({"type": "http.response.body", "body": b""})

    return app


@pytest.fixture
def slow_upstream() -> Iterator[str]:
    with start_simulator(SimConfig(kind="vllm")) as sim:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        server = uvicorn.Server(uvicorn.Config(_slow_ending(sim.url), log_level="error", lifespan="off"))
        threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
        while not server.started:
            time.sleep(0.005)
        try:
            yield f"http://127.0.0.1:{sock.getsockname()[1]}"
        finally:
            server.should_exit = True


def test_a_client_gone_after_done_leaves_a_sample_not_an_abandoned_request(
    slow_upstream, tmp_path, kimi_tok, kimi_profile
) -> None:
    db = str(tmp_path / "p.duckdb")
    config = ProxyConfig([slow_upstream], listen="127.0.0.1:0", db=db, tokenizer=kimi_tok, profile=kimi_profile)
    body = {"model": SimConfig().model_name, "messages": QUESTION, "max_tokens": 40, "temperature": 0, "stream": True}
    with start_proxy(config) as proxy, httpx.Client() as client:
        with client.stream("POST", proxy.url + "/v1/chat/completions", json=body) as answer:
            for line in answer.iter_lines():
                if line == "data: [DONE]":
                    break  # as the openai client does: the answer is whole, the connection is let go
        time.sleep(END_DELAY_S * 2)
    assert _failures(db) == []
    assert len(_stored(db)) == 1
