"""An assistant prefill through the proxy: `continue_final_message: true, add_generation_prompt: false`, the request's
last message the assistant's own start, which the answer goes on from (vLLM renders it open).

The proxy recorded neither flag, so the local render (always with the generation prompt) flagged every prefill with a
false `prompt_render_mismatch`; and the text exports wrote the prefill and the answer as two assistant turns, which a
trainer renders as a closed turn and a second one that was never served."""

from __future__ import annotations

import json

import httpx
import pytest

from tokview.cli import main
from tokview.proxy.serve import ProxyConfig, start_proxy
from tokview.sim.config import SimConfig
from tokview.sim.server import start_simulator
from tokview.store import Store

PREFILL = "The answer, in one word:"
GREETING = "Hello, how can I help?"
"""A history that ends with the assistant's closed turn, no prefill: the answer is a turn of its own."""


@pytest.fixture
def recorded(tmp_path, kimi_tok, kimi_profile):
    """A store holding one plain turn and one prefilled turn of the same conversation, and the prefilled request."""
    db = str(tmp_path / "p.duckdb")
    with start_simulator(SimConfig(kind="vllm")) as sim:
        config = ProxyConfig([sim.url], listen="127.0.0.1:0", db=db, tokenizer=kimi_tok, profile=kimi_profile)
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        body = {"model": sim.cfg.model_name, "messages": messages, "max_tokens": 30, "temperature": 0}
        prefilled = {
            **body,
            "messages": [*messages, {"role": "assistant", "content": PREFILL}],
            "continue_final_message": True,
            "add_generation_prompt": False,
        }
        with start_proxy(config) as proxy:
            assert httpx.post(proxy.url + "/v1/chat/completions", json=body).status_code == 200
            answer = httpx.post(proxy.url + "/v1/chat/completions", json=prefilled)
            assert answer.status_code == 200, answer.text
            both = {**prefilled, "add_generation_prompt": True}
            assert httpx.post(proxy.url + "/v1/chat/completions", json=both).status_code == 400  # as vLLM refuses
            greeted = {
                **body,
                "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": GREETING}],
            }
            assert httpx.post(proxy.url + "/v1/chat/completions", json=greeted).status_code == 200  # a new turn
    return db, prefilled


def test_a_prefill_is_rendered_as_the_server_rendered_it_no_false_mismatch(recorded, kimi_tok) -> None:
    db, prefilled = recorded
    with Store(db) as store:
        rows = store.query("SELECT sample_id, codes, prompt_len FROM samples ORDER BY sample_id")
        [prefill_id] = [
            sid for sid, _, _ in rows if "continue_final_message" in json.dumps(store.load_sample(sid).capture.settings)
        ]
        sample = store.load_sample(prefill_id)
    assert len(rows) == 3
    for _, codes, _ in rows:
        assert "prompt_render_mismatch" not in codes, rows
    served = kimi_tok.render(prefilled["messages"], add_generation_prompt=False, continue_final_message=True)
    assert sample.capture.prompt_ids == served
    assert kimi_tok.decode(served).endswith(PREFILL)  # open: no end of turn after the prefill


def test_a_prefill_is_exported_as_one_assistant_turn(recorded, tmp_path, capsys) -> None:
    db, _ = recorded
    out = tmp_path / "sg.jsonl"
    assert main(["export", "--db", db, "--format", "sharegpt", "--select", "all", "--out", str(out)]) == 0
    capsys.readouterr()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    [row] = [r for r in rows if any(PREFILL in (m.get("value") or "") for m in r["conversations"])]
    speakers = [m["from"] for m in row["conversations"]]
    assert speakers == ["human", "gpt"], row
    assert row["conversations"][-1]["value"].startswith(PREFILL)
    [greeted] = [r for r in rows if any(GREETING in (m.get("value") or "") for m in r["conversations"])]
    assert [m["from"] for m in greeted["conversations"]] == ["human", "gpt", "gpt"], greeted
    assert greeted["conversations"][1]["value"] == GREETING  # closed as served: the answer is the next turn
