"""The live tier for agent traces: real vLLM 0.32 serving the tiny Kimi-layout tool model
(make_tiny_kimi.py `tools`) with `--reasoning-parser kimi_k2 --tool-call-parser kimi_k2
--enable-auto-tool-choice`, driven through `tokview batch` (a two-turn chain with `--history served`) and
`tokview proxy` (streamed and not, then an explicit second turn). The weights fix the output: turn 1 is
reasoning, `</think>` and a call to `functions.get_weather:0`; once a tool result is in the prompt, a text answer.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from live.make_tiny_kimi import TOOL_QUESTION, TOOL_RESULT, WEATHER_TOOL
from live.tools_live import (
    BENIGN,
    MODEL,
    ToolModel,
    ask,
    body_of,
    calls_on_ids,
    profile,
    served_calls,
    served_ids,
    tokenizer,
    tool_model,
    tool_turn_ids,
    tool_turns,
)
from tokview.cli import main
from tokview.errors import ExitCode
from tokview.proxy.serve import ProxyConfig, start_proxy
from tokview.store import Store

pytestmark = pytest.mark.live
RECORD_ENV = "TOKVIEW_LIVE_TOOLS_RECORD"
_VARYING = re.compile(rb'"id":"chatcmpl-[^"]*"|"created":\d+')


@pytest.fixture(scope="module")
def model(tools_server) -> ToolModel:
    return tool_model(tools_server)


def _batch(tmp_path: Path, model: ToolModel, rows: list[dict], *extra: str) -> tuple[int, dict, Store]:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    db = tmp_path / "s.duckdb"
    args = ["batch", str(prompts), "--server", model.url, "--db", str(db), "--tokenizer", model.dir]
    args += ["--mode", "chat", "--temperature", "0", "--max-new-tokens", "64", "--workers", "1", "--summary-json"]
    return main([*args, *extra]), {}, Store(str(db))


def _chain(store: Store, prompt_id: str) -> list[Any]:
    ids = [r[0] for r in store.query("SELECT sample_id FROM samples WHERE prompt_id = ? ORDER BY turn", [prompt_id])]
    return [store.load_sample(i) for i in ids]


def _clean(sample: Any) -> None:
    """No false findings on a clean answer: only the two info findings every Kimi answer carries."""
    assert {f.code for f in sample.findings} <= BENIGN, [(f.code, f.detail) for f in sample.findings]


def test_the_model_calls_the_tool_then_answers_on_the_real_server(model: ToolModel) -> None:
    first, second = tool_turns()
    one = ask(model.url, first)
    message = one["choices"][0]["message"]
    assert served_ids(one)[1] == model.call_ids
    assert one["choices"][0]["finish_reason"] == "tool_calls"
    assert served_calls(message) == [model.served_call] == calls_on_ids(model.dir, model.call_ids)
    assert message["reasoning"] == model.texts["call_reasoning"]
    assert not message["content"]
    two = ask(model.url, second)
    assert served_ids(two)[1] == model.answer_ids
    assert two["choices"][0]["finish_reason"] == "stop"
    assert two["choices"][0]["message"]["content"] == model.texts["answer"]
    assert two["choices"][0]["message"]["reasoning"] == model.texts["answer_reasoning"]
    assert not two["choices"][0]["message"].get("tool_calls")
    p1, o1 = served_ids(one)
    assert served_ids(two)[0] == p1 + o1 + tool_turn_ids(model.dir, model.texts["call_id"]), "§6: the real template"
    record = os.environ.get(RECORD_ENV)
    if record:  # .ci/live_tools.sh prints this for the closing note
        Path(record).write_text(
            json.dumps(
                {
                    "turn1": {"prompt_len": len(p1), "output_ids": o1, "tool_calls": served_calls(message)},
                    "turn2": {"prompt_len": len(served_ids(two)[0]), "output_ids": served_ids(two)[1]},
                }
            )
            + "\n",
            encoding="utf-8",
        )


def test_doctor_passes_the_tool_parser_and_a_streamed_call_on_the_real_server(model: ToolModel, capsys) -> None:
    """The doctor's tool probe (get_weather declared) gets the model's call parsed as the ids hold it, and the same
    request streamed as `tokview proxy` forwards it (`return_token_ids`) carries every id of the unstreamed one."""
    main(["doctor", "--server", model.url, "--tokenizer", model.dir, "--json"])
    checks = {c["title"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    tools, stream = checks["Tool-call parser"], checks["Streamed ids (tokview proxy)"]
    assert tools["ok"] is True, tools
    assert "returned get_weather: the 1 call the ids hold" in tools["detail"], tools
    assert stream["ok"] is True, stream
    assert stream["detail"].startswith("a streamed answer with a tool call records the same "), stream


def test_batch_regenerates_the_two_turn_trace_as_a_chain_token_exact(tmp_path, model: ToolModel, capsys) -> None:
    """`--history served`: turn 0 is served, its call (the file's call id replaced by the served one) and the
    file's result become turn 1's history, whose prompt is the previous prompt + output ids + tool turn + gen prompt."""
    file_call = {
        "id": "call_7",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
    }
    row = {
        "id": "weather",
        "tools": [WEATHER_TOOL],
        "messages": [
            {"role": "user", "content": TOOL_QUESTION},
            {"role": "assistant", "content": "", "reasoning_content": "file reasoning", "tool_calls": [file_call]},
            {"role": "tool", "tool_call_id": "call_7", "content": TOOL_RESULT},
            {"role": "assistant", "content": "The file's answer."},
        ],
    }
    code, _, store = _batch(tmp_path, model, [row], "--history", "served")
    summary = json.loads(capsys.readouterr().out)
    assert code == ExitCode.OK, summary
    assert summary["ok"] == 2, summary
    assert summary["chain_stopped"] == 0, summary
    with store:
        call, answer = _chain(store, "weather")
    assert call.capture.output_ids == model.call_ids
    assert answer.capture.output_ids == model.answer_ids
    assert call.capture.tool_calls == [model.served_call] == calls_on_ids(model.dir, call.capture.output_ids)
    assert answer.capture.tool_calls in (None, [])
    assert answer.capture.content == model.texts["answer"]
    expected = call.capture.prompt_ids + call.capture.output_ids + tool_turn_ids(model.dir, model.texts["call_id"])
    assert answer.capture.prompt_ids == expected
    assert answer.capture.settings["chain"]["extends"] is True
    for sample in (call, answer):  # token-exact: the server serves these ids for the stored body again
        again = httpx.post(
            model.url + "/v1/chat/completions", json={**body_of(sample.capture.raw_request), "return_token_ids": True}
        ).json()
        assert (sample.capture.prompt_ids, sample.capture.output_ids) == served_ids(again)
        _clean(sample)


def _stream_said(body: bytes) -> tuple[str, str, str, str | None, list[str]]:
    """What a chat stream says, whatever its chunking: reasoning, content, the calls' id, name and arguments
    (concatenated), the finish reason, and the keys of every chunk's choice (the shape a client reads)."""
    reasoning = content = calls = ""
    finish, shapes = None, set()
    for line in body.decode().splitlines():
        if not line.startswith("data: {"):
            continue
        for choice in json.loads(line[6:]).get("choices") or []:
            shapes.add(",".join(sorted(choice)))
            delta = choice.get("delta") or {}
            reasoning += delta.get("reasoning") or ""
            content += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                fn = call.get("function") or {}
                calls += (call.get("id") or "") + (fn.get("name") or "") + (fn.get("arguments") or "")
            finish = choice.get("finish_reason") or finish
    return reasoning, content, calls, finish, sorted(shapes)


@pytest.mark.parametrize("stream", [False, True])
def test_proxy_answers_the_tool_call_as_the_server_does_and_stores_it_exact(tmp_path, model, stream) -> None:
    first, _ = tool_turns()
    body = {"model": MODEL, "messages": first, "tools": [WEATHER_TOOL], "temperature": 0, "max_tokens": 64}
    body["stream"] = stream
    direct = httpx.post(model.url + "/v1/chat/completions", json=body, timeout=60).content
    db = str(tmp_path / "p.duckdb")
    config = ProxyConfig([model.url], listen="127.0.0.1:0", db=db, tokenizer=tokenizer(model.dir), profile=profile())
    with start_proxy(config) as proxy:
        through = httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=60)
    assert through.status_code == 200
    if stream:  # vLLM merges the deltas of ids generated while a chunk waits to be sent: chunking is timing's
        assert _stream_said(through.content) == _stream_said(direct)
    else:
        assert _VARYING.sub(b"", through.content) == _VARYING.sub(b"", direct)
    assert b'token_ids":[' not in through.content, "the ids the proxy asked for are not handed to the client"
    with Store(db) as store:
        [(sid,)] = store.query("SELECT sample_id FROM samples")
        sample = store.load_sample(sid)
    p1, o1 = served_ids(ask(model.url, first))
    assert (sample.capture.prompt_ids, sample.capture.output_ids) == (p1, o1)
    assert o1 == model.call_ids
    assert sample.capture.tool_calls == [model.served_call]
    _clean(sample)


