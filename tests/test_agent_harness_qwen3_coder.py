"""The agent harness against a Qwen3-Coder / Qwen3.5-style model (XML tool calls, the `qwen3_coder` layout) on the
simulated SGLang, directly and through `tokview proxy`: the same transcript both ways, every request a token-exact
sample whose calls on the ids agree with the served `tool_calls`, one session per task whose turns extend each
other with no finding."""

from __future__ import annotations

import itertools
from typing import Any

import httpx
from agent_harness import TOOLS, Task, run_tasks
from test_agent_harness_sim import _stored, orjson_loads

from tokview.core.profiles import detect_profile
from tokview.core.tool_calls import parse_tool_calls
from tokview.proxy.serve import ProxyConfig, start_proxy
from tokview.sim.config import SimConfig
from tokview.sim.server import start_simulator

ROUNDS = 2
TASKS = [
    Task("arith", "Compute with your tools: add, multiply and count.", ("add", "multiply", "word_count")),
    Task("weather-stream", "And the weather in Rome, streamed?", ("get_weather",), True),
]


def _without_call_ids(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """SGLang names each call `call_<random hex>`: the rest of the transcript must be the same."""
    return [{**r, "tool_calls": [{**c, "id": None} for c in r["tool_calls"]]} for r in rounds]


def test_a_qwen3_coder_agent_through_the_proxy_is_stored_exact_with_its_calls_checked(
    tmp_path,
    coder_dir,
    coder_tok,
) -> None:
    quirks = {"tool-calls": "each", "tool-rounds": ROUNDS}
    with start_simulator(SimConfig(kind="sglang", tokenizer_dir=coder_dir, quirks=quirks)) as sim:
        model = sim.cfg.model_name
        direct = run_tasks(sim.url + "/v1", model, TASKS)
        db = str(tmp_path / "agent.duckdb")
        profile = detect_profile(coder_tok)
        config = ProxyConfig([sim.url], listen="127.0.0.1:0", db=db, tokenizer=coder_tok, profile=profile)
        with start_proxy(config) as proxy:
            through = run_tasks(proxy.url + "/v1", model, TASKS)
        assert [_without_call_ids(t.rounds) for t in through] == [_without_call_ids(t.rounds) for t in direct]
        assert [len(t.rounds) for t in direct] == [ROUNDS + 1] * len(TASKS)
        assert [c["name"] for c in direct[0].rounds[0]["tool_calls"]] == ["add", "multiply", "word_count"]
        rows = _stored(db)
        assert len(rows) == len(TASKS) * (ROUNDS + 1)
        for row in rows:
            assert set(row["codes"]) <= {"parser_hidden_ids"}, row["codes"]  # info: the markers no field carries
            body = {k: v for k, v in orjson_loads(row["raw_request"])["body"].items() if k != "stream"}
            body.pop("stream_options", None)
            again = httpx.post(sim.url + "/v1/chat/completions", json={**body, "return_token_ids": True}, timeout=30)
            choice = again.json()["choices"][0]
            assert (row["prompt_ids"], row["output_ids"]) == (choice["prompt_token_ids"], choice["response_token_ids"])
    layout = detect_profile(coder_tok).tool_calls
    assert layout is not None
    for row in rows:  # the calls the proxy stored are the calls on the ids, read as the qwen3_coder parser reads them
        on_ids = parse_tool_calls(row["output_ids"], layout, coder_tok, [TOOLS[n][0] for n in TOOLS]).calls
        assert [(c["name"], c["arguments"]) for c in row["tool_calls"] or []] == [(c.name, c.arguments) for c in on_ids]
    assert sum(len(r["tool_calls"] or []) for r in rows) == sum(t.tool_calls for t in through) > 0
    sessions: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        sessions.setdefault(row["prompt_id"], []).append(row)
    assert len(sessions) == len(TASKS)
    for turns in sessions.values():
        for previous, row in itertools.pairwise(turns):
            n = len(previous["prompt_ids"]) + len(previous["output_ids"])
            assert row["prompt_ids"][:n] == previous["prompt_ids"] + previous["output_ids"]
