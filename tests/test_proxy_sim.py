"""`tokview proxy` over real sockets: the simulator (vLLM and SGLang) upstream, the proxy as a real server,
httpx as the harness. The client's bytes must be the upstream's own, the store must hold every request
token-exact with the ids the simulator served, and conversations must come out grouped."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tokview.proxy import ids
from tokview.proxy.recorder_process import RecorderProcess
from tokview.proxy.serve import ProxyConfig, start_proxy
from tokview.sim.config import SimConfig
from tokview.sim.faults import FaultBook
from tokview.sim.server import start_simulator
from tokview.store import Store
from tokview.store.conversation_turns import Turn, conversation_turns
from tokview.ui.session import Session as AppSession

_VARYING = re.compile(rb'"id":"[^"]*"|"created":\d+')
QUESTION = [{"role": "user", "content": "What is 17 times 3?"}]


def _blank(raw: bytes) -> bytes:
    """The bytes with the values the simulator makes new per request (response id, timestamp) blanked."""
    return _VARYING.sub(b"", raw)


def _sglang_streams_ids(sim: Any) -> bool:
    """Whether this simulator's SGLang sends the sglext ids on a stream (it did not when these tests were
    written; the tool-calling simulator adds them)."""
    body = {**_chat(sim.cfg.model_name, True), "return_input_ids_in_sglext": True, "return_output_ids_in_sglext": True}
    return b'"sglext"' in httpx.post(sim.url + "/v1/chat/completions", json=body).content


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def sim(request) -> Iterator[Any]:
    with start_simulator(SimConfig(kind=request.param)) as running:
        yield running


@pytest.fixture
def proxy(sim, tmp_path, kimi_tok, kimi_profile) -> Iterator[Any]:
    config = ProxyConfig(
        [sim.url], listen="127.0.0.1:0", db=str(tmp_path / "p.duckdb"), tokenizer=kimi_tok, profile=kimi_profile
    )
    with start_proxy(config) as running:
        running.db = config.db  # type: ignore[attr-defined]  # the tests read the proxy's store beside it
        yield running


def _chat(model: str, stream: bool, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": QUESTION, "max_tokens": 200, "temperature": 0, "stream": stream, **extra}


def _weather_tool() -> dict[str, Any]:
    properties = {"city": {"type": "string"}}
    return {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object", "properties": properties}},
    }


def _stored(db: str) -> list[dict[str, Any]]:
    with Store(db) as store:
        rows = store.query(
            "SELECT sample_id, prompt_id, turn, prompt_ids, output_ids, codes, raw_request, endpoint FROM samples "
            "ORDER BY sample_id"
        )
    keys = ("sample_id", "prompt_id", "turn", "prompt_ids", "output_ids", "codes", "raw_request", "endpoint")
    return [dict(zip(keys, row)) for row in rows]


def _failures(db: str) -> list[str]:
    with Store(db) as store:
        return [r[0] for r in store.query("SELECT reason FROM failures ORDER BY reason")]


def test_a_stream_with_logprobs_is_the_upstreams_own_bytes(sim, proxy) -> None:
    """With logprobs asked for, vLLM 0.32 sends a marker id's chunk (empty delta, no finish) for its logprob: the
    client gets it through the proxy too, one logprob entry per output id (the proxy dropped it as a chunk only its
    own id flag made the upstream send, and a harness lost the `</think>` entry)."""
    body = _chat(sim.cfg.model_name, True, logprobs=True, top_logprobs=1, stream_options={"include_usage": True})
    direct = httpx.post(sim.url + "/v1/chat/completions", json=body).content
    through = httpx.post(proxy.url + "/v1/chat/completions", json=body).content
    assert _blank(through) == _blank(direct)
    chunks = [orjson.loads(line[6:]) for line in through.splitlines() if line.startswith(b"data: {")]
    entries = [e for c in chunks for ch in c["choices"] for e in (ch.get("logprobs") or {}).get("content") or []]
    [usage] = [c["usage"] for c in chunks if c.get("usage")]
    if sim.cfg.kind == "vllm":  # the simulator's SGLang streams no logprobs on chat
        assert len(entries) == usage["completion_tokens"]
        assert [c for c in chunks for ch in c["choices"] if ch["delta"] == {} and ch["finish_reason"] is None]


def test_a_tool_calling_stream_with_logprobs_is_the_upstreams_own_bytes(sim, proxy) -> None:
    """The same with tools: the simulator's tool path skipped the marker chunks vLLM sends for their logprobs, so the
    proxy's stream (which keeps them, as vLLM 0.32's would come) differed from the simulator's own (61 events to 36)."""
    weather = [{"role": "user", "content": "What is the weather in Paris?"}]
    extra = {"logprobs": True, "stream_options": {"include_usage": True}, "tools": [_weather_tool()]}
    body = {**_chat(sim.cfg.model_name, True, **extra), "messages": weather}
    direct = httpx.post(sim.url + "/v1/chat/completions", json=body).content
    through = httpx.post(proxy.url + "/v1/chat/completions", json=body).content
    assert _blank(through) == _blank(direct)
    chunks = [orjson.loads(line[6:]) for line in through.splitlines() if line.startswith(b"data: {")]
    assert [c for c in chunks for ch in c["choices"] if ch["delta"].get("tool_calls")]
    entries = [e for c in chunks for ch in c["choices"] for e in (ch.get("logprobs") or {}).get("content") or []]
    if sim.cfg.kind == "vllm":
        assert len(entries) == next(c["usage"] for c in chunks if c.get("usage"))["completion_tokens"]