def test_proxy_groups_an_explicit_second_turn_by_prefix(tmp_path, model: ToolModel) -> None:
    first, _ = tool_turns()
    db = str(tmp_path / "p.duckdb")
    config = ProxyConfig([model.url], listen="127.0.0.1:0", db=db, tokenizer=tokenizer(model.dir), profile=profile())
    base = {"model": MODEL, "tools": [WEATHER_TOOL], "temperature": 0, "max_tokens": 64}
    with start_proxy(config) as proxy:
        reply = httpx.post(proxy.url + "/v1/chat/completions", json={**base, "messages": first}, timeout=60).json()
        message = reply["choices"][0]["message"]
        history = [
            *first,
            {
                "role": "assistant",
                "content": message["content"],
                "tool_calls": message["tool_calls"],
                "reasoning_content": message["reasoning"],
            },
            {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": TOOL_RESULT},
        ]
        final = httpx.post(proxy.url + "/v1/chat/completions", json={**base, "messages": history}, timeout=60).json()
    assert final["choices"][0]["message"]["content"] == model.texts["answer"]
    with Store(db) as store:
        ids = [r[0] for r in store.query("SELECT sample_id FROM samples ORDER BY turn")]
        one, two = (store.load_sample(i) for i in ids)
        [sessions] = store.query("SELECT count(DISTINCT prompt_id) FROM samples")[0]
    assert sessions == 1
    assert (one.turn, two.turn) == (0, 1)
    assert two.capture.prompt_ids == (
        one.capture.prompt_ids + one.capture.output_ids + tool_turn_ids(model.dir, model.texts["call_id"])
    )
    assert two.capture.output_ids == model.answer_ids
    _clean(one)
    _clean(two)
