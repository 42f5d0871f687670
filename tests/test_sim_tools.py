"""The simulator's kimi_k2 tool parser on both servers (issue 23 item 7), against the tools recordings.

Template rules first (the Kimi-layout tokenizer renders tools as Kimi-K2.5 does), then the simulated
model's calls, the chat and stream shapes of each server, `/generate`, and one test per tool quirk.
"""

from __future__ import annotations

import json

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
