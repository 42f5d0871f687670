"""The simulator's kimi_k2 tool parser on both servers, against the tools recordings.

Template rules first (the Kimi-layout tokenizer renders tools as Kimi-K2.5 does), then the simulated
model's calls, the chat and stream shapes of each server, `/generate`, and one test per tool quirk.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from conformance.tool_recordings import RECORDED, TOOLS_REC, skeleton, sse_events, stream_skeleton

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
    assert "<think></think>It is sunny.<|im_end|>" in text
    assert "The tool said" not in text
    off = kimi_tok.render_text(T2, template_kwargs={"tools": TOOLS, "thinking": False})
    assert "Okay, I check" not in off
    assert off.endswith("<think></think>")
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


# -- facts of the recordings, checked on the simulator's own ids ----------------------------------------
IM_END, THINK_CLOSE, SECTION_BEGIN, SECTION_END = 163586, 163607, 163595, 163596
MARKER_IDS = {163595, 163596, 163597, 163598, 163599}


def _chat(sim: Any, messages: list[Any], **extra: Any) -> dict[str, Any]:
    body = {"messages": messages, "tools": TOOLS, "max_tokens": 200, "return_token_ids": True, **extra}
    response = httpx.post(sim.url + "/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def _ids(data: dict[str, Any]) -> tuple[list[int], list[int]]:
    choice = data["choices"][0]
    return choice.get("prompt_token_ids") or data["prompt_token_ids"], choice.get("token_ids") or choice[
        "response_token_ids"
    ]


def _decode(ids: list[int]) -> str:
    from tokview.core.kimi_layout import kimi_tokenizer_dir
    from tokview.core.tokenizer import load_tokenizer

    return load_tokenizer(kimi_tokenizer_dir()).decode(ids, skip_special_tokens=False)


@pytest.fixture(scope="module")
def sims():
    """Default simulators (one call per turn, loops end after one round)."""
    from contextlib import ExitStack

    from tokview.sim import SimConfig, start_simulator

    with ExitStack() as stack:
        yield {kind: stack.enter_context(start_simulator(SimConfig(kind=kind))) for kind in ("vllm", "sglang")}


def test_each_server_renders_the_tools_as_recorded(sims):
    vllm_prompt, _ = _ids(_chat(sims["vllm"], [USER]))
    sgl_prompt, _ = _ids(_chat(sims["sglang"], [USER]))
    assert _decode(vllm_prompt).startswith(DECLARE)
    assert '"defer_loading": null}]<|im_end|>' in _decode(sgl_prompt), "SGLang bug 4: defer_loading rendered"
    assert len(sgl_prompt) > len(vllm_prompt)
    none_prompt, _ = _ids(_chat(sims["sglang"], [USER], tool_choice="none", max_tokens=600))
    assert "tool_declare" not in _decode(none_prompt), "SGLang bug 5: tool_choice none drops the tools"
    vllm_none, _ = _ids(_chat(sims["vllm"], [USER], tool_choice="none"))
    assert vllm_none == vllm_prompt


def test_history_reasoning_and_arguments_per_server(sims):
    with_r = [
        T2[0],
        {**{k: v for k, v in T2[1].items() if k != "reasoning_content"}, "reasoning": "Okay, I check"},
        T2[2],
    ]
    for kind in ("vllm", "sglang"):
        rc, _ = _ids(_chat(sims[kind], T2))
        r, _ = _ids(_chat(sims[kind], with_r))
        assert "<think>Okay, I check</think><|tool_calls_section_begin|>" in _decode(rc)
        if kind == "vllm":
            assert r == rc, "vLLM reads history reasoning from `reasoning` too"
        else:
            assert "<think></think><|tool_calls_section_begin|>" in _decode(r), "SGLang ignores `reasoning` (bug 3)"
        compact = [
            T2[0],
            {**T2[1], "tool_calls": [{**CALL, "function": {**CALL["function"], "arguments": '{"city":"Paris"}'}}]},
            T2[2],
        ]
        assert _ids(_chat(sims[kind], compact))[0] == rc, "history arguments are re-serialised by tojson"
    bad = [
        T2[0],
        {**T2[1], "tool_calls": [{**CALL, "function": {**CALL["function"], "arguments": '{"city": "Paris"'}}]},
        T2[2],
    ]
    assert "<|tool_call_argument_begin|>{}<|tool_call_end|>" in _decode(_ids(_chat(sims["vllm"], bad))[0])
    refused = httpx.post(sims["sglang"].url + "/v1/chat/completions", json={"messages": bad, "tools": TOOLS})
    assert refused.status_code == 400
    assert refused.json()["message"] == "Assistant tool call function.arguments must be valid JSON."
    tokenize = {"messages": T2, "tools": TOOLS, "add_generation_prompt": True}
    dropped = httpx.post(sims["vllm"].url + "/tokenize", json=tokenize).json()["tokens"]
    kept = httpx.post(sims["vllm"].url + "/tokenize", json={**tokenize, "messages": with_r}).json()["tokens"]
    assert "Okay, I check" not in _decode(dropped), "vLLM bug 1"
    assert kept == _ids(_chat(sims["vllm"], T2))[0], "vLLM bug 1"


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_the_next_prompt_extends_the_served_turn_and_the_loop_ends_in_text(sims, kind):
    """Sent back as served (reasoning_content, the returned call), turn 2's prompt is turn 1's prompt + its
    output ids + the result turn + the generation prompt; the model then answers in text."""
    first = _chat(sims[kind], [USER])
    prompt, out = _ids(first)
    message = first["choices"][0]["message"]
    (call,) = message["tool_calls"]
    assert call["id"] == "functions.get_weather:0"
    assert json.loads(call["function"]["arguments"]).keys() == {"city"}
    assert out[-1] == IM_END
    assert out.count(THINK_CLOSE) == 1
    assert out.index(THINK_CLOSE) < out.index(SECTION_BEGIN)
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    assistant = {
        "role": "assistant",
        "content": None,
        "reasoning_content": reasoning,
        "tool_calls": [{"id": call["id"], "type": "function", "function": call["function"]}],
    }
    result = {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}
    second = _chat(sims[kind], [USER, assistant, result])
    prompt2, out2 = _ids(second)
    assert prompt2[: len(prompt) + len(out)] == prompt + out
    assert _decode(prompt2[len(prompt) + len(out) :]).startswith("<|im_system|>tool<|im_middle|>## Return of")
    choice = second["choices"][0]
    assert "tool_calls" not in choice["message"]
    assert choice["finish_reason"] == "stop"
    assert SECTION_BEGIN not in out2
    assert choice["message"]["content"]


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_several_calls_in_one_section_and_further_rounds(kind):
    from tokview.sim import SimConfig, start_simulator

    two_tools = [
        *TOOLS,
        {
            "type": "function",
            "function": {
                "name": "get_time",
                "parameters": {
                    "type": "object",
                    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}, "hours": {"type": "integer"}},
                },
            },
        },
    ]
    with start_simulator(SimConfig(kind=kind, quirks={"tool-calls": 3, "tool-rounds": 2})) as sim:
        first = _chat(sim, [USER], tools=two_tools)
        calls = first["choices"][0]["message"]["tool_calls"]
        again = _chat(
            sim,
            [
                USER,
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": c["id"], "type": "function", "function": c["function"]} for c in calls],
                },
                *[{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in calls],
            ],
            tools=two_tools,
        )
    assert [c["id"] for c in calls] == ["functions.get_weather:0", "functions.get_time:1", "functions.get_weather:2"]
    assert json.loads(calls[1]["function"]["arguments"])["zone"] in ("UTC", "CET")
    _, out = _ids(first)
    assert out.count(163597) == 3
    assert out.count(SECTION_BEGIN) == 1
    assert first["choices"][0]["finish_reason"] == "tool_calls"
    assert again["choices"][0]["message"]["tool_calls"][0]["id"].endswith(":3"), "round 2 numbers on"


def test_vllm_stream_ids_and_arguments_add_up_to_the_non_stream_answer(sims):
    plain = _chat(sims["vllm"], [USER], seed=7)
    body = {"messages": [USER], "tools": TOOLS, "max_tokens": 200, "return_token_ids": True, "seed": 7, "stream": True}
    events = sse_events(httpx.post(sims["vllm"].url + "/v1/chat/completions", json=body).text)
    chunks = [e for e in events[1:] if isinstance(e, dict) and e["choices"]]
    assert [i for c in chunks for i in c["choices"][0]["token_ids"]] == _ids(plain)[1]
    deltas = [d for c in chunks for d in c["choices"][0]["delta"].get("tool_calls") or []]
    want = plain["choices"][0]["message"]["tool_calls"][0]
    assert deltas[0]["id"] == want["id"]
    assert "".join(d["function"]["arguments"] for d in deltas) == want["function"]["arguments"]
    assert events[-1] == "[DONE]"
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    noids = sse_events(
        httpx.post(sims["vllm"].url + "/v1/chat/completions", json={**body, "return_token_ids": False}).text
    )
    assert all(c["choices"][0]["delta"] or c["choices"][0]["finish_reason"] for c in noids[1:-1] if c.get("choices"))


def test_generate_runs_no_parser(sims):
    prompt, out = _ids(_chat(sims["sglang"], [USER]))
    plain = httpx.post(
        sims["sglang"].url + "/generate", json={"input_ids": prompt, "sampling_params": {"max_new_tokens": 200}}
    ).json()
    raw = httpx.post(
        sims["sglang"].url + "/generate",
        json={"input_ids": prompt, "sampling_params": {"max_new_tokens": 200, "skip_special_tokens": False}},
    ).json()
    assert plain["output_ids"] == raw["output_ids"] == out
    assert "functions.get_weather:0{" in plain["text"]
    assert "<|" not in plain["text"]
    assert "</think>" not in plain["text"]
    assert raw["text"].endswith("<|tool_call_end|><|tool_calls_section_end|>")
    assert "</think><|tool_calls_section_begin|>" in raw["text"]


# -- quirks -------------------------------------------------------------------------------------------
def _quirked(kind: str, quirks: dict[str, Any], **extra: Any) -> tuple[dict[str, Any], str | None]:
    from tokview.sim import SimConfig, start_simulator

    with start_simulator(SimConfig(kind=kind, quirks=quirks)) as sim:
        data = _chat(sim, [USER], **extra)
        stream_body = {
            "messages": [USER],
            "tools": TOOLS,
            "max_tokens": 200,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if kind == "vllm":
            stream_body["return_token_ids"] = True
        else:
            stream_body.update(return_input_ids_in_sglext=True, return_output_ids_in_sglext=True)
        text = httpx.post(sim.url + "/v1/chat/completions", json=stream_body).text
    return data, text


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_quirk_section_in_reasoning(kind):
    data, _ = _quirked(kind, {"section-in-reasoning": True})
    _, out = _ids(data)
    message = data["choices"][0]["message"]
    assert THINK_CLOSE not in out
    assert message["tool_calls"]
    assert message.get("reasoning") or message.get("reasoning_content")
    if kind == "sglang":
        assert data["usage"]["reasoning_tokens"] == len(out), "SGLang counts every id as reasoning (bug 6)"
    else:
        assert data["usage"]["completion_tokens_details"]["reasoning_tokens"] == out.index(SECTION_BEGIN)


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_quirk_unclosed_section(kind):
    data, _ = _quirked(kind, {"unclosed-section": True})
    _, out = _ids(data)
    assert SECTION_END not in out
    assert out[-2:] == [163599, IM_END]
    assert data["choices"][0]["message"]["tool_calls"]
    assert data["choices"][0]["finish_reason"] == "tool_calls"


def test_quirk_uuid_call_ids():
    import re

    data, _ = _quirked("vllm", {"uuid-call-ids": True})
    (call,) = data["choices"][0]["message"]["tool_calls"]
    assert re.fullmatch(r"chatcmpl-tool-[0-9a-f]{32}", call["id"])
    assert "functions.get_weather:0" in _decode(_ids(data)[1]), "the model still wrote Kimi's id"


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_quirk_parser_drops_call(kind):
    data, _ = _quirked(kind, {"parser-drops-call": True, "tool-calls": 2})
    assert len(data["choices"][0]["message"]["tool_calls"]) == 1
    assert _ids(data)[1].count(163597) == 2
    one, _ = _quirked(kind, {"parser-drops-call": True})
    assert "tool_calls" not in one["choices"][0]["message"]
    assert one["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_quirk_stream_misses_ids(kind):
    data, text = _quirked(kind, {"stream-misses-ids": True})
    _, out = _ids(data)
    events = [e for e in sse_events(text) if isinstance(e, dict)]
    section = out.index(SECTION_BEGIN)
    if kind == "vllm":  # lost: every section id whose chunk had no delta (all but the arguments and call end)
        streamed = [i for e in events if e["choices"] for i in e["choices"][0].get("token_ids") or []]
        assert streamed[:section] == out[:section]
        assert streamed[-1] == IM_END
        assert not {163595, 163597, 163598, 163596} & set(streamed)
        assert 163599 in streamed
        assert _decode(streamed[section:]).startswith('{"city": "'), "the call id's ids are gone"
    else:
        (streamed,) = next(e for e in events if "sglext" in e)["sglext"]["output_ids"]
        assert streamed == [i for i in out if i not in MARKER_IDS]
    assert len(streamed) < events[-1]["usage"]["completion_tokens"]


def test_tool_count_quirks_are_validated():
    from tokview.sim import SimConfig, SimConfigError

    for bad in (0, -1, "x", 1.5):
        with pytest.raises(SimConfigError, match="tool-calls takes a count"):
            SimConfig(quirks={"tool-calls": bad})


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_a_qwen3_simulator_with_tools_answers_in_text_split_at_its_own_delimiters(kind, qwen_tok_dir):
    """With `tool_choice: none` the Qwen3 model answers in text, and the tool path still splits its reasoning at its
    profile's `</think>` (a Qwen3 answer was all reasoning). Its calls: test_qwen3_tools_sim.py."""
    from tokview.sim import SimConfig, start_simulator

    with start_simulator(SimConfig(kind=kind, tokenizer_dir=qwen_tok_dir)) as sim:
        data = _chat(sim, [USER], max_tokens=400, tool_choice="none")
    message = data["choices"][0]["message"]
    assert not message.get("tool_calls")
    assert data["choices"][0]["finish_reason"] == "stop"
    assert message["content"]
    assert message.get("reasoning") or message.get("reasoning_content")
    assert "<think>" not in message["content"]
    assert "</think>" not in message["content"]


