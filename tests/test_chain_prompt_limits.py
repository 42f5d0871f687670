"""An agent trace's prompt is measured against the server's context with its tools, as the server renders it.

The tool declarations are part of the prompt (`prompt_render_mismatch` and the servers render them), so a
prompt that fits only without them is recorded `over_max_length` unsent rather than refused by the server;
and the length check's render is the one the finding reuses from the recent renders."""

from __future__ import annotations

import json

from builders import kimi, profile

from tokview.batch import BatchConfig, run_batch
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store

LIMIT = 400
BIG_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a word up. " * 60,  # ~1,000 ids of tool_declare: over LIMIT only with it
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
    },
}


async def test_a_prompt_over_the_context_only_with_its_tools_is_failed_unsent(tmp_path):
    row = {"id": "tools", "tools": [BIG_TOOL], "messages": [{"role": "user", "content": "Look up 'drafter'."}]}
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps(row) + "\n")
    with start_simulator(SimConfig(kind="vllm", max_model_len=LIMIT)) as sim:
        config = BatchConfig(
            servers=[sim.url],
            prompts_path=prompts,
            tokenizer=kimi(),
            model_profile=profile(),
            mode="chat",
            max_new_tokens=20,
            timeout=10.0,
        )
        with Store(tmp_path / "s.duckdb") as store:
            summary = await run_batch(config, store)
            reasons = dict(store.query("SELECT prompt_id, reason FROM failures"))
        sent = sim.stats.requests.get("/v1/chat/completions", 0)
    assert summary.failed == 1 and summary.balanced
    assert reasons["tools"].startswith("over_max_length: the prompt has "), reasons
    assert sent == 1, "the probe's request only: measured with its tools, the prompt is not sent"
