"""`tokview proxy` against a scripted SGLang (the real recordings, over a real socket): sglext ids on a
stream, tool calls stored as returned, credentials forwarded and never stored, the proxy key, a client
that goes away (the upstream request is closed), and a store that cannot be written."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from loopback import serve_asgi

from tokview.cli import main
from tokview.core.tool_calls import tool_calls_of_response
from tokview.errors import UserError
from tokview.proxy.serve import ProxyConfig, check_listen, start_proxy
from tokview.store import Store
from tokview.store.packed_chunks import PACKED_KEY, unpack

REC = Path(__file__).resolve().parent / "recordings" / "proxy_tools"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
ASK = {
    "model": "tiny-kimi-tools",
    "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
    "tools": TOOLS,
}


HOLD = """
import duckdb, time
while True:  # the proxy keeps the file open for a moment after each short use
    try:
        c = duckdb.connect({db!r})
        break
    except duckdb.Error:
        time.sleep(0.01)
print("held", flush=True)
time.sleep(30)
"""
"""Another process holding the store (DuckDB lets one process at a time have it)."""


class ScriptedSGLang:
    """Answers chat as the recorded SGLang 0.5.23 did; a request whose last message says "hang" streams one
    chunk and then waits for the client to go away (noting when it did)."""

    def __init__(self) -> None:
        self.seen: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.hung_up = threading.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"] != "/v1/chat/completions":
            await _answer(send, 404, b'{"detail":"Not Found"}', b"application/json")
            return
        request = orjson.loads(body)
        self.seen.append(({k.decode(): v.decode() for k, v in scope["headers"]}, request))
        if not request.get("stream"):
            name = "sgl_t1.json" if request.get("return_token_ids") else "sgl_t1_sglext.json"
            await _answer(send, 200, (REC / name).read_bytes(), b"application/json")
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        if request["messages"][-1]["content"] == "hang":
            first = (REC / "sgl_t1_stream.txt").read_bytes().split(b"\n\n")[0] + b"\n\n"
            await send({"type": "http.response.body", "body": first, "more_body": True})
            while (await receive())["type"] != "http.disconnect":
                pass
            self.hung_up.set()
            return
        name = "sgl_t1_stream_sglext.txt" if request.get("return_output_ids_in_sglext") else "sgl_t1_stream.txt"
        for event in (REC / name).read_bytes().split(b"\n\n")[:-1]:
            await send({"type": "http.response.body", "body": event + b"\n\n", "more_body": True})
            await asyncio.sleep(0)
        await send({"type": "http.response.body", "body": b""})


async def _answer(send: Any, status: int, body: bytes, kind: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", kind)]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
def upstream() -> Iterator[tuple[str, ScriptedSGLang]]:
    app = ScriptedSGLang()
    with serve_asgi(app) as url:
        yield url, app


def _proxy(url: str, tmp_path: Path, tok: Any, profile: Any, **extra: Any) -> Any:
    db = str(tmp_path / "p.duckdb")
    return start_proxy(
        ProxyConfig([url], listen="127.0.0.1:0", db=db, tokenizer=tok, profile=profile, kind="sglang", **extra)
    )


def _rows(db: str, sql: str) -> list[tuple]:
    with Store(db) as store:
        return store.query(sql)


def test_sglang_stream_ids_come_from_the_sglext_chunk_the_client_never_sees(upstream, tmp_path, kimi_tok, kimi_profile):
    url, app = upstream
    with _proxy(url, tmp_path, kimi_tok, kimi_profile) as proxy:
        got = httpx.post(proxy.url + "/v1/chat/completions", json={**ASK, "stream": True}).content
        proxy.stop()
    recorded = (REC / "sgl_t1_stream_sglext.txt").read_bytes()
    assert got == b"".join(e + b"\n\n" for e in recorded.split(b"\n\n")[:-1] if b"sglext" not in e)
    assert app.seen[-1][1]["return_input_ids_in_sglext"] is True
    assert "return_token_ids" not in app.seen[-1][1]
    ext = orjson.loads(next(e for e in recorded.split(b"\n\n") if b"sglext" in e)[6:])["sglext"]
    [(prompt_ids, output_ids, raw_response, settings)] = _rows(
        str(tmp_path / "p.duckdb"), "SELECT prompt_ids, output_ids, raw_response, settings FROM samples"
    )
    assert prompt_ids == ext["input_ids"]
    assert output_ids == ext["output_ids"][0]
    assert len(output_ids) == 29
    # the stored stream's calls, folded from its chunks (packed: packed_chunks.py) as the store reads them (no
    # second copy beside them)
    assert PACKED_KEY in orjson.loads(raw_response)
    assert tool_calls_of_response(unpack(orjson.loads(raw_response))) == [
        {"id": "functions.get_weather:0", "name": "get_weather", "arguments": '{"city": "Paris"}'}
    ]
    assert orjson.loads(settings)["tools"] == TOOLS


def test_sglang_json_answer_loses_only_the_ids_and_keeps_tool_calls_in_the_store(
    upstream, tmp_path, kimi_tok, kimi_profile
):
    url, _ = upstream
    with _proxy(url, tmp_path, kimi_tok, kimi_profile) as proxy:
        got = httpx.post(proxy.url + "/v1/chat/completions", json=ASK).content
        proxy.stop()
    raw = (REC / "sgl_t1.json").read_bytes()
    assert got == raw.replace(raw[raw.index(b',"prompt_token_ids"') : raw.index(b"}],")], b"")
    [(raw_response,)] = _rows(str(tmp_path / "p.duckdb"), "SELECT raw_response FROM samples")
    assert orjson.loads(raw_response)["choices"][0]["message"]["tool_calls"][0]["id"] == "functions.get_weather:0"


def test_client_authorization_is_forwarded_and_never_stored(upstream, tmp_path, kimi_tok, kimi_profile, monkeypatch):
    url, app = upstream
    monkeypatch.setenv("TOKVIEW_API_KEY", "env-key-for-the-upstream")
    with _proxy(url, tmp_path, kimi_tok, kimi_profile) as proxy:
        httpx.post(proxy.url + "/v1/chat/completions", json=ASK, headers={"Authorization": "Bearer client-secret-123"})
        httpx.post(proxy.url + "/v1/chat/completions", json=ASK)
        proxy.stop()
    assert app.seen[-2][0]["authorization"] == "Bearer client-secret-123"
    assert app.seen[-1][0]["authorization"] == "Bearer env-key-for-the-upstream"
    dump = orjson.dumps(_rows(str(tmp_path / "p.duckdb"), "SELECT * FROM samples"), default=str)
    assert b"client-secret-123" not in dump
    assert b"env-key-for-the-upstream" not in dump
    assert len(_rows(str(tmp_path / "p.duckdb"), "SELECT sample_id FROM samples")) == 2


def test_a_proxy_key_is_required_and_never_forwarded(upstream, tmp_path, kimi_tok, kimi_profile):
    url, app = upstream
    with _proxy(url, tmp_path, kimi_tok, kimi_profile, key="proxy-key-42") as proxy:
        refused = httpx.post(proxy.url + "/v1/chat/completions", json=ASK)
        wrong = httpx.post(proxy.url + "/v1/chat/completions", json=ASK, headers={"Authorization": "Bearer nope"})
        ok = httpx.post(proxy.url + "/v1/chat/completions", json=ASK, headers={"Authorization": "Bearer proxy-key-42"})
    assert refused.status_code == wrong.status_code == 401
    assert ok.status_code == 200
    assert "authorization" not in app.seen[-1][0]  # the proxy key stays at the proxy


def test_listening_beyond_loopback_needs_allow_remote_and_a_key():
    assert check_listen(ProxyConfig(["http://127.0.0.1:1"], listen="127.0.0.1:0")) == ("127.0.0.1", 0)
    assert check_listen(ProxyConfig(["http://127.0.0.1:1"], listen="[::1]:5")) == ("::1", 5)
    with pytest.raises(UserError, match="--allow-remote"):
        check_listen(ProxyConfig(["http://127.0.0.1:1"], listen="0.0.0.0:8900"))
    with pytest.raises(UserError, match="TOKVIEW_PROXY_KEY"):
        check_listen(ProxyConfig(["http://127.0.0.1:1"], listen="0.0.0.0:8900", allow_remote=True))
    assert check_listen(ProxyConfig(["http://x:1"], listen="0.0.0.0:8900", allow_remote=True, key="k"))[0] == "0.0.0.0"


def test_cli_refuses_a_remote_address_in_one_line(capsys, monkeypatch):
    monkeypatch.delenv("TOKVIEW_PROXY_KEY", raising=False)
    assert main(["proxy", "--server", "http://127.0.0.1:1", "--listen", "0.0.0.0:8900"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("tokview: error: --listen 0.0.0.0:8900: the proxy listens only")
    assert main(["proxy", "--server", "ftp://x", "--listen", "127.0.0.1:0"]) == 1
    assert capsys.readouterr().err.startswith("tokview: error: bad server URL")


def test_a_client_that_goes_away_closes_the_upstream_request(upstream, tmp_path, kimi_tok, kimi_profile):
    url, app = upstream
    body = {**ASK, "messages": [{"role": "user", "content": "hang"}], "stream": True}
    with _proxy(url, tmp_path, kimi_tok, kimi_profile) as proxy:
        with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body) as response:
            first = next(response.iter_raw())
        assert first.startswith(b"data: {")
        assert app.hung_up.wait(5), "the upstream request was still open after the client left"
        proxy.stop()
    [(reason,)] = _rows(str(tmp_path / "p.duckdb"), "SELECT reason FROM failures")
    assert reason.startswith("abandoned by the client after 1 chunks")


@pytest.mark.parametrize("record_in", ["thread", "process"])
def test_a_held_store_delays_landing_loudly_and_loses_nothing(upstream, tmp_path, kimi_tok, kimi_profile, record_in):
    """Another program (a notebook, the duckdb CLI) holds the store past the proxy's wait: forwarding goes on, the
    proxy says once that it is not landing, and records on into parts. It stopped recording for good there, and
    every answer after, the store free again or not, was lost (4 of 12 in a run). Once the holder lets go, every
    answer lands and the proxy says so."""
    url, _ = upstream
    said: list[str] = []
    held, free = threading.Event(), threading.Event()

    def say(line: str) -> None:
        said.append(line)
        if "NOT LANDING" in line:
            held.set()
        if "landing again" in line:
            free.set()

    db = str(tmp_path / "p.duckdb")
    config = ProxyConfig(
        [url],
        listen="127.0.0.1:0",
        db=db,
        tokenizer=kimi_tok,
        profile=kimi_profile,
        kind="sglang",
        say=say,
        lock_timeout=0.3,
        record_in=record_in,
    )
    statuses = []
    with start_proxy(config) as proxy:
        holder = subprocess.Popen([sys.executable, "-c", HOLD.format(db=db)], stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "held"
            for _ in range(40):
                statuses.append(httpx.post(proxy.url + "/v1/chat/completions", json=ASK).status_code)
                if held.wait(0.05):
                    break
            assert held.is_set(), said
            statuses += [httpx.post(proxy.url + "/v1/chat/completions", json=ASK).status_code for _ in range(3)]
        finally:
            holder.kill()
            holder.wait()
        statuses += [httpx.post(proxy.url + "/v1/chat/completions", json=ASK).status_code for _ in range(3)]
        assert free.wait(20), said
        assert proxy.recorder.not_recorded == 0
    assert set(statuses) == {200}
    assert _rows(db, "SELECT count(*) FROM samples") == [(len(statuses),)]
    assert sum("NOT LANDING" in line for line in said) == 1
    assert not any("STOPPED RECORDING" in line for line in said), said


def test_once_not_landing_is_said_the_stores_waits_are_quiet_until_it_lands_again(tmp_path, kimi_tok, kimi_profile):
    """Each landing tried again while the store was held said "waiting for STORE: in use by …" again, every 10 s,
    under the NOT LANDING that had said it all."""
    from tokview.proxy.app import Upstream
    from tokview.proxy.recorder_store import open_recorder_here
    from tokview.store.errors import StoreHeld

    said: list[str] = []
    config = ProxyConfig(["http://127.0.0.1:9"], db=str(tmp_path / "q.duckdb"), profile=kimi_profile)
    recorder = open_recorder_here(config, [Upstream("http://127.0.0.1:9", "vllm")], kimi_tok, said.append)
    try:
        wait = recorder.store._file.on_wait
        wait("waiting for q.duckdb: in use by another program (pid 1: python)")
        recorder._held(StoreHeld("the store is in use by another program"))
        wait("waiting for q.duckdb: in use by another program (pid 1: python)")
        recorder._held(None)
        wait("waiting for q.duckdb: in use by another program (pid 2: duckdb)")
    finally:
        recorder.close()
    waits = [line for line in said if "waiting for" in line]
    assert [line[-7:] for line in waits] == ["python)", "duckdb)"], said
    assert [line.startswith("tokview proxy: ") for line in waits] == [True, True]


def test_two_upstreams_share_the_requests_and_each_sample_names_its_server(tmp_path, kimi_tok, kimi_profile):
    from tokview.sim.config import SimConfig
    from tokview.sim.server import start_simulator

    with start_simulator(SimConfig(kind="vllm")) as one, start_simulator(SimConfig(kind="vllm")) as two:
        db = str(tmp_path / "p.duckdb")
        config = ProxyConfig([one.url, two.url], listen="127.0.0.1:0", db=db, tokenizer=kimi_tok, profile=kimi_profile)
        with start_proxy(config) as proxy:
            for n in range(4):
                body = {"model": "tokview-sim", "messages": [{"role": "user", "content": f"q{n}"}], "max_tokens": 30}
                assert httpx.post(proxy.url + "/v1/chat/completions", json=body).status_code == 200
            proxy.stop()
        assert one.stats.requests["/v1/chat/completions"] >= 2
        assert two.stats.requests["/v1/chat/completions"] >= 2
    servers = sorted(r[0] for r in _rows(db, "SELECT server_url FROM samples"))
    assert servers == sorted([one.url, one.url, two.url, two.url])


def test_an_upstream_that_is_neither_vllm_nor_sglang_is_refused_in_one_line(tmp_path):
    from loopback import serve_json

    with serve_json({"/health": {"ok": True}}) as (url, _):
        with pytest.raises(UserError, match="neither SGLang nor vLLM"):
            with start_proxy(ProxyConfig([url], listen="127.0.0.1:0", db=None)):
                pass


def test_an_ipv6_listen_address_is_printed_as_a_url_a_client_can_use() -> None:
    """`--listen [::1]:0` printed `http://::1:44767/v1`, which curl refuses; the address goes in brackets."""
    import socket

    from tokview.proxy.serve import ProxyConfig, start_proxy

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("this machine has no IPv6 loopback")
    from tokview.sim.config import SimConfig
    from tokview.sim.server import start_simulator

    with start_simulator(SimConfig(kind="vllm")) as sim:
        with start_proxy(ProxyConfig([sim.url], listen="[::1]:0", db=None)) as running:
            assert running.url.startswith("http://[::1]:")
            assert httpx.get(running.url + "/health", timeout=5).status_code == 200


def test_a_listen_port_out_of_range_is_said_as_such(capsys) -> None:
    """`--listen 127.0.0.1:70000` was told "expected HOST:PORT", which it is."""
    assert main(["proxy", "--server", "http://127.0.0.1:1", "--listen", "127.0.0.1:70000"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "tokview: error: --listen '127.0.0.1:70000': port 70000 is out of range (0 to 65535; 0 picks a free one)"
    ]
    assert main(["proxy", "--server", "http://127.0.0.1:1", "--listen", "127.0.0.1:x"]) == 1
    assert "expected HOST:PORT" in capsys.readouterr().err
