"""The agent harness in the fast tier: a scripted agent on the `openai` client (tests/agent_harness.py) runs the
same tasks directly against the simulated vLLM (kimi_k2 tool parser emulated: several calls per turn, several
rounds) and through `tokview proxy`: its transcript must be identical both ways, and the store must hold every
request it made, token-exact (asked again of the simulator with the stored body), grouped into one session per
task whose turns extend each other."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from agent_harness import TOOLS, Task, run_tasks, run_tool

from tokview.proxy.serve import ProxyConfig, start_proxy
from tokview.sim.config import SimConfig
from tokview.sim.server import start_simulator
from tokview.store import Store

ROUNDS = 2
TASKS = [
    Task("arith", "Compute with your tools: add, multiply and count.", ("add", "multiply", "word_count")),
    Task("arith-stream", "Compute again, streaming, with all three tools.", ("add", "multiply", "word_count"), True),
    Task("weather", "What is the weather in Paris?", ("get_weather",)),
    Task("weather-stream", "And the weather in Rome, streamed?", ("get_weather",), True),
]


@pytest.fixture(scope="module")
def sim() -> Iterator[Any]:
    quirks = {"tool-calls": "each", "tool-rounds": ROUNDS}
    with start_simulator(SimConfig(kind="vllm", quirks=quirks)) as running:
        yield running


def _stored(db: str) -> list[dict[str, Any]]:
    keys = ("sample_id", "prompt_id", "turn", "prompt_ids", "output_ids", "codes", "raw_request")
    with Store(db) as store:
        rows = store.query(f"SELECT {', '.join(keys)} FROM samples ORDER BY prompt_id, turn")
        calls = {r.sample_id: r.capture.tool_calls for r in map(store.load_sample, [row[0] for row in rows])}
    return [{**dict(zip(keys, row)), "tool_calls": calls[row[0]]} for row in rows]


def test_the_tools_really_compute() -> None:
    assert run_tool("add", '{"a": 2, "b": 40}') == "42"
    assert run_tool("multiply", '{"a": 6, "b": 7}') == "42"
    assert run_tool("word_count", '{"text": "one two three"}') == "3"
    assert run_tool("get_weather", '{"city": "Paris"}') == '"rainy, 21 degrees"'  # 511 % 35, len 5 % 3
    assert run_tool("nope", "{}").startswith("error")
    assert run_tool("add", "{bad").startswith("error")


def test_the_agent_gives_the_same_transcript_through_the_proxy_and_every_request_is_stored_exact(
    sim, tmp_path, kimi_tok, kimi_profile
) -> None:
    model = sim.cfg.model_name
    direct = run_tasks(sim.url + "/v1", model, TASKS)
    db = str(tmp_path / "agent.duckdb")
    config = ProxyConfig([sim.url], listen="127.0.0.1:0", db=db, tokenizer=kimi_tok, profile=kimi_profile)
    with start_proxy(config) as proxy:
        through = run_tasks(proxy.url + "/v1", model, TASKS)
    assert [t.rounds for t in through] == [t.rounds for t in direct]

    # The loop really ran: several rounds, parallel calls in the three-tool tasks, every call answered.
    for t in direct:
        assert len(t.rounds) == ROUNDS + 1, t
        assert t.answer, t
        assert all(r["finish_reason"] == "tool_calls" for r in t.rounds[:-1])
        assert t.rounds[-1]["tool_calls"] == []
    assert [t.parallel_rounds for t in direct] == [ROUNDS, ROUNDS, 0, 0]
    first = direct[0].rounds[0]
    assert [c["name"] for c in first["tool_calls"]] == ["add", "multiply", "word_count"]
    assert first["results"] == [run_tool(c["name"], c["arguments"]) for c in first["tool_calls"]]
    assert all(r.startswith("error") is False for t in direct for rnd in t.rounds for r in rnd["results"])

    rows = _stored(db)
    assert len(rows) == sum(t.requests for t in through) == len(TASKS) * (ROUNDS + 1)
    sessions: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        sessions.setdefault(row["prompt_id"], []).append(row)
    assert len(sessions) == len(TASKS), "one session per task, reconstructed by prefix"
    for turns in sessions.values():
        assert [r["turn"] for r in turns] == list(range(ROUNDS + 1))
        for previous, row in itertools.pairwise(turns):
            n = len(previous["prompt_ids"]) + len(previous["output_ids"])
            assert row["prompt_ids"][:n] == previous["prompt_ids"] + previous["output_ids"]
            assert "session_prefix_break" not in row["codes"]
    for row in rows:  # token-exact: the simulator serves the same ids for the stored request again
        body = {
            k: v for k, v in orjson_loads(row["raw_request"])["body"].items() if k not in ("stream", "stream_options")
        }
        again = httpx.post(sim.url + "/v1/chat/completions", json={**body, "return_token_ids": True}, timeout=30).json()
        choice = again["choices"][0]
        assert row["prompt_ids"] == again["prompt_token_ids"]
        assert row["output_ids"] == choice["token_ids"]
        served = [
            {"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
            for c in choice["message"].get("tool_calls") or []
        ]
        assert (row["tool_calls"] or []) == served
    by_task = {t.task: t for t in through}
    assert sum(len(r["tool_calls"] or []) for r in rows) == sum(by_task[t.name].tool_calls for t in TASKS)
    assert {name for name in TOOLS} >= {c["name"] for r in rows for c in r["tool_calls"] or []}


def orjson_loads(raw: Any) -> Any:
    import orjson

    return orjson.loads(raw) if isinstance(raw, (str, bytes)) else raw