def test_sglang_sglext_flags_without_tools(sims):
    """`return_input_ids_in_sglext` / `return_output_ids_in_sglext`: a response-level `sglext` object, and
    streamed one extra chunk (`choices: []`) before the usage; the ids are the non-streamed ones."""
    url = sims["sglang"].url + "/v1/chat/completions"
    flags = {"return_input_ids_in_sglext": True, "return_output_ids_in_sglext": True, "seed": 3, "max_tokens": 300}
    body = {"messages": [USER], **flags}
    ids = httpx.post(url, json={**body, "return_token_ids": True}).json()["choices"][0]
    plain = httpx.post(url, json=body).json()
    assert plain["sglext"] == {"input_ids": ids["prompt_token_ids"], "output_ids": [ids["response_token_ids"]]}
    assert "response_token_ids" not in plain["choices"][0]
    only_out = httpx.post(url, json={**body, "return_input_ids_in_sglext": False}).json()
    assert only_out["sglext"] == {"output_ids": [ids["response_token_ids"]]}
    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    events = sse_events(httpx.post(url, json=stream).text)
    ext = [e for e in events if isinstance(e, dict) and "sglext" in e]
    assert len(ext) == 1
    assert ext[0]["choices"] == []
    assert ext[0]["sglext"] == plain["sglext"]
    assert events.index(ext[0]) == len(events) - 3, "then the usage chunk and [DONE]"


