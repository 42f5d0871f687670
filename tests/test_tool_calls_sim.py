"""Tool calls end to end over real sockets: the simulator's kimi_k2 tool parser (vLLM and SGLang) upstream,
`tokview proxy` in front, the store behind. What the store reads back is analysed as the app and `show` do:
the server's tool_calls survive, the calls on the ids agree with them, and each tool quirk of the simulator
raises its finding (and a clean answer none)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from test_tool_calls import TOOL_CODES

from tokview.core.analysis import analyze
from tokview.core.tool_calls import server_tool_calls
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
USER = {"role": "user", "content": "What is the weather in Paris?"}


CALL = {
    "id": "functions.get_weather:0",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
TURN_2 = [
    USER,
    {"role": "assistant", "content": None, "tool_calls": [CALL], "reasoning_content": "Okay, I check"},
    {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny, 21 degrees"},
]


def _body(kind: str, stream: bool, messages: list[Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": messages or [USER],
        "tools": TOOLS,
        "max_tokens": 200,
        "temperature": 0,
        "stream": stream,
    }
    if stream and kind == "sglang":
        body.update(return_input_ids_in_sglext=True, return_output_ids_in_sglext=True)
    return body


def _through_proxy(
    tmp_path: Any,
    kimi_tok: Any,
    kimi_profile: Any,
    kind: str,
    quirks: dict[str, Any],
    stream: bool,
    messages: list[Any] | None = None,
):
    """(the non-stream answer the simulator gives, the stored capture of the proxied request)."""
    with start_simulator(SimConfig(kind=kind, quirks={"tool-rounds": 1, **quirks})) as sim:
        direct = httpx.post(sim.url + "/v1/chat/completions", json=_body(kind, False, messages)).json()
        db = str(tmp_path / f"{kind}-{stream}.duckdb")
        config = ProxyConfig([sim.url], listen="127.0.0.1:0", db=db, tokenizer=kimi_tok, profile=kimi_profile)
        with start_proxy(config) as proxy:
            answer = httpx.post(proxy.url + "/v1/chat/completions", json=_body(kind, stream, messages))
            assert answer.status_code == 200
            proxy.stop()
    with Store(db) as store:
        [(sample_id,)] = store.query("SELECT sample_id FROM samples")
        return direct, store.load_sample(sample_id).capture


@pytest.fixture(params=["vllm", "sglang"])
def kind(request) -> Iterator[str]:
    yield request.param


@pytest.mark.parametrize("stream", [False, True])
def test_a_proxied_call_is_stored_with_the_servers_tool_calls_and_no_tool_finding(
    tmp_path, kimi_tok, kimi_profile, kind, stream
):
    direct, capture = _through_proxy(tmp_path, kimi_tok, kimi_profile, kind, {}, stream)
    want = server_tool_calls(direct["choices"][0]["message"]["tool_calls"])
    assert want
    assert capture.tool_calls == want
    assert capture.settings["tools"] == TOOLS
    analysis = analyze(capture, kimi_profile, kimi_tok)
    assert not set(analysis.codes) & TOOL_CODES, analysis.codes
    assert analysis.valid, analysis.codes
    assert analysis.alignment is not None
    assert analysis.alignment.unmatched_text == ""


@pytest.mark.parametrize(
    ("quirks", "kinds", "code"),
    [
        ({"section-in-reasoning": True}, ("vllm", "sglang"), "tool_section_in_reasoning"),
        ({"unclosed-section": True}, ("vllm", "sglang"), "tool_section_unclosed"),
        ({"parser-drops-call": True, "tool-calls": 2}, ("vllm", "sglang"), "tool_calls_field_mismatch"),
        ({"uuid-call-ids": True}, ("vllm",), "tool_calls_field_mismatch"),
    ],
)
def test_each_tool_quirk_raises_its_finding(tmp_path, kimi_tok, kimi_profile, kind, quirks, kinds, code):
    if kind not in kinds:
        pytest.skip(f"a {kind} simulator has no such quirk")
    _, capture = _through_proxy(tmp_path, kimi_tok, kimi_profile, kind, quirks, False)
    found = set(analyze(capture, kimi_profile, kimi_tok).codes) & TOOL_CODES
    assert found == {code}


def test_a_stream_that_lost_the_call_markers_is_invalid(tmp_path, kimi_tok, kimi_profile, kind):
    """SGLang's final `sglext.output_ids` without the section's markers, vLLM's stream without the chunks that gave
    no delta: the server's tool_calls hold a call the ids do not, so the sample is never exported as valid."""
    _, capture = _through_proxy(tmp_path, kimi_tok, kimi_profile, kind, {"stream-misses-ids": True}, True)
    analysis = analyze(capture, kimi_profile, kimi_tok)
    assert "tool_calls_missing_from_ids" in analysis.codes
    assert not analysis.valid


def test_a_second_round_on_sglang_returns_a_renumbered_id_vllm_echoes_the_models(
    tmp_path, kimi_tok, kimi_profile, kind
):
    quirks = {"call-ids-restart": True, "tool-rounds": 2}
    _, capture = _through_proxy(tmp_path, kimi_tok, kimi_profile, kind, quirks, False, TURN_2)
    found = set(analyze(capture, kimi_profile, kimi_tok).codes) & TOOL_CODES
    assert found == ({"tool_call_id_renumbered"} if kind == "sglang" else set())