def test_a_stream_with_logprobs_from_a_vllm_before_0_31_is_its_own_bytes_too(tmp_path, kimi_tok, kimi_profile) -> None:
    """vLLM 0.30 skipped a marker id's chunk with logprobs asked for (the proxy reads the version it probed)."""
    with start_simulator(SimConfig(kind="vllm", version="0.30.0")) as old:
        config = ProxyConfig(
            [old.url], listen="127.0.0.1:0", db=str(tmp_path / "p.duckdb"), tokenizer=kimi_tok, profile=kimi_profile
        )
        with start_proxy(config) as running:
            body = _chat(old.cfg.model_name, True, logprobs=True, stream_options={"include_usage": True})
            direct = httpx.post(old.url + "/v1/chat/completions", json=body).content
            through = httpx.post(running.url + "/v1/chat/completions", json=body).content
    assert _blank(through) == _blank(direct)
    chunks = [orjson.loads(line[6:]) for line in direct.splitlines() if line.startswith(b"data: {")]
    assert not [c for c in chunks for ch in c["choices"] if ch["delta"] == {} and ch["finish_reason"] is None]
    assert len(_stored(str(config.db))) == 1


def test_the_logprobs_a_client_asked_for_are_stored_with_its_sample(sim, proxy) -> None:
    """A harness asking for logprobs got them, and the sample's `output_logprobs` stayed empty: they were only in the
    stored raw answer. The sampled ones are kept per output id; alternatives only when asked for as ids."""
    asked = [
        ("chat", _chat(sim.cfg.model_name, False, logprobs=True, top_logprobs=2)),
        ("chat", _chat(sim.cfg.model_name, True, logprobs=True, top_logprobs=2, return_tokens_as_token_ids=True)),
        ("completions", {"model": sim.cfg.model_name, "prompt": "Count to five", "max_tokens": 12, "logprobs": 1}),
    ]
    served: list[list[float]] = []
    for endpoint, body in asked:
        answer = httpx.post(f"{proxy.url}/v1/{endpoint.replace('chat', 'chat/completions')}", json=body).content
        chunks = [orjson.loads(line[6:]) for line in answer.splitlines() if line.startswith(b"data: {")] or [
            orjson.loads(answer)
        ]
        if endpoint == "chat":
            entries = [
                e for c in chunks for ch in c["choices"] for e in (ch.get("logprobs") or {}).get("content") or []
            ]
            served.append([e["logprob"] for e in entries])
        else:
            held = [(ch.get("logprobs") or {}).get("token_logprobs") or [] for c in chunks for ch in c["choices"]]
            served.append([v for values in held for v in values])
    proxy.stop()
    with Store(proxy.db) as store:
        rows = store.query("SELECT output_ids, output_logprobs, output_top_ids FROM samples ORDER BY sample_id")
    assert len(rows) == 3
    for (output_ids, logprobs, _), values in zip(rows, served, strict=True):
        if not values:  # the simulator's SGLang sends none on a chat stream or completions
            assert logprobs is None
            continue
        assert len(logprobs) == len(output_ids) and logprobs == pytest.approx(values)
    assert rows[0][2] is None  # alternatives named by their text: left out
    if served[1]:
        assert rows[1][2] is not None and all(len(t) == 2 for t in rows[1][2])


def test_a_vllm_answer_without_reasoning_says_why_it_is_not_recorded(sim, proxy) -> None:
    """`include_reasoning: false` with a reasoning parser: vLLM then withholds the token ids (`suppress_metadata`),
    and the failure read as if the server were too old to send them."""
    if sim.cfg.kind != "vllm":
        pytest.skip("vLLM's field")
    for stream in (False, True):
        body = _chat(sim.cfg.model_name, stream, include_reasoning=False)
        direct = httpx.post(sim.url + "/v1/chat/completions", json=body).content
        through = httpx.post(proxy.url + "/v1/chat/completions", json=body).content
        assert _blank(through) == _blank(direct)
    proxy.stop()
    reasons = _failures(proxy.db)
    assert len(reasons) == 2 and all("include_reasoning" in r and "withholds" in r for r in reasons), reasons


@pytest.mark.parametrize("stream", [False, True])
def test_chat_answer_is_the_upstreams_own_bytes_and_is_stored_token_exact(sim, proxy, stream) -> None:
    body = _chat(sim.cfg.model_name, stream)
    direct = httpx.post(sim.url + "/v1/chat/completions", json=body).content
    through = httpx.post(proxy.url + "/v1/chat/completions", json=body)
    assert through.status_code == 200
    expected = direct  # the simulator's vLLM stream without ids has real vLLM's shape (test_sim)
    assert _blank(through.content) == _blank(expected)
    proxy.stop()
    if stream and sim.cfg.kind == "sglang" and not _sglang_streams_ids(sim):
        assert _failures(proxy.db) == ["the upstream returned no token ids on chat (stream) (the sglext ids asked)"]
        return
    served = orjson.loads(
        httpx.post(
            sim.url + "/v1/chat/completions", json=_chat(sim.cfg.model_name, False, return_token_ids=True)
        ).content
    )
    choice = served["choices"][0]
    prompt_ids = served.get("prompt_token_ids") or choice["prompt_token_ids"]
    output_ids = choice.get("token_ids") or choice["response_token_ids"]
    [row] = _stored(proxy.db)
    assert row["prompt_ids"] == prompt_ids
    assert row["output_ids"] == output_ids
    assert row["endpoint"] == f"{sim.cfg.kind}-chat"
    assert row["turn"] == 0


