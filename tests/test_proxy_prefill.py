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


@pytest.fixture(params=["vllm", "sglang"])
def recorded(request, tmp_path, kimi_tok, kimi_profile):
    """A store holding a plain turn, a prefilled turn and a turn after a closed greeting, the prefilled request, and
    the server's kind (vLLM renders a prefill open and a greeting closed; SGLang appends a prefill's ids after the
    generation prompt and sends a greeting as the user's: `core.sglang_prefill`)."""
    db = str(tmp_path / "p.duckdb")
    kind = request.param
    with start_simulator(SimConfig(kind=kind)) as sim:
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
            if kind == "vllm":
                both = {**prefilled, "add_generation_prompt": True}
                assert httpx.post(proxy.url + "/v1/chat/completions", json=both).status_code == 400  # as vLLM does
            greeted = {
                **body,
                "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": GREETING}],
            }
            assert httpx.post(proxy.url + "/v1/chat/completions", json=greeted).status_code == 200  # a new turn
    return db, prefilled, kind


def test_a_prefill_is_rendered_as_the_server_rendered_it_no_false_mismatch(recorded, kimi_tok) -> None:
    db, prefilled, kind = recorded
    with Store(db) as store:
        rows = store.query("SELECT sample_id, codes, prompt_len FROM samples ORDER BY sample_id")
        [prefill_id] = [
            sid for sid, _, _ in rows if "continue_final_message" in json.dumps(store.load_sample(sid).capture.settings)
        ]
        sample = store.load_sample(prefill_id)
    assert len(rows) == 3
    for _, codes, _ in rows:
        assert "prompt_render_mismatch" not in codes, rows
    if kind == "vllm":
        served = kimi_tok.render(prefilled["messages"], add_generation_prompt=False, continue_final_message=True)
    else:
        served = kimi_tok.render(prefilled["messages"][:-1]) + kimi_tok.encode(PREFILL)
    assert sample.capture.prompt_ids == served
    assert kimi_tok.decode(served).endswith(PREFILL)  # open: no end of turn after the prefill


def test_a_prefill_is_exported_as_one_assistant_turn(recorded, tmp_path, capsys) -> None:
    db, _, kind = recorded
    out = tmp_path / "sg.jsonl"
    assert main(["export", "--db", db, "--format", "sharegpt", "--select", "all", "--out", str(out)]) == 0
    capsys.readouterr()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    [row] = [r for r in rows if any(PREFILL in (m.get("value") or "") for m in r["conversations"])]
    speakers = [m["from"] for m in row["conversations"]]
    assert speakers == ["human", "gpt"], row
    assert row["conversations"][-1]["value"].startswith(PREFILL)
    [greeted] = [r for r in rows if any(GREETING in (m.get("value") or "") for m in r["conversations"])]
    greeting_from = "gpt" if kind == "vllm" else "human"  # as each server rendered it
    assert [m["from"] for m in greeted["conversations"]] == ["human", greeting_from, "gpt"], greeted
    assert greeted["conversations"][1]["value"] == GREETING  # closed as served: the answer is the next turn


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_flags_given_as_words_are_read_as_the_server_reads_them(kind, tmp_path, kimi_tok, kimi_profile) -> None:
    """pydantic reads "true", "false", 1 and 0 as booleans: the proxy recorded such a flag as absent (a prefill checked
    and exported as none), and the simulator took "false" for a prefill."""
    db = str(tmp_path / "p.duckdb")
    with start_simulator(SimConfig(kind=kind)) as sim:
        config = ProxyConfig([sim.url], listen="127.0.0.1:0", db=db, tokenizer=kimi_tok, profile=kimi_profile)
        messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": PREFILL}]
        base = {"model": sim.cfg.model_name, "messages": messages, "max_tokens": 12, "temperature": 0}
        asks = [
            {**base, "continue_final_message": "true", "add_generation_prompt": "false", "user": "words"},
            {**base, "continue_final_message": "false", "user": "closed"},
        ]
        with start_proxy(config) as proxy:
            for ask in asks:
                assert httpx.post(proxy.url + "/v1/chat/completions", json=ask).status_code == 200
    with Store(db) as store:
        rows = store.query("SELECT sample_id, prompt_id, codes FROM samples ORDER BY prompt_id")
        settings = {pid: store.load_sample(sid).capture.settings for sid, pid, _ in rows}
    assert [codes for _, _, codes in rows if "prompt_render_mismatch" in codes] == []
    assert settings["user:words"]["continue_final_message"] is True
    assert settings["user:words"]["add_generation_prompt"] is False
    assert settings["user:closed"]["continue_final_message"] is False