def test_no_id_fields_and_meta_info_on_the_tool_path():
    """An old build (no-id-fields) has no id keys at all, streamed or not; SGLang's meta_info counts the
    reasoning tokens as usage does."""
    from tokview.sim import SimConfig, start_simulator

    body = {"messages": [USER], "tools": TOOLS, "max_tokens": 200, "return_token_ids": True}
    with start_simulator(SimConfig(kind="vllm", quirks={"no-id-fields": True})) as sim:
        url = sim.url + "/v1/chat/completions"
        plain = httpx.post(url, json=body).json()
        events = sse_events(httpx.post(url, json={**body, "stream": True}).text)
    assert "prompt_token_ids" not in plain
    assert "token_ids" not in plain["choices"][0]
    assert not any("token_ids" in json.dumps(e) for e in events), "no id key in any chunk"
    with start_simulator(SimConfig(kind="sglang")) as sim:
        data = httpx.post(sim.url + "/v1/chat/completions", json={**body, "return_meta_info": True}).json()
    assert data["choices"][0]["meta_info"]["reasoning_tokens"] == data["usage"]["reasoning_tokens"] > 0


def test_tool_calls_each_calls_every_declared_tool_once():
    """`tool-calls=each`: as many parallel calls as the request declares tools, so one run can serve a
    one-tool row with one call and a three-tool row with three."""
    from tokview.sim import SimConfig, start_simulator

    names = ["get_weather", "get_time", "get_news"]
    declared = [
        {"type": "function", "function": {"name": n, "parameters": TOOLS[0]["function"]["parameters"]}} for n in names
    ]
    with start_simulator(SimConfig(kind="sglang", quirks={"tool-calls": "each"})) as sim:
        three = _chat(sim, [USER], tools=declared)["choices"][0]["message"]["tool_calls"]
        one = _chat(sim, [USER])["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in three] == names
    assert [c["id"] for c in three][-1] == "functions.get_news:2"
    assert [c["function"]["name"] for c in one] == ["get_weather"]


def test_quirk_call_ids_restart_shows_sglang_renumbering():
    """The recorded chain model writes `:0` in every turn: vLLM returns that header (a duplicate of the
    history id), SGLang its own count (`:1`), which no longer matches the output ids (README §3, bug 8)."""
    from tokview.sim import SimConfig, start_simulator

    returned = {}
    for kind in ("vllm", "sglang"):
        with start_simulator(SimConfig(kind=kind, quirks={"call-ids-restart": True, "tool-rounds": 2})) as sim:
            data = _chat(sim, T2)
        assert "functions.get_weather:0" in _decode(_ids(data)[1])
        returned[kind] = data["choices"][0]["message"]["tool_calls"][0]["id"]
    assert returned == {"vllm": "functions.get_weather:0", "sglang": "functions.get_weather:1"}


def test_tool_rounds_each_goes_on_until_every_declared_tool_was_called():
    """`tool-rounds=each`: a loop lasts until every declared tool has been called (one round per tool with
    one call a turn), so a row's number of tools decides its loop's length within one run."""
    from tokview.sim import SimConfig, start_simulator

    names = ["get_weather", "get_time", "get_news"]
    declared = [
        {"type": "function", "function": {"name": n, "parameters": TOOLS[0]["function"]["parameters"]}} for n in names
    ]
    messages: list[Any] = [USER]
    called = []
    with start_simulator(SimConfig(kind="vllm", quirks={"tool-rounds": "each"})) as sim:
        for _ in range(4):
            message = _chat(sim, messages, tools=declared)["choices"][0]["message"]
            if not message.get("tool_calls"):
                break
            (call,) = message["tool_calls"]
            called.append(call["function"]["name"])
            messages += [
                {"role": "assistant", "content": None, "tool_calls": [call], "reasoning_content": message["reasoning"]},
                {"role": "tool", "tool_call_id": call["id"], "content": "ok"},
            ]
        single = _chat(sim, [USER, *messages[1:3]])["choices"][0]["message"]
    assert called == names, "three rounds, then the answer"
    assert message["content"], "three rounds, then the answer"
    assert "tool_calls" not in single, "one declared tool: one round"


WIDE = "東京🇯🇵\u200d👨\u200d👩\u200d👧"
"""A value whose characters are split over byte-level ids: flags, a ZWJ family, CJK."""


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_streamed_arguments_of_characters_split_over_ids_add_up_to_the_answer(sims, kind):
    """Each id decoded alone streamed U+FFFD for every part of a character, and the real characters never followed: a
    client joining the argument deltas (as a harness does) had `{"city": "����"}`. A server's detokenizer holds the
    bytes back until the character is whole."""
    city = {"type": "string", "enum": [WIDE]}
    tools = [
        {
            **TOOLS[0],
            "function": {**TOOLS[0]["function"], "parameters": {"type": "object", "properties": {"city": city}}},
        }
    ]
    body = {"messages": [USER], "tools": tools, "max_tokens": 200, "seed": 3}
    plain = httpx.post(sims[kind].url + "/v1/chat/completions", json=body, timeout=30).json()
    want = plain["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(want) == {"city": WIDE}
    events = sse_events(httpx.post(sims[kind].url + "/v1/chat/completions", json={**body, "stream": True}).text)
    deltas = [
        d
        for e in events
        if isinstance(e, dict)
        for c in e.get("choices") or []
        for d in c["delta"].get("tool_calls") or []
    ]
    joined = "".join(d["function"].get("arguments") or "" for d in deltas)
    assert "\ufffd" not in joined
    assert json.loads(joined) == json.loads(want)


def test_stream_pieces_hold_a_split_character_back_until_it_is_whole(qwen_tok, qwen_profile):
    from tokview.sim import SimConfig
    from tokview.sim.common import SimState

    state = SimState(SimConfig(kind="vllm"), qwen_tok, qwen_profile)
    text = "答案是 🎉 x \ufffd!"  # a real U+FFFD too: whole, it is sent
    ids = qwen_tok.encode(text)
    pieces = state.stream_pieces(ids, True)
    assert len(pieces) == len(ids) and "".join(pieces) == text
    assert any(p == "" for p in pieces)  # at least one id was part of a character
    cut = qwen_tok.encode("ok 🎉")[:-1]  # an output cut inside the emoji: its bytes are never sent
    assert qwen_tok.decode(cut) == "ok \ufffd"
    assert "".join(state.stream_pieces(cut, True)) == "ok "