def test_completions_token_prompt_stream_and_not(sim, proxy) -> None:
    prompt = [163587, 455, 163601, 87, 104, 163586, 163588, 400, 163601, 163606]
    for stream in (False, True):
        body = {"model": sim.cfg.model_name, "prompt": prompt, "max_tokens": 30, "temperature": 0, "stream": stream}
        direct = httpx.post(sim.url + "/v1/completions", json=body).content
        through = httpx.post(proxy.url + "/v1/completions", json=body).content
        # vLLM sets both id keys on every chunk of a completions stream, null when not asked for: the simulator left
        # them out, so a client through the proxy got keys a direct one did not (nulls where the proxy took ids out)
        assert _blank(through) == _blank(direct)
        if stream:
            assert through.endswith(b"data: [DONE]\n\n")
    proxy.stop()
    rows = _stored(proxy.db)
    assert [r["prompt_ids"] for r in rows] == [prompt, prompt]
    assert rows[0]["output_ids"] == rows[1]["output_ids"]
    assert rows[0]["output_ids"]
    # the second continues nothing: the same prompt again is a new conversation, not turn 1 of the first
    assert rows[0]["prompt_id"] != rows[1]["prompt_id"]


def test_a_client_that_asks_for_ids_gets_them(sim, proxy) -> None:
    body = _chat(sim.cfg.model_name, False, return_token_ids=True)
    direct = httpx.post(sim.url + "/v1/chat/completions", json=body).content
    through = httpx.post(proxy.url + "/v1/chat/completions", json=body).content
    assert _blank(through) == _blank(direct)
    assert b'token_ids":[' in through


def test_other_paths_pass_through(sim, proxy) -> None:
    for path in ("/v1/models", "/health"):
        assert _blank(httpx.get(proxy.url + path).content) == _blank(httpx.get(sim.url + path).content)
    tok = {"model": sim.cfg.model_name, "messages": QUESTION}
    assert httpx.post(proxy.url + "/tokenize", json=tok).content == httpx.post(sim.url + "/tokenize", json=tok).content
    assert httpx.get(proxy.url + "/nope").status_code == httpx.get(sim.url + "/nope").status_code == 404
    proxy.stop()
    assert _stored(proxy.db) == []
    assert _failures(proxy.db) == []


def test_a_refused_request_reaches_the_client_as_sent_and_is_recorded_as_refused(sim, proxy) -> None:
    body = {"model": sim.cfg.model_name, "messages": QUESTION, "max_tokens": -5}
    direct = httpx.post(sim.url + "/v1/chat/completions", json=body)
    through = httpx.post(proxy.url + "/v1/chat/completions", json=body)
    assert through.status_code == direct.status_code == 400
    assert through.content == direct.content
    proxy.stop()
    [reason] = _failures(proxy.db)
    assert reason.startswith("refused by the upstream: HTTP 400")


def test_a_body_with_a_lone_surrogate_escape_is_read_as_the_servers_read_it_and_recorded(sim, proxy) -> None:
    """`"\\ud800"` is JSON Python's json reads and orjson refuses: such a body went upstream unread and unrecorded,
    its generation neither a sample nor a failure. The simulator refuses it (HTTP 400; it was a 500 and a traceback):
    recorded as refused."""
    body = b'{"model": "%s", "messages": [{"role": "user", "content": "hi \\ud800 there"}], "max_tokens": 8}' % (
        sim.cfg.model_name.encode()
    )
    headers = {"content-type": "application/json"}
    direct = httpx.post(sim.url + "/v1/chat/completions", content=body, headers=headers)
    through = httpx.post(proxy.url + "/v1/chat/completions", content=body, headers=headers)
    assert through.status_code == direct.status_code == 400
    assert through.content == direct.content
    assert b"surrogate" in direct.content
    proxy.stop()
    [reason] = _failures(proxy.db)
    assert reason.startswith("refused by the upstream: HTTP 400")


def test_a_chat_only_id_flag_on_completions_gets_the_client_what_the_upstream_sends(sim, proxy) -> None:
    """SGLang's completions ignore `return_prompt_token_ids` (a chat field): the prompt's ids in the answer come from
    the proxy's own `return_token_ids` and are taken out (they reached the client before); recorded all the same."""
    body = {
        "model": sim.cfg.model_name,
        "prompt": "Hi",
        "max_tokens": 6,
        "temperature": 0,
        "return_prompt_token_ids": True,
    }
    direct = httpx.post(sim.url + "/v1/completions", json=body).content
    through = httpx.post(proxy.url + "/v1/completions", json=body).content
    assert _blank(through) == _blank(direct)
    proxy.stop()
    assert [len(r["output_ids"]) for r in _stored(proxy.db)] == [6]


