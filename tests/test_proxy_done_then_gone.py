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
import orjson
import pytest
import uvicorn
from test_proxy_sim import QUESTION, _failures, _stored

from tokview.proxy.serve import ProxyConfig, start_proxy
from tokview.sim.config import SimConfig
from tokview.sim.server import start_simulator

END_DELAY_S = 0.4


def _relaying(sim_url: str, shape: str) -> Any:
    """An upstream that relays the simulator's stream, then waits before ending its body (`slow`); or with `[DONE]`
    written `data:[DONE]` (`nospace`); or with every blank line an LF CR LF (`lf-crlf`); or that closes its
    connection after `[DONE]` without ending its chunked body (`reset`)."""

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
        content = answer.content
        if shape == "nospace":
            content = content.replace(b"data: [DONE]", b"data:[DONE]")
        elif shape == "lf-crlf":
            content = content.replace(b"\n\n", b"\n\r\n")
        headers = [(b"content-type", answer.headers["content-type"].encode())]
        await send({"type": "http.response.start", "status": answer.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": content, "more_body": True})
        await asyncio.sleep(END_DELAY_S)
        if shape == "reset" and b"[DONE]" in content:
            raise RuntimeError("the upstream dies after [DONE]")  # uvicorn closes the connection mid-body
        await send({"type": "http.response.body", "body": b""})

    return app


def _serve(app: Any) -> tuple[str, uvicorn.Server]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="off"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.005)
    return f"http://127.0.0.1:{sock.getsockname()[1]}", server


@pytest.fixture
def sim_url() -> Iterator[str]:
    with start_simulator(SimConfig(kind="vllm")) as sim:
        yield sim.url


@pytest.fixture
def slow_upstream(sim_url: str) -> Iterator[str]:
    url, server = _serve(_relaying(sim_url, "slow"))
    try:
        yield url
    finally:
        server.should_exit = True


def _ask(upstream: str, db: str, kimi_tok: Any, kimi_profile: Any, *, leave_at_done: bool) -> list[bytes]:
    """One streamed chat through a proxy in front of `upstream`: the event lines the client read."""
    config = ProxyConfig([upstream], listen="127.0.0.1:0", db=db, tokenizer=kimi_tok, profile=kimi_profile)
    body = {"model": SimConfig().model_name, "messages": QUESTION, "max_tokens": 40, "temperature": 0, "stream": True}
    lines: list[bytes] = []
    with start_proxy(config) as proxy, httpx.Client() as client:
        try:
            with client.stream("POST", proxy.url + "/v1/chat/completions", json=body) as answer:
                for raw in answer.iter_bytes():
                    lines += [line for line in raw.splitlines() if line.startswith(b"data:")]
                    if leave_at_done and lines and lines[-1].replace(b" ", b"") == b"data:[DONE]":
                        break  # as the openai client does: the answer is whole, the connection is let go
        except httpx.HTTPError:
            pass  # `reset`: the upstream's cut reaches the client as a cut
        time.sleep(END_DELAY_S * 2)
    return lines


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


@pytest.mark.parametrize("shape", ["nospace", "lf-crlf", "reset"])
def test_an_answer_whose_done_reached_the_client_is_a_sample_whatever_its_framing(
    sim_url, tmp_path, kimi_tok, kimi_profile, shape
) -> None:
    """`data:[DONE]` (no space) then the client leaving was "abandoned"; blank lines written LF CR LF were never
    split (the client got the whole stream at its end, an id-only chunk among it, and no sample was stored: "ended
    without [DONE] after 0 chunks"); an upstream dying after `[DONE]` "broke off". All three are whole answers."""
    url, server = _serve(_relaying(sim_url, shape))
    db = str(tmp_path / "p.duckdb")
    try:
        lines = _ask(url, db, kimi_tok, kimi_profile, leave_at_done=shape == "nospace")
    finally:
        server.should_exit = True
    assert _failures(db) == []
    [sample] = _stored(db)
    assert sample["output_ids"]
    assert lines and lines[-1].replace(b" ", b"") == b"data:[DONE]"
    chunks = [orjson.loads(line[5:]) for line in lines[:-1]]
    asked = [c.get("prompt_token_ids") for c in chunks] + [ch.get("token_ids") for c in chunks for ch in c["choices"]]
    assert not any(asked), "the ids the proxy asked for reached the client"
    for chunk in chunks:  # an id-only chunk (a marker id's: empty delta, no finish) is the proxy's, never sent on
        assert not any(ch["delta"] == {} and ch["finish_reason"] is None for ch in chunk["choices"]), chunk


def test_done_is_read_as_an_event_never_inside_an_answer_s_text() -> None:
    from tokview.proxy.app import DONE_EVENT

    assert DONE_EVENT.search(b'data: {"choices":[{"delta":{"content":"ends with data: [DONE]\\n\\n"}}]}\n\n') is None
    for event in (b"data: [DONE]\n\n", b"data:[DONE]\r\n\r\n", b'data: {"a":1}\n\ndata: [DONE]\n\n'):
        assert DONE_EVENT.search(event)
