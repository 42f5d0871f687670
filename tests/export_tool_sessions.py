"""A tool-calling conversation recorded by `tokview proxy` against the simulated vLLM (kimi_k2 tool parser), for
the tool and trajectory export tests: turn 0 calls a tool, turn 1 (its reasoning and call sent back, the result
appended) answers in text, turn 2 (after a new user turn) calls again. The Kimi template drops the loop's
reasoning once a plain answer follows, so turn 2's prompt does not extend turn 1's prompt + output ids."""

from __future__ import annotations

import dataclasses
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from tokview.proxy.serve import ProxyConfig, start_proxy
from tokview.sim.config import SimConfig
from tokview.sim.server import start_simulator
from tokview.store import Store

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
SESSION = "weather"


def record_tool_session(
    db: Path, tokenizer: Any, profile: Any, restart_before: int | None = None
) -> list[dict[str, Any]]:
    """Run the three turns through the proxy; return each answer's message, in turn order. `restart_before`: the
    turn before which the proxy stops and a new one (a run of its own, on the same store) takes over."""
    answers = []
    with start_simulator(SimConfig(kind="vllm")) as sim, ExitStack() as running:
        config = ProxyConfig([sim.url], listen="127.0.0.1:0", db=str(db), tokenizer=tokenizer, profile=profile)
        proxy = running.enter_context(start_proxy(config))
        messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Paris?"}]
        for turn in range(3):
            if turn == restart_before:
                running.close()
                config = dataclasses.replace(config, run_id=f"{config.run_id}-restarted")
                proxy = running.enter_context(start_proxy(config))
            body = {"model": sim.cfg.model_name, "messages": messages, "tools": TOOLS, "max_tokens": 300}
            answer = httpx.post(
                proxy.url + "/v1/chat/completions",
                json={**body, "temperature": 0},
                headers={"X-Tokview-Session": SESSION},
            ).json()["choices"][0]["message"]
            answers.append(answer)
            sent = {"role": "assistant", "content": answer.get("content"), "reasoning_content": answer["reasoning"]}
            if answer.get("tool_calls"):
                results = [
                    {"role": "tool", "tool_call_id": c["id"], "content": "sunny, 21 degrees"}
                    for c in answer["tool_calls"]
                ]
                messages = [*messages, {**sent, "tool_calls": answer["tool_calls"]}, *results]
            else:
                messages = [*messages, sent, {"role": "user", "content": "And in Rome?"}]
    return answers


def stored_turns(db: Path) -> list[dict[str, Any]]:
    with Store(db) as store:
        rows = store.query("SELECT sample_id, turn, prompt_ids, output_ids FROM samples ORDER BY turn")
    return [{"sample_id": r[0], "turn": r[1], "prompt_ids": list(r[2]), "output_ids": list(r[3])} for r in rows]
