"""The simulator's kimi_k2 tool parser on both servers (issue 23 item 7), against the tools recordings.

Template rules first (the Kimi-layout tokenizer renders tools as Kimi-K2.5 does), then the simulated
model's calls, the chat and stream shapes of each server, `/generate`, and one test per tool quirk.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from facts import RECORDINGS

TOOLS_REC = RECORDINGS / "kimi_tools"
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
CALL = {
    "id": "functions.get_weather:0",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
USER = {"role": "user", "content": "What is the weather in Paris?"}
T2 = [
    USER,
    {"role": "assistant", "content": None, "tool_calls": [CALL], "reasoning_content": "Okay, I check"},
    {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny, 21 degrees"},
]
SECTION = (
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
    '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>'
)
DECLARE = "<|im_system|>tool_declare<|im_middle|>" + json.dumps(TOOLS) + "<|im_end|>"
RESULT = "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:0\nsunny, 21 degrees<|im_end|>"


def test_template_renders_tools_calls_and_results_as_kimi(kimi_tok):
    text = kimi_tok.render_text(T2, template_kwargs={"tools": TOOLS})
    assert text == (
        DECLARE
        + "<|im_user|>user<|im_middle|>What is the weather in Paris?<|im_end|>"
        + "<|im_assistant|>assistant<|im_middle|><think>Okay, I check</think>"
        + SECTION
        + "<|im_end|>"
        + RESULT
        + "<|im_assistant|>assistant<|im_middle|><think>"
    )


def test_template_drops_reasoning_before_the_last_plain_answer_and_with_thinking_off(kimi_tok):
    t3 = [*T2, {"role": "assistant", "content": "It is sunny.", "reasoning_content": "The tool said"}, USER]
    text = kimi_tok.render_text(t3, template_kwargs={"tools": TOOLS})
    assert "<|im_middle|><think></think><|tool_calls_section_begin|>" in text
    assert "<think></think>It is sunny.<|im_end|>" in text and "The tool said" not in text
    off = kimi_tok.render_text(T2, template_kwargs={"tools": TOOLS, "thinking": False})
    assert "Okay, I check" not in off and off.endswith("<think></think>")
    named = kimi_tok.render_text([USER, {**T2[2], "name": "get_weather"}], template_kwargs={})
    assert "<|im_system|>get_weather<|im_middle|>## Return of functions.get_weather:0\n" in named
    plain = [USER, {"role": "assistant", "content": "A", "reasoning_content": "R"}, USER]
    assert "<think>R</think>A" in kimi_tok.render_text(plain), "a conversation without tools keeps history reasoning"


def test_template_tool_render_agrees_with_transformers(kimi_tok, kimi_tok_dir):
    """Servers render with transformers' apply_chat_template; tokview's native renderer must agree."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(kimi_tok_dir))
    t3 = [*T2, {"role": "assistant", "content": "It is sunny.", "reasoning_content": "R"}, USER]
    for messages in (T2, t3):
        for kwargs in ({}, {"thinking": False}):
            want = hf.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True, **kwargs)
            assert kimi_tok.render_text(messages, template_kwargs={"tools": TOOLS, **kwargs}) == want


# -- conformance: the simulator answers every recorded request in the recorded shape ------------------
# A skeleton keeps a response's structure (keys, nesting, null vs value, "" vs text, the literal value of
# a few keys) and drops what differs by model and vocabulary (words, ids, counts). Streams compare the
# skeletons of their chunks with runs of equal chunks collapsed (SGLang batches text deltas by timing;
# the simulator writes other words in other numbers of tokens).
LITERAL_KEYS = {"finish_reason", "object", "role", "type"}
UNCOMPARED_KEYS = {"cached_tokens_details"}  # the recorded /generate hit the prefix cache, a new simulator cannot
RECORDED = sorted(p.name.removesuffix(".req.json") for p in TOOLS_REC.glob("*.req.json"))