def test_completions_prefix_groups_turns_into_one_session(sim, proxy) -> None:
    prompt = [163587, 455, 163601, 87, 104, 163586, 163588, 400, 163601, 163606]
    ids_body = {"model": sim.cfg.model_name, "max_tokens": 12, "temperature": 0, "return_token_ids": True}
    turns = []
    for _ in range(3):
        answer = httpx.post(proxy.url + "/v1/completions", json={**ids_body, "prompt": prompt}).json()
        out = answer["choices"][0]["token_ids"]
        turns.append((list(prompt), out))
        prompt = prompt + out + [163587, 455, 163601, 88, 163586, 163588, 400, 163601, 163606]
    httpx.post(proxy.url + "/v1/completions", json={**ids_body, "prompt": [163587, 455, 163601, 99]})
    proxy.stop()
    rows = _stored(proxy.db)
    sessions = [r["prompt_id"] for r in rows]
    assert sessions[0] == sessions[1] == sessions[2] != sessions[3]
    assert [r["turn"] for r in rows] == [0, 1, 2, 0]
    assert [(r["prompt_ids"], r["output_ids"]) for r in rows[:3]] == turns


def test_chat_history_that_breaks_the_prefix_joins_by_messages_with_a_finding(sim, proxy) -> None:
    first = httpx.post(proxy.url + "/v1/chat/completions", json=_chat(sim.cfg.model_name, False)).json()
    reply = first["choices"][0]["message"]
    history = [
        *QUESTION,
        {"role": "assistant", "content": reply.get("content")},
        {"role": "user", "content": "And 18 times 3?"},
    ]
    httpx.post(proxy.url + "/v1/chat/completions", json={**_chat(sim.cfg.model_name, False), "messages": history})
    proxy.stop()
    one, two = _stored(proxy.db)
    assert one["prompt_id"] == two["prompt_id"]
    assert two["turn"] == 1
    assert "session_prefix_break" in two["codes"]
    assert "session_prefix_break" not in one["codes"]
    with Store(proxy.db) as store:
        [(detail, positions)] = store.query(
            "SELECT detail, positions FROM findings WHERE sample_id = ? AND code = 'session_prefix_break'",
            [two["sample_id"]],
        )
    at = positions[0]
    served = one["prompt_ids"] + one["output_ids"]
    assert two["prompt_ids"][:at] == served[:at]
    assert two["prompt_ids"][at] != served[at]
    assert f"first differ at position {at}" in detail
    assert f"where turn 0 has id {served[at]} " in detail
    assert "The harness changed turn 0's answer before sending it back: it dropped its reasoning" in detail
    # `show` and the app re-analyse a sample alone, which cannot find a break: the stored finding is shown
    shown = subprocess.run(
        [sys.executable, "-m", "tokview", "show", two["sample_id"], "--db", proxy.db, "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    [finding] = [f for f in json.loads(shown.stdout)["findings"] if f["code"] == "session_prefix_break"]
    assert finding["detail"] == detail and list(finding["positions"]) == [at]
    with Store(proxy.db) as store:
        _, analysis, _, _ = AppSession(store).load(two["sample_id"])
        walked = conversation_turns(store, two["sample_id"])  # inspect's w: "harness history · breaks at N"
    assert "session_prefix_break" in analysis.codes
    assert walked == [Turn(one["sample_id"], 0, "harness"), Turn(two["sample_id"], 1, "harness", False, at)]


def test_a_history_sent_back_as_served_puts_the_break_down_to_the_template_not_the_harness(sim, proxy) -> None:
    """The answer sent back as served, its reasoning under the field the server reads: Kimi's template still drops a
    finished turn's reasoning (`<think></think>`), so the prefix breaks. The finding blamed the harness for every
    break; here it did nothing wrong."""
    declared = {"tools": [_weather_tool()], "tool_choice": "none"}  # Kimi's template then drops a plain answer's
    body = _chat(
        sim.cfg.model_name, False, **declared
    )  # reasoning (SGLang renders no tools: its parser's split breaks)
    reply = httpx.post(proxy.url + "/v1/chat/completions", json=body).json()["choices"][0]["message"]
    field = "reasoning" if sim.cfg.kind == "vllm" else "reasoning_content"
    assert reply[field]
    faithful = {"role": "assistant", "content": reply["content"], "reasoning_content": reply[field]}
    history = [*QUESTION, faithful, {"role": "user", "content": "And 18 times 3?"}]
    httpx.post(proxy.url + "/v1/chat/completions", json={**body, "messages": history})
    proxy.stop()
    _, two = _stored(proxy.db)
    with Store(proxy.db) as store:
        [(detail,)] = store.query(
            "SELECT detail FROM findings WHERE sample_id = ? AND code = 'session_prefix_break'", [two["sample_id"]]
        )
    assert "The harness sent turn 0's answer back as served. The template re-rendered the history" in detail
    assert "changed" not in detail


def test_header_and_user_name_sessions(sim, proxy) -> None:
    body = _chat(sim.cfg.model_name, False)
    httpx.post(proxy.url + "/v1/chat/completions", json=body, headers={"X-Tokview-Session": "agent-7"})
    httpx.post(proxy.url + "/v1/chat/completions", json=body, headers={"X-Tokview-Session": "agent-7"})
    httpx.post(proxy.url + "/v1/chat/completions", json={**body, "user": "alice"})
    named = [(b"X-Tokview-Session", "séance".encode())]  # UTF-8 bytes, read as latin-1 by HTTP: `sÃ©ance` was stored
    httpx.post(proxy.url + "/v1/chat/completions", json={**body, "max_tokens": 3}, headers=named)
    proxy.stop()
    rows = _stored(proxy.db)
    assert [(r["prompt_id"], r["turn"]) for r in rows] == [
        ("session:agent-7", 0),
        ("session:agent-7", 0),  # the same prompt again: a retry of turn 0, not turn 1 with a break
        ("user:alice", 0),
        ("session:séance", 0),
    ]
    with Store(proxy.db) as store:  # its messages are stored once, in their column: a reader puts them back
        stored = store.load_sample(rows[0]["sample_id"]).capture.raw_request
    assert stored is not None and stored["body"] == body
    assert "x-tokview-session" in stored["headers"]
    assert orjson.loads(rows[0]["raw_request"])["body"]["messages"] is None


async def _answer_recorded_vllm(scope: Any, receive: Any, send: Any) -> None:
    """A vLLM that answers every request with the recorded tool-call answer."""
    from test_proxy_ids import REC

    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    raw = (REC / "vllm_t1.json").read_bytes()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": raw})


def test_answers_are_not_held_back_by_nagles_algorithm(tmp_path, kimi_tok, kimi_profile) -> None:
    """Headers and body go out as two writes: without TCP_NODELAY on the proxy's listening socket (uvicorn
    serving a socket it did not make leaves it off) the body waited for an async client's delayed ACK, 40 ms
    a request (found by the benchmark: p50 48 ms through the proxy, 1 ms direct). The upstream here has
    TCP_NODELAY itself, so only the proxy's leg is timed."""
    import asyncio
    import socket
    import statistics
    import threading
    import time

    import uvicorn

    sock = socket.socket()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    server = uvicorn.Server(uvicorn.Config(_answer_recorded_vllm, log_level="error", lifespan="off"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    upstream = f"http://127.0.0.1:{sock.getsockname()[1]}"
    while not server.started:
        time.sleep(0.005)
    took: dict[str, list[float]] = {"direct": [], "proxy": []}
    body = {"model": "tiny-kimi-tools", "messages": QUESTION}

    async def measure(urls: dict[str, str]) -> None:
        async with httpx.AsyncClient() as client:
            for name, url in urls.items():
                for _ in range(7):
                    started = time.perf_counter()
                    assert (await client.post(url + "/v1/chat/completions", json=body)).status_code == 200
                    took[name].append(time.perf_counter() - started)

    config = ProxyConfig(
        [upstream], listen="127.0.0.1:0", db=None, tokenizer=kimi_tok, profile=kimi_profile, kind="vllm"
    )
    try:
        with start_proxy(config) as proxy:
            asyncio.run(measure({"direct": upstream, "proxy": proxy.url}))
    finally:
        server.should_exit = True
    assert statistics.median(took["proxy"]) - statistics.median(took["direct"]) < 0.02, took


def test_every_answered_request_is_recorded_none_as_abandoned(sim, proxy) -> None:
    """Once the answer's last byte is out, uvicorn's receive() says "disconnect" at once: the proxy read that
    as the client leaving and cancelled the request before it was recorded (some samples went missing, some
    were stored as abandoned)."""
    with httpx.Client() as client:
        for n in range(12):
            body = {**_chat(sim.cfg.model_name, n % 2 == 1), "messages": [{"role": "user", "content": f"q {n}"}]}
            assert client.post(proxy.url + "/v1/chat/completions", json=body).status_code == 200
    proxy.stop()
    rows, failures = _stored(proxy.db), _failures(proxy.db)
    if sim.cfg.kind == "sglang" and not _sglang_streams_ids(sim):  # each stream is a failure saying so
        assert len(rows) == 6
        assert all("no token ids" in f for f in failures)
        assert len(failures) == 6
    else:
        assert len(rows) == 12
        assert failures == []


def test_a_conversation_continues_its_session_across_a_proxy_restart(sim, tmp_path, kimi_tok, kimi_profile) -> None:
    db = str(tmp_path / "p.duckdb")
    prompt = [163587, 455, 163601, 87, 104, 163586, 163588, 400, 163601, 163606]
    body = {"model": sim.cfg.model_name, "max_tokens": 12, "temperature": 0, "return_token_ids": True}
    for _ in range(2):  # two proxy runs on one store, one turn each
        config = ProxyConfig([sim.url], listen="127.0.0.1:0", db=db, tokenizer=kimi_tok, profile=kimi_profile)
        with start_proxy(config) as proxy:
            out = httpx.post(proxy.url + "/v1/completions", json={**body, "prompt": prompt}).json()["choices"][0][
                "token_ids"
            ]
            proxy.stop()
        prompt = prompt + out + [163587, 455, 163601, 88, 163586, 163588, 400, 163601, 163606]
    with Store(db) as store:  # in the order they were made: two runs started in one second sort by their uuids
        (first_session, first_turn), (second_session, second_turn) = store.query(
            "SELECT prompt_id, turn FROM samples ORDER BY created_at"
        )
    assert second_session == first_session
    assert (first_turn, second_turn) == (0, 1)


def test_a_chat_whose_history_the_template_re_renders_continues_its_session_across_a_proxy_restart(
    sim, tmp_path, kimi_tok, kimi_profile
) -> None:
    """Kimi's template drops an earlier turn's reasoning, so the next prompt does not extend the ids of the turn
    before: it joins its session by its messages, which after a restart come from the store."""
    db = str(tmp_path / "m.duckdb")
    messages = [{"role": "user", "content": "What is 17 times 3?"}]
    for _ in range(2):  # two proxy runs on one store, one turn each
        config = ProxyConfig([sim.url], listen="127.0.0.1:0", db=db, tokenizer=kimi_tok, profile=kimi_profile)
        with start_proxy(config) as proxy:
            answer = httpx.post(
                proxy.url + "/v1/chat/completions",
                json={"model": sim.cfg.model_name, "messages": messages, "max_tokens": 40, "temperature": 0},
            ).json()["choices"][0]["message"]
            proxy.stop()
        messages = [*messages, {"role": "assistant", "content": answer["content"]}, {"role": "user", "content": "+1?"}]
    with Store(db) as store:
        rows = store.query("SELECT prompt_id, turn, codes FROM samples ORDER BY created_at")
    assert [(r[0], r[1]) for r in rows] == [(rows[0][0], 0), (rows[0][0], 1)]
    assert "session_prefix_break" in rows[1][2]  # joined by its messages, not by its ids


@pytest.mark.parametrize("stream", [False, True])
def test_an_upstream_that_breaks_off_is_recorded_and_the_client_is_not_handed_a_whole_answer(
    sim, proxy, stream
) -> None:
    from tokview.sim.faults import FaultBook

    sim.state.faults = FaultBook({"drop-connection": 1})
    body = _chat(sim.cfg.model_name, stream)
    try:
        response = httpx.post(proxy.url + "/v1/chat/completions", json=body)
        complete = response.status_code == 200 and (not stream or response.content.endswith(b"data: [DONE]\n\n"))
    except httpx.HTTPError:  # the stream was cut, as the upstream cut it
        complete = False
    assert not complete
    proxy.stop()
    [reason] = _failures(proxy.db)
    assert reason.startswith("the upstream's answer broke off")


def _landed_count(proxy: Any) -> int:
    return proxy.recorder.writer.store.query("SELECT count(*) FROM samples")[0][0]


def test_each_sample_is_in_the_store_at_once_while_the_proxy_runs(sim, proxy) -> None:
    """The app shows a proxied sample as soon as it lands: the writer's ingest timer, checked only when a next
    answer came, left each answer unlanded until then; the Lander lands each part when it is written (within ~0.5 s
    on an idle machine: how soon is the benchmarks' to measure; here only that it lands with no next answer, before
    a generous bound that a loaded CI machine cannot miss)."""
    import time

    with httpx.Client() as client:
        for n in range(3):
            body = {**_chat(sim.cfg.model_name, False), "messages": [{"role": "user", "content": f"live {n}"}]}
            assert client.post(proxy.url + "/v1/chat/completions", json=body).status_code == 200
            answered = time.monotonic()
            while _landed_count(proxy) < n + 1 and time.monotonic() - answered < 15.0:
                time.sleep(0.01)
            took = time.monotonic() - answered
            assert _landed_count(proxy) == n + 1, f"sample {n} not landed {took:.2f} s after its answer"


def test_recording_in_a_child_process_records_every_turn_and_the_loop_process_does_none(
    sim, tmp_path, kimi_tok, kimi_profile
) -> None:
    """`tokview proxy` records in a child of its own (the analysis CPU off the forwarding process): the store must
    hold the same samples, sessions and ids as the in-process recorder's."""
    import os

    db = str(tmp_path / "child.duckdb")
    config = ProxyConfig(
        [sim.url], listen="127.0.0.1:0", db=db, tokenizer=kimi_tok, profile=kimi_profile, record_in="process"
    )
    with start_proxy(config) as proxy, httpx.Client() as client:
        assert isinstance(proxy.recorder, RecorderProcess)
        assert proxy.recorder.process.pid != os.getpid()
        assert proxy.recorder.process.is_alive()
        first = _chat(sim.cfg.model_name, False, user="carol")
        answer = client.post(proxy.url + "/v1/chat/completions", json=first).json()["choices"][0]["message"]
        second = {**_chat(sim.cfg.model_name, True, user="carol")}
        second["messages"] = [*QUESTION, answer, {"role": "user", "content": "And times 4?"}]
        assert client.post(proxy.url + "/v1/chat/completions", json=second).status_code == 200
        proxy.stop()
        assert proxy.recorder.recorded + proxy.recorder.failed == 2
        assert proxy.recorder.recording
    rows = _stored(db)
    if sim.cfg.kind == "sglang" and not _sglang_streams_ids(sim):
        assert len(rows) == 1
        assert len(_failures(db)) == 1
    else:
        assert [(r["prompt_id"], r["turn"]) for r in rows] == [("user:carol", 0), ("user:carol", 1)]
        assert rows[1]["prompt_ids"][: len(rows[0]["prompt_ids"])] == rows[0]["prompt_ids"]


def test_a_burst_bigger_than_the_pipe_reaches_the_recorder_process_whole(tmp_path, kimi_tok, kimi_profile) -> None:
    """16 long streams at once hand the child several MB, each answer (~300 KB) more than a pipe takes in one
    write: the rest waits for the loop to say the pipe is writable, in order, and every answer is recorded."""
    from concurrent.futures import ThreadPoolExecutor

    db = str(tmp_path / "burst.duckdb")
    with start_simulator(SimConfig(kind="vllm", output_tokens=1500)) as sim:
        config = ProxyConfig(
            [sim.url], listen="127.0.0.1:0", db=db, tokenizer=kimi_tok, profile=kimi_profile, record_in="process"
        )
        with start_proxy(config) as proxy:

            def ask(n: int) -> int:
                body = {**_chat(sim.cfg.model_name, True), "messages": [{"role": "user", "content": f"burst {n}"}]}
                body["max_tokens"] = 1500
                return httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=60).status_code

            with ThreadPoolExecutor(16) as pool:
                assert list(pool.map(ask, range(16))) == [200] * 16
            proxy.stop()
            assert proxy.recorder is not None
            assert proxy.recorder.recorded == 16
            assert proxy.recorder.recording
    rows = _stored(db)
    assert len(rows) == 16
    assert _failures(db) == []
    assert all(len(r["output_ids"]) == 1500 for r in rows)


def test_a_stream_the_upstream_aborts_is_a_failure_not_a_sample(sim, proxy) -> None:
    """vLLM's `data: {"error": …}` then `[DONE]`: the chunks before it are a cut-off answer. It was stored as a
    sample (no finish reason, three findings) among the training data."""
    sim.state.faults = FaultBook({"stream-error": 1})
    try:
        through = httpx.post(proxy.url + "/v1/chat/completions", json=_chat(sim.cfg.model_name, True))
    finally:
        sim.state.faults = FaultBook({})
    assert b'"error"' in through.content  # the client gets the upstream's own error chunk
    proxy.stop()
    assert _stored(proxy.db) == []
    [reason] = _failures(proxy.db)
    assert reason.startswith("the upstream aborted the stream after ")
    assert "stream-error" in reason


def test_prompt_ids_a_client_asked_for_by_their_own_flag_reach_it(sim, proxy) -> None:
    """SGLang's `return_prompt_token_ids`: the proxy adds `return_token_ids` and took every id key out again, the
    prompt ids the client had asked for included."""
    body = _chat(sim.cfg.model_name, False, return_prompt_token_ids=True)
    direct = httpx.post(sim.url + "/v1/chat/completions", json=body).content
    through = httpx.post(proxy.url + "/v1/chat/completions", json=body).content
    assert _blank(through) == _blank(direct)
    if sim.cfg.kind == "sglang":
        assert b'"prompt_token_ids":[' in through
    proxy.stop()
    assert len(_stored(proxy.db)) == 1


def test_the_request_goes_upstream_as_the_client_wrote_it(sim, proxy) -> None:
    """The id fields are added to the client's own bytes: re-serialised, a `max_tokens` of NaN went upstream as
    null, and a request the server refuses was answered."""
    body = b'{"model":"%s","messages":[{"role":"user","content":"hi"}],"max_tokens":NaN}' % sim.cfg.model_name.encode()
    headers = {"content-type": "application/json"}
    direct = httpx.post(sim.url + "/v1/chat/completions", content=body, headers=headers)
    through = httpx.post(proxy.url + "/v1/chat/completions", content=body, headers=headers)
    assert through.status_code == direct.status_code == 400
    assert through.content == direct.content
    assert ids.with_fields(b'{"a":1} \n', ("return_token_ids",), empty=False) == b'{"a":1,"return_token_ids":true} \n'
    assert ids.with_fields(b"{ }", ("x", "y"), empty=True) == b'{ "x":true,"y":true}'
    assert ids.with_fields('{"a":1}'.encode("utf-16"), ("x",), empty=False) is None  # re-serialised instead


def test_a_stream_with_one_sglext_flag_of_the_clients_says_why_it_has_no_ids(sim, proxy) -> None:
    if sim.cfg.kind != "sglang":
        pytest.skip("SGLang's flags")
    body = _chat(sim.cfg.model_name, True, return_output_ids_in_sglext=True)
    assert httpx.post(proxy.url + "/v1/chat/completions", json=body).status_code == 200
    proxy.stop()
    [reason] = _failures(proxy.db)
    assert "the client set only return_output_ids_in_sglext itself" in reason


def _text_of_completion(raw: bytes, stream: bool) -> str:
    if not stream:
        return orjson.loads(raw)["choices"][0]["text"]
    chunks = [orjson.loads(e[6:]) for e in raw.split(b"\n\n") if e.startswith(b"data: {")]
    return "".join(c["text"] for chunk in chunks for c in chunk["choices"])


@pytest.mark.parametrize("stream", [False, True])
def test_an_echo_request_keeps_its_echoed_prompt_and_says_why_it_is_not_recorded(sim, proxy, stream) -> None:
    """vLLM empties the echoed prompt text when asked for ids (serving_completion), so the proxy asks for none.
    SGLang keeps it: the proxy asks for ids and records the sample, and the client reads the echo as sent."""
    body = {"model": sim.cfg.model_name, "prompt": "Echo me", "max_tokens": 8, "temperature": 0, "stream": stream}
    direct = httpx.post(sim.url + "/v1/completions", json={**body, "echo": True}).content
    through = httpx.post(proxy.url + "/v1/completions", json={**body, "echo": True}).content
    assert _text_of_completion(through, stream).startswith("Echo me")
    assert _text_of_completion(through, stream) == _text_of_completion(direct, stream)
    if not stream:
        assert _blank(through) == _blank(direct)
    if sim.cfg.kind == "sglang":
        proxy.stop()
        assert _failures(proxy.db) == [] and len(_stored(proxy.db)) == 1
        return
    asked = httpx.post(proxy.url + "/v1/completions", json={**body, "echo": True, "return_token_ids": True}).content
    assert not _text_of_completion(asked, stream).startswith("Echo me"), "the client's own flag: vLLM's answer"
    proxy.stop()
    [reason] = _failures(proxy.db)
    assert "echo" in reason and "vLLM drops the echoed prompt text" in reason
    assert len(_stored(proxy.db)) == 1, "the request that asked for ids itself is recorded"


def test_a_generation_endpoint_the_proxy_does_not_record_is_said_once_and_counted(tmp_path, kimi_tok, kimi_profile):
    """A harness on the Responses API (or Anthropic-style /v1/messages, SGLang's /generate) was forwarded and recorded
    nothing, and nothing said so: the proxy's last line counted only what it recorded."""
    said: list[str] = []
    with start_simulator(SimConfig(kind="vllm")) as sim:
        config = ProxyConfig(
            [sim.url], listen="127.0.0.1:0", db=str(tmp_path / "p.duckdb"), tokenizer=kimi_tok, profile=kimi_profile
        )
        config.say = said.append
        with start_proxy(config) as proxy:
            for path in ("/v1/responses", "/v1/responses", "/v1/messages", "/v1/models"):
                httpx.post(proxy.url + path, json={"model": sim.cfg.model_name, "input": "hi"})
            httpx.get(proxy.url + "/v1/models")
            counted = dict(proxy.app.unrecorded)
    notices = [line for line in said if "NOT recorded" in line]
    assert counted == {"/v1/responses": 2, "/v1/messages": 1}
    assert len(notices) == 2 and "POST /v1/responses forwarded, NOT recorded" in notices[0], said
    assert "/v1/chat/completions" in notices[0]


def test_an_answer_cut_by_the_requests_stop_id_is_stored_invalid(sim, proxy, kimi_profile) -> None:
    """A harness's `stop_token_ids` cut the answer and the server said `finish_reason: "stop"` all the same: it was
    stored valid and exported as a whole turn."""
    served = httpx.post(
        sim.url + "/v1/chat/completions", json=_chat(sim.cfg.model_name, False, return_token_ids=True)
    ).json()["choices"][0]
    whole = served.get("token_ids") or served["response_token_ids"]
    answer = whole[whole.index(kimi_profile.think_close_id) + 1 :]
    cut_at = next(t for t in answer[2:] if t not in kimi_profile.stop_ids)
    through = httpx.post(
        proxy.url + "/v1/chat/completions", json=_chat(sim.cfg.model_name, False, stop_token_ids=[cut_at])
    ).json()
    assert through["choices"][0]["finish_reason"] == "stop"
    proxy.stop()
    [row] = _stored(proxy.db)
    assert row["output_ids"][-1] == cut_at
    assert "stopped_by_request" in row["codes"]
    with Store(proxy.db) as store:
        assert store.query("SELECT valid FROM samples") == [(False,)]


def test_a_requests_query_string_is_stored_with_its_values_masked(sim, proxy) -> None:
    """The stored URL left the query out (an Azure-style `api-version`): kept now, every value masked, since a
    harness may put its key there."""
    body = _chat(sim.cfg.model_name, False)
    url = proxy.url + "/v1/chat/completions?api-version=2024-06-01&api_key=sk-secret-123456"
    assert httpx.post(url, json=body).status_code == 200
    proxy.stop()
    [row] = _stored(proxy.db)
    stored = json.loads(row["raw_request"]) if isinstance(row["raw_request"], str) else row["raw_request"]
    assert stored["url"].endswith("/v1/chat/completions?api-version=[redacted]&api_key=[redacted]")
    assert "sk-secret" not in json.dumps(stored)


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_cut_by_the_requests_stop_string_is_stored_invalid(sim, proxy, stream) -> None:
    """A harness's `stop` string cut the answer (the server names the string: vLLM's `stop_reason`, SGLang's
    `matched_stop`), over real sockets, streamed and not: the sample is `stopped_by_request`, its ids end with the
    id that completed the string, and the client's text was cut before it, as without the proxy."""
    request = _chat(sim.cfg.model_name, stream, stop=["let me", "seven"])
    direct = httpx.post(sim.url + "/v1/chat/completions", json=request)
    through = httpx.post(proxy.url + "/v1/chat/completions", json=request)
    assert through.status_code == direct.status_code == 200
    if not stream:
        choice = through.json()["choices"][0]
        assert choice["finish_reason"] == "stop"
        assert (choice.get("stop_reason") or choice.get("matched_stop")) in ("let me", "seven")
        assert through.json()["choices"] == direct.json()["choices"]
    proxy.stop()
    [row] = _stored(proxy.db)
    assert "stopped_by_request" in row["codes"]


def test_an_sglang_completions_stream_without_ids_says_what_was_asked(tmp_path, kimi_tok, kimi_profile) -> None:
    """SGLang's completions are asked for `return_token_ids` streamed too: a build that sends none is recorded as
    a failure naming that flag (not "the sglext ids", which are chat's), and a client that set one sglext flag
    itself there is asked for ids all the same (the flag is no field of completions), not told the proxy asked none."""
    with start_simulator(SimConfig(kind="sglang", quirks={"no-id-fields": True})) as sim:
        db = str(tmp_path / "n.duckdb")
        config = ProxyConfig([sim.url], listen="127.0.0.1:0", db=db, tokenizer=kimi_tok, profile=kimi_profile)
        with start_proxy(config) as proxy:
            body = {"model": sim.cfg.model_name, "prompt": "Hi", "max_tokens": 4, "temperature": 0, "stream": True}
            for extra in ({}, {"return_input_ids_in_sglext": True}):
                assert httpx.post(proxy.url + "/v1/completions", json={**body, **extra}).status_code == 200
            proxy.stop()
    assert _failures(db) == ["the upstream returned no token ids on completions (stream) (return_token_ids asked)"] * 2
