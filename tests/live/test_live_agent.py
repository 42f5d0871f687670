"""Issue 24 item 7 on the real server: the scripted `openai`-client agent (tests/agent_harness.py) runs the same
tasks directly against real vLLM 0.32 (the tiny tool model, kimi_k2 parsers) and through `tokview proxy`. Its
transcript must be identical both ways (the tool really runs here and its result goes back), and the store must
hold every request token-exact (the server serves the stored body's ids again), one session per task, each turn's
prompt the previous prompt + output ids + the tool turn."""

from __future__ import annotations

import httpx
import pytest
from agent_harness import Task, run_tasks, run_tool

from live.tools_live import BENIGN, MODEL, body_of, profile, served_ids, tokenizer, tool_model, tool_turn_ids
from tokview.proxy.serve import ProxyConfig, start_proxy
from tokview.store import Store

pytestmark = pytest.mark.live

TASKS = [
    Task("weather", "What is the weather in Paris?", ("get_weather",)),
    Task("weather-stream", "Paris weather, streamed please?", ("get_weather",), True),
    Task("weather-many-tools", "Weather in Paris, and sums if you need them?", ("get_weather", "add", "multiply")),
]


def test_the_agent_gives_the_same_transcript_through_the_proxy_on_real_vllm(tmp_path, tools_server) -> None:
    model = tool_model(tools_server)
    direct = run_tasks(model.url + "/v1", MODEL, TASKS)
    db = str(tmp_path / "agent.duckdb")
    config = ProxyConfig([model.url], listen="127.0.0.1:0", db=db, tokenizer=tokenizer(model.dir), profile=profile())
    with start_proxy(config) as proxy:
        through = run_tasks(proxy.url + "/v1", MODEL, TASKS)
    assert [t.rounds for t in through] == [t.rounds for t in direct]
    result = run_tool("get_weather", model.texts["call_arguments"])
    for t in direct:  # the loop really ran: a call, the local tool's result sent back, then the text answer
        [call_round, answer_round] = t.rounds
        assert call_round["tool_calls"] == [model.served_call] and call_round["results"] == [result]
        assert call_round["reasoning"] == model.texts["call_reasoning"] and call_round["finish_reason"] == "tool_calls"
        assert (answer_round["content"], answer_round["finish_reason"]) == (model.texts["answer"], "stop")

    with Store(db) as store:
        rows = store.query("SELECT sample_id, prompt_id, turn FROM samples ORDER BY prompt_id, turn")
        samples = [store.load_sample(r[0]) for r in rows]
    assert len(samples) == sum(t.requests for t in through) == 2 * len(TASKS)
    sessions: dict[str, list] = {}
    for (_, session, _), sample in zip(rows, samples, strict=True):
        sessions.setdefault(session, []).append(sample)
    assert len(sessions) == len(TASKS), "one session per task, reconstructed by prefix"
    for call, answer in sessions.values():
        assert (call.turn, answer.turn) == (0, 1)
        assert call.capture.output_ids == model.call_ids and answer.capture.output_ids == model.answer_ids
        assert call.capture.tool_calls == [model.served_call]
        turn = tool_turn_ids(model.dir, model.texts["call_id"], result)
        assert answer.capture.prompt_ids == call.capture.prompt_ids + call.capture.output_ids + turn
    for sample in samples:
        body = {k: v for k, v in body_of(sample.capture.raw_request).items() if k not in ("stream", "stream_options")}
        again = httpx.post(model.url + "/v1/chat/completions", json={**body, "return_token_ids": True}, timeout=60)
        assert (sample.capture.prompt_ids, sample.capture.output_ids) == served_ids(again.json())
        assert {f.code for f in sample.findings} <= BENIGN, [(f.code, f.detail) for f in sample.findings]
