"""The agent harness on the real server: the scripted `openai`-client agent (tests/agent_harness.py) runs the same
tasks directly against real vLLM 0.32 and through `tokview proxy`. The server runs the tiny *agent* model
(make_tiny_kimi.py `agent`, kimi_k2 reasoning and tool parsers): two parallel calls (get_weather, square), a
second round (square), then a text answer. The tools run here and really compute; their results go back. The
transcript must be identical both ways, and the store must hold every request token-exact (the server serves
the stored body's ids again), one session per task whose turns extend each other, each sample's tool_calls the
calls on its ids, and no finding beyond the two informational ones every Kimi answer carries."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import httpx
import pytest
from agent_harness import Task, run_tasks, run_tool

from live.make_tiny_kimi import MODEL_INFO
from live.tools_live import BENIGN, body_of, calls_on_ids, profile, served_ids, tokenizer
from tokview.proxy.serve import ProxyConfig, start_proxy
from tokview.store import Store

pytestmark = pytest.mark.live
MODEL = "tiny-kimi-agent"
TOOLS = ("get_weather", "square")
TASKS = [
    Task("weather-square", "What is the weather in Paris?", TOOLS),
    Task("weather-square-stream", "Paris weather, streamed please?", TOOLS, True),
    Task("with-more-tools-stream", "Once more, streamed, with every tool?", (*TOOLS, "add", "multiply"), True),
]
"""Three tasks of three requests, each sent directly, through the proxy and once more to check the stored ids: 27
requests of 300-470 prompt ids on two CPU cores (no prefix cache), the live tier's slowest test, so no more."""


def _planned(model_dir: str) -> tuple[list[list[int]], list[list[dict[str, str]]]]:
    info = json.loads((Path(model_dir) / MODEL_INFO).read_text(encoding="utf-8"))
    calls = [
        [{"id": cid, "name": cid.split(".")[1].split(":")[0], "arguments": args} for cid, args in rnd]
        for rnd in info["calls"]
    ]
    return info["turn_output_ids"], calls


def test_the_agent_gives_the_same_transcript_through_the_proxy_on_real_vllm(tmp_path, agent_server) -> None:
    url, model_dir = agent_server
    turn_ids, planned = _planned(model_dir)
    direct = run_tasks(url + "/v1", MODEL, TASKS)
    db = str(tmp_path / "agent.duckdb")
    config = ProxyConfig([url], listen="127.0.0.1:0", db=db, tokenizer=tokenizer(model_dir), profile=profile())
    with start_proxy(config) as proxy:
        through = run_tasks(proxy.url + "/v1", MODEL, TASKS)
    assert [t.rounds for t in through] == [t.rounds for t in direct]
    for t in direct:  # the loop really ran: two parallel calls, a second round, the text answer
        assert [r["tool_calls"] for r in t.rounds] == [*planned, []], t
        assert [r["results"] for r in t.rounds] == [
            [run_tool(c["name"], c["arguments"]) for c in calls] for calls in [*planned, []]
        ]
        assert t.rounds[0]["results"] == ['"rainy, 21 degrees"', "49"]
        assert t.rounds[1]["results"] == ["81"]
        assert [r["finish_reason"] for r in t.rounds] == ["tool_calls", "tool_calls", "stop"]
        assert t.answer == "It is sunny today!"
        assert t.parallel_rounds == 1

    with Store(db) as store:
        rows = store.query("SELECT sample_id, prompt_id, turn FROM samples ORDER BY prompt_id, turn")
        samples = [store.load_sample(r[0]) for r in rows]
    assert len(samples) == sum(t.requests for t in through) == 3 * len(TASKS)
    sessions: dict[str, list] = {}
    for (_, session, _), sample in zip(rows, samples, strict=True):
        sessions.setdefault(session, []).append(sample)
    assert len(sessions) == len(TASKS), "one session per task, reconstructed by prefix"
    for turns in sessions.values():
        assert [s.turn for s in turns] == [0, 1, 2]
        assert [s.capture.output_ids for s in turns] == turn_ids
        for previous, sample in itertools.pairwise(turns):
            served = previous.capture.prompt_ids + previous.capture.output_ids
            assert sample.capture.prompt_ids[: len(served)] == served
    for sample in samples:
        assert (sample.capture.tool_calls or []) == calls_on_ids(model_dir, sample.capture.output_ids)
        body = {k: v for k, v in body_of(sample.capture.raw_request).items() if k not in ("stream", "stream_options")}
        again = httpx.post(url + "/v1/chat/completions", json={**body, "return_token_ids": True}, timeout=60)
        assert (sample.capture.prompt_ids, sample.capture.output_ids) == served_ids(again.json())
        assert {f.code for f in sample.findings} <= BENIGN, [(f.code, f.detail) for f in sample.findings]
