"""An upstream that compresses its answers though the proxy asked for none (`accept-encoding: identity`): a gateway
set to "gzip always" in front of vLLM. The proxy took its injected ids out of the compressed bytes, where they never
match, so the client got ids it never asked for, and the generation was recorded as "not JSON". Now a gzip or
deflate answer is read as the bytes it stands for: the client gets the upstream's answer without the injected ids
(sent uncompressed), and the sample is stored token-exact. A coding the proxy cannot read is a 502 and a failure
that names it, never an answer carrying ids the client did not ask for."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from loopback import serve_asgi
from test_proxy_sim import _blank, _chat, _failures, _stored

from tokview.proxy.serve import ProxyConfig, start_proxy
from tokview.sim.config import SimConfig
from tokview.sim.server import start_simulator

PIECE = 300
"""Bytes of the simulator's answer compressed and sent at a time (a stream goes out in many pieces)."""


def _compressor(coding: str) -> Any:
    if coding == "gzip":
        return zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    if coding == "deflate":
        return zlib.compressobj(wbits=zlib.MAX_WBITS)
    return None


def _compressing(sim_url: str, coding: str, *, no_trailer: bool = False) -> Any:
    """Relay the simulator's answer to a generation request compressed as `coding` (flushed piece by piece, as a
    compressing gateway streams); every other path as it is. `no_trailer`: the compressed body's end is never sent
    (every byte of the answer is, flushed)."""

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
            answer = await client.request(
                scope["method"], sim_url + scope["path"], content=body, headers={"content-type": "application/json"}
            )
        headers = [(b"content-type", answer.headers["content-type"].encode())]
        if not scope["path"].endswith("completions"):
            await send({"type": "http.response.start", "status": answer.status_code, "headers": headers})
            await send({"type": "http.response.body", "body": answer.content})
            return
        headers.append((b"content-encoding", coding.encode()))
        await send({"type": "http.response.start", "status": answer.status_code, "headers": headers})
        squeeze = _compressor(coding)
        raw = answer.content
        for at in range(0, len(raw), PIECE):
            piece = raw[at : at + PIECE]
            out = piece if squeeze is None else squeeze.compress(piece) + squeeze.flush(zlib.Z_SYNC_FLUSH)
            await send({"type": "http.response.body", "body": out, "more_body": True})
        await send({"type": "http.response.body", "body": b"" if squeeze is None or no_trailer else squeeze.flush()})

    return app


def _answering(status: int, body: bytes) -> Any:
    """An upstream that answers every request with `status` and this gzip body."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        headers = [(b"content-type", b"application/json"), (b"content-encoding", b"gzip")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


@pytest.fixture(params=["gzip", "deflate", "br"])
def compressing(request) -> Iterator[tuple[str, str, str]]:
    """(the compressing upstream's URL, the simulator's, the coding)."""
    with start_simulator(SimConfig(kind="vllm")) as sim, serve_asgi(_compressing(sim.url, request.param)) as url:
        yield url, sim.url, request.param


@pytest.mark.parametrize("stream", [False, True])
def test_a_compressed_answer_reaches_the_client_without_the_injected_ids_and_is_stored(
    compressing, stream, tmp_path, kimi_tok, kimi_profile
) -> None:
    upstream, sim_url, coding = compressing
    db = str(tmp_path / "p.duckdb")
    config = ProxyConfig([upstream], listen="127.0.0.1:0", db=db, tokenizer=kimi_tok, profile=kimi_profile)
    body = _chat(SimConfig().model_name, stream)
    direct = httpx.post(sim_url + "/v1/chat/completions", json=body).content
    with start_proxy(config) as proxy:
        through = httpx.post(proxy.url + "/v1/chat/completions", json=body)
    if coding == "br":
        assert through.status_code == 502
        assert b"compressed as 'br'" in through.content and b"token_ids" not in through.content
        assert _stored(db) == []
        [reason] = _failures(db)
        assert reason.startswith("the upstream's answer cannot be read: the answer is compressed as 'br'")
        return
    assert through.status_code == 200
    assert "content-encoding" not in through.headers  # sent as the bytes it stands for
    assert _blank(through.content) == _blank(direct)  # the simulator's own answer, no injected ids
    assert _failures(db) == []
    [sample] = _stored(db)
    assert sample["output_ids"] and sample["prompt_ids"]


def test_a_cut_compressed_body_is_a_failure_not_a_sample(tmp_path, kimi_tok, kimi_profile) -> None:
    """A gzip body that ends before its end (a gateway that died): the client is told, nothing is stored as a sample."""
    full = gzip.compress(b'{"id": "x", "choices": []}')
    db = str(tmp_path / "p.duckdb")
    with serve_asgi(_answering(200, full[:-6])) as url:
        config = ProxyConfig([url], listen="127.0.0.1:0", db=db, tokenizer=kimi_tok, profile=kimi_profile, kind="vllm")
        with start_proxy(config) as proxy:
            through = httpx.post(proxy.url + "/v1/chat/completions", json=_chat("m", False))
    assert through.status_code == 502 and b"cut off before its end" in through.content
    assert _stored(db) == [] and len(_failures(db)) == 1


def test_a_compressed_refusal_is_recorded_with_its_message(tmp_path, kimi_tok, kimi_profile) -> None:
    """A 400 the upstream compressed reaches the client as sent; the failure's reason reads its message, not the
    compressed bytes as text."""
    refusal = gzip.compress(b'{"error": {"message": "this model cannot do that", "code": 400}}')
    db = str(tmp_path / "p.duckdb")
    with serve_asgi(_answering(400, refusal)) as url:
        config = ProxyConfig([url], listen="127.0.0.1:0", db=db, tokenizer=kimi_tok, profile=kimi_profile, kind="vllm")
        with start_proxy(config) as proxy, httpx.Client() as client:
            through = client.post(proxy.url + "/v1/chat/completions", json=_chat("m", False))
    assert through.status_code == 400 and through.json()["error"]["message"] == "this model cannot do that"
    assert _failures(db) == ["refused by the upstream: HTTP 400: this model cannot do that"]


def test_a_stream_whose_compressed_end_breaks_after_its_done_is_one_sample_and_no_failure(
    tmp_path, kimi_tok, kimi_profile
) -> None:
    """A streamed answer is handed to the recorder as its `[DONE]` goes out; a gzip body whose end then never came
    (its trailer) was recorded a second time, as a failure ("cannot be read"), beside the sample."""
    db = str(tmp_path / "p.duckdb")
    with (
        start_simulator(SimConfig(kind="vllm")) as sim,
        serve_asgi(_compressing(sim.url, "gzip", no_trailer=True)) as url,
    ):
        config = ProxyConfig([url], listen="127.0.0.1:0", db=db, tokenizer=kimi_tok, profile=kimi_profile)
        received = b""
        with (
            start_proxy(config) as proxy,
            httpx.stream(
                "POST", proxy.url + "/v1/chat/completions", json=_chat(SimConfig().model_name, True)
            ) as through,
        ):
            with pytest.raises(httpx.RemoteProtocolError):  # cut as the upstream's body was: after the whole answer
                for piece in through.iter_bytes():
                    received += piece
    assert b"data: [DONE]" in received
    assert len(_stored(db)) == 1 and _failures(db) == []
