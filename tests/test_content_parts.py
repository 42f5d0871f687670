"""Content as text parts, and a null content beside tool calls (the OpenAI SDK's own shapes), as each server renders
them (`core.served_messages`): vLLM joins the parts with "\\n" and makes a null "", SGLang joins them with " " and drops
null keys; a template that loops over the parts gets them as parts.

The simulator answered such a request 400 ("'list object' has no attribute 'startswith'", "argument of type
'NoneType' is not iterable") where the real servers serve it, and an export wrote the parts where a trainer's template
needs the text the server rendered (its re-render failed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tokview.core.served_messages import messages_as_served, takes_parts
from tokview.export import export
from tokview.proxy.serve import ProxyConfig, start_proxy
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store

PARTS = [{"type": "text", "text": "Weather in"}, {"type": "text", "text": "Paris?"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
CALL = {"id": "w0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
PARTS_TEMPLATE = "{% for m in messages %}{% for p in m['content'] %}{{ p.text }}{% endfor %}{% endfor %}"


def test_each_server_joins_text_parts_and_reads_a_null_its_own_way():
    messages = [
        {"role": "system", "content": "Be brief.", "name": None},
        {"role": "user", "content": PARTS},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "w0", "content": [{"type": "text", "text": "sunny"}, "and warm"]},
    ]
    vllm = messages_as_served(messages, "vllm", "{{ messages }}")
    assert [m.get("content") for m in vllm] == ["Be brief.", "Weather in\nParis?", "", "sunny\nand warm"]
    sglang = messages_as_served(messages, "sglang", "{{ messages }}")
    assert [m.get("content") for m in sglang] == ["Be brief.", "Weather in Paris?", "", "sunny"]  # no bare strings
    assert "name" not in sglang[0]  # SGLang drops every other null key
    parts = messages_as_served(messages, "vllm", PARTS_TEMPLATE)  # a template that renders the parts itself
    assert [m.get("content") for m in parts] == ["Be brief.", PARTS, [], "sunny\nand warm"]  # a tool result: joined
    assert [m.get("content") for m in messages_as_served(messages, "sglang", PARTS_TEMPLATE)][1:3] == [PARTS, ""]
    plain = [{"role": "user", "content": "hi"}]
    assert messages_as_served(plain, "vllm", None) is plain and messages_as_served(plain, "sglang", None) is plain
    assert messages[1]["content"] is PARTS and messages[2]["content"] is None  # the request itself unchanged


def test_each_server_tells_a_template_that_takes_parts_its_own_way(qwen_tok):
    for kind in ("vllm", "sglang"):
        assert takes_parts(PARTS_TEMPLATE, kind)
        assert not takes_parts(qwen_tok.chat_template, kind)  # Qwen3 writes content as a string
        assert not takes_parts("{% for x in %}", kind)  # does not parse: strings, as the servers assume
        # transformers' loop controls parse: a template that skips some parts still takes them
        assert takes_parts(
            "{% for m in messages %}{% for p in m['content'] %}{% continue %}{% endfor %}{% endfor %}", kind
        )
    bound = "{% set ms = messages[1:] %}{% for x in ms %}{% for p in x.content | list %}{% endfor %}{% endfor %}"
    assert takes_parts(bound, "vllm") and not takes_parts(bound, "sglang")  # vLLM follows the messages; SGLang names
    named = "{% for message in messages %}{% for p in message.content %}{% endfor %}{% endfor %}"
    assert takes_parts(named, "vllm") and takes_parts(named, "sglang")
    other = "{% for t in things %}{% for p in t.content %}{% endfor %}{% endfor %}"
    assert not takes_parts(other, "vllm") and not takes_parts(other, "sglang")
    media = "{{ messages[0].content }}{# images go here #}"
    assert takes_parts(media, "sglang") and not takes_parts(media, "vllm")  # SGLang's shortcut on a medium's name


def test_text_bearing_parts_are_each_server_s_own():
    parts = [
        {"type": "text", "text": "I can't"},
        {"type": "refusal", "refusal": "do that"},
        {"type": "input_text", "text": "ok"},
    ]
    message = [{"role": "user", "content": [*parts, "bare"]}]
    assert messages_as_served(message, "vllm", "")[0]["content"] == "I can't\ndo that\nok\nbare"
    assert messages_as_served(message, "sglang", "")[0]["content"] == "I can't ok"


def _agent(url: str, model: str) -> list[dict[str, Any]]:
    """A harness's two requests: text parts, then its call with a null content and a tool result of parts."""
    first = {"model": model, "messages": [{"role": "user", "content": PARTS}], "max_tokens": 4000, "temperature": 0}
    got = httpx.post(url + "/v1/chat/completions", json=first, timeout=60)
    assert got.status_code == 200, got.text
    history = [
        {"role": "user", "content": PARTS},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "w0", "content": [{"type": "text", "text": "sunny"}]},
    ]
    second = {"model": model, "messages": history, "tools": TOOLS, "max_tokens": 4000, "temperature": 0}
    got = httpx.post(url + "/v1/chat/completions", json=second, timeout=60)
    assert got.status_code == 200, got.text
    return [first, second]


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_parts_and_null_content_are_served_recorded_checked_and_exported_as_rendered(
    kind, tmp_path: Path, qwen_tok, qwen_tok_dir, qwen_profile
):
    """Over loopback: the simulator serves both requests (it refused them), the proxy records them token-exact with no
    `prompt_render_mismatch` (the local render joins the parts as the server did), and the specforge and sharegpt
    rows hold the text the server rendered and re-render to the served ids."""
    db = str(tmp_path / "p.duckdb")
    with start_simulator(SimConfig(kind=kind, tokenizer_dir=qwen_tok_dir)) as sim:
        config = ProxyConfig([sim.url], listen="127.0.0.1:0", db=db, tokenizer=qwen_tok, profile=qwen_profile)
        with start_proxy(config) as proxy:
            requests = _agent(proxy.url, sim.cfg.model_name)
    separator = "\n" if kind == "vllm" else " "
    with Store(db) as store:
        rows = store.query("SELECT sample_id, codes FROM samples ORDER BY sample_id")
        assert len(rows) == 2
        assert not any("prompt_render_mismatch" in codes for _, codes in rows), rows
        first = store.load_sample(rows[0][0]).capture
        assert first.prompt_ids == qwen_tok.render(
            [{"role": "user", "content": separator.join(["Weather in", "Paris?"])}]
        )
        assert first.raw_request is not None
        assert first.raw_request["body"]["messages"] == requests[0]["messages"]  # stored as the harness sent it
        for fmt in ("specforge", "sharegpt"):
            out = tmp_path / f"{kind}-{fmt}.jsonl"
            result = export(store, fmt, out, select="all", tokenizer=qwen_tok, profile=qwen_profile)
            rerender = result.manifest["rerender"]
            assert rerender["specforge"]["exact"] == 2, (
                rerender
            )  # (Qwen3's render path supervises a "\\n" never generated)
            for row in (json.loads(line) for line in out.read_text().splitlines()):
                values = [m.get("content", m.get("value")) for m in row["conversations"]]
                assert all(isinstance(v, str) for v in values), values
                assert f"Weather in{separator}Paris?" in values


@pytest.mark.parametrize("content", [PARTS, None])
def test_sglang_reads_a_last_assistant_message_after_filling_and_joining_it(
    content, tmp_path, qwen_tok, qwen_tok_dir, qwen_profile
):
    """SGLang fills a null content and joins text parts before it takes a last assistant message for the user's (its
    prefill rule): the simulator read the raw parts first and rendered a closed assistant turn, which the proxy's
    own render flagged as `prompt_render_mismatch`."""
    db = str(tmp_path / "p.duckdb")
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": content}]
    with start_simulator(SimConfig(kind="sglang", tokenizer_dir=qwen_tok_dir)) as sim:
        config = ProxyConfig([sim.url], listen="127.0.0.1:0", db=db, tokenizer=qwen_tok, profile=qwen_profile)
        with start_proxy(config) as proxy:
            ask = {"model": sim.cfg.model_name, "messages": messages, "max_tokens": 4000, "temperature": 0}
            assert httpx.post(proxy.url + "/v1/chat/completions", json=ask, timeout=60).status_code == 200
    with Store(db) as store:
        [(codes,)] = store.query("SELECT codes FROM samples")
    assert "prompt_render_mismatch" not in codes, codes