def skeleton(value: Any, key: str | None = None) -> Any:
    if isinstance(value, dict):
        return {k: skeleton(v, k) for k, v in value.items() if k not in UNCOMPARED_KEYS}
    if isinstance(value, list):
        if value and all(type(i) is int for i in value):
            return "ids"
        return [skeleton(v) for v in value]
    if key in LITERAL_KEYS or value is None:
        return value
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "num"
    return "text" if value else ""


def _is_argument_chunk(chunk: Any) -> bool:
    delta = (chunk.get("choices") or [{}])[0].get("delta") or {} if isinstance(chunk, dict) else {}
    return bool(delta.get("tool_calls"))


def stream_skeleton(events: list[Any]) -> list[Any]:
    """Chunk skeletons, runs collapsed; an empty vLLM delta between two argument chunks is dropped (an
    argument token whose text vLLM holds back, e.g. a lone `}`: the recorded vocabulary merged `"}`)."""
    kept = [
        e
        for k, e in enumerate(events)
        if not (
            0 < k < len(events) - 1
            and isinstance(e, dict)
            and e.get("choices")
            and e["choices"][0].get("delta") == {}
            and e["choices"][0].get("finish_reason") is None
            and _is_argument_chunk(events[k - 1])
            and _is_argument_chunk(events[k + 1])
        )
    ]
    out: list[Any] = []
    for e in kept:
        shape = skeleton(e)
        if not out or out[-1] != shape:
            out.append(shape)
    return out


def sse_events(text: str) -> list[Any]:
    return [
        (raw if raw == "[DONE]" else json.loads(raw))
        for line in text.splitlines()
        if line.startswith("data:")
        for raw in [line[5:].strip()]
    ]


@pytest.fixture(scope="module")
def tool_sims():
    """vLLM and SGLang, each as model A and as model B (`section-in-reasoning`); `tool-rounds=2` so that
    turn 2 calls again, as the recorded chain model does."""
    from contextlib import ExitStack

    from tokview.sim import SimConfig, start_simulator

    with ExitStack() as stack:
        sims = {}
        for kind in ("vllm", "sglang"):
            for model, extra in (("a", {}), ("b", {"section-in-reasoning": True})):
                cfg = SimConfig(kind=kind, quirks={"tool-rounds": 2, **extra})
                sims[kind, model] = stack.enter_context(start_simulator(cfg))
        yield sims


def _sim_for(tool_sims: dict, name: str) -> Any:
    return tool_sims["vllm" if name.startswith("vllm") else "sglang", "b" if "_b_" in name else "a"]


def _ask(sim: Any, name: str) -> tuple[int, str]:
    body = json.loads((TOOLS_REC / f"{name}.req.json").read_text())
    body.pop("model", None)
    if name == "sgl_choice_none":  # no tools rendered: the simulated model answers in text, longer than 64 ids
        body["max_tokens"] = 512
    path = "/v1/chat/completions"
    if "generate" in name:  # the recorded prompt ids are the recording vocabulary's: use the simulator's own
        chat = json.loads((TOOLS_REC / "sgl_t1.req.json").read_text())
        chat.pop("model")
        body["input_ids"] = httpx.post(sim.url + path, json=chat, timeout=30).json()["choices"][0]["prompt_token_ids"]
        path = "/generate"
    elif "tokenize" in name:
        path = "/tokenize"
    response = httpx.post(sim.url + path, json=body, timeout=30)
    return response.status_code, response.text


@pytest.mark.parametrize("name", RECORDED)
def test_simulator_answers_each_recorded_request_in_the_recorded_shape(tool_sims, name):
    status, text = _ask(_sim_for(tool_sims, name), name)
    recorded_path = TOOLS_REC / f"{name}.json"
    if not recorded_path.exists():
        recorded_path = TOOLS_REC / f"{name}.txt"
    recorded = recorded_path.read_text()
    if not recorded.startswith("data:"):
        want = json.loads(recorded)
        assert status == (400 if want.get("object") == "error" else 200), text
        assert skeleton(json.loads(text)) == skeleton(want)
        if want.get("object") == "error":
            assert json.loads(text)["message"] == want["message"]
        return
    assert status == 200, text
    assert stream_skeleton(sse_events(text)) == stream_skeleton(sse_events(recorded))
