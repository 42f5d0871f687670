"""An upstream whose answer heads (and chunk lines) end in a bare LF, as some gateways write them.

The batch's transport learned to read them this round, so `tokview proxy`'s start-up probe passed; but the proxy
relays with its own upstream client, which waited for a CR LF CR LF that never came: every forwarded request hung
until the harness's own timeout. It reads them as the batch does now."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from test_proxy_sim import _blank, _chat, _failures, _stored

from tokview.proxy.serve import ProxyConfig, start_proxy
from tokview.sim.config import SimConfig
from tokview.sim.server import start_simulator


@contextmanager
def _bare_lf_gateway(sim_url: str, chunked: bool) -> Iterator[str]:
    """A relay to the simulator that writes every answer with bare-LF lines (head, and chunk lines when `chunked`)."""
    loop = asyncio.new_event_loop()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                fields = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
                body = await reader.readexactly(int(fields.get("content-length", "0")))
                async with httpx.AsyncClient() as client:
                    answer = await client.request(method, sim_url + path, content=body or None)
                out = answer.content
                head_out = f"HTTP/1.1 {answer.status_code} OK\ncontent-type: {answer.headers['content-type']}\n"
                if chunked:
                    pieces = [out[i : i + 97] for i in range(0, len(out), 97)]
                    framed = b"".join(b"%x\n%s\n" % (len(p), p) for p in pieces) + b"0\n\n"
                    writer.write(head_out.encode() + b"transfer-encoding: chunked\n\n" + framed)
                else:
                    writer.write(head_out.encode() + b"content-length: %d\n\n" % len(out) + out)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = asyncio.run_coroutine_threadsafe(asyncio.start_server(handle, "127.0.0.1", 0), loop).result(5)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("stream", [False, True])
def test_a_bare_lf_upstream_is_relayed_and_recorded(chunked, stream, tmp_path, kimi_tok, kimi_profile) -> None:
    db = str(tmp_path / "p.duckdb")
    with start_simulator(SimConfig(kind="vllm")) as sim, _bare_lf_gateway(sim.url, chunked) as gateway:
        config = ProxyConfig([gateway], listen="127.0.0.1:0", db=db, tokenizer=kimi_tok, profile=kimi_profile)
        body = _chat(sim.cfg.model_name, stream)
        direct = httpx.post(sim.url + "/v1/chat/completions", json=body).content
        with start_proxy(config) as proxy:
            through = httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=10)
    assert through.status_code == 200
    assert _blank(through.content) == _blank(direct)
    assert _failures(db) == [] and len(_stored(db)) == 1
