"""The GLM-layout tokenizer's template renders `tools`, assistant `tool_calls` and `tool` results as GLM-4.7's
chat_template.jinja does (zai-org/GLM-4.7; read from llama.cpp's models/templates/GLM-4.7-Flash.jinja, rendered as
transformers renders it, with trim_blocks and lstrip_blocks). The expected texts are written out here from that
source, not read back from the tokenizer."""

from __future__ import annotations

import json

import pytest

from tokview.core.tokenizer import load_tokenizer

TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}
TOOLS_BLOCK = (
    "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + json.dumps(TOOL, ensure_ascii=False)
    + "\n</tools>\n\nFor each function call, output the function name and arguments within the following XML format:"
    "\n<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value><arg_key>"
    "{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>"
)


@pytest.fixture(scope="module")
def glm_tok(glm_tok_dir):
    return load_tokenizer(glm_tok_dir)


def _call(arguments: object) -> dict:
    return {"id": "c0", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}


def test_tools_calls_and_results_render_as_glm_4_7s_template(glm_tok):
    messages = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": " r ",
            "tool_calls": [_call({"city": "Paris", "days": 3})],
        },
        {"role": "tool", "tool_call_id": "c0", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c1", "content": "windy"},
    ]
    text = glm_tok.render_text(messages, template_kwargs={"tools": [TOOL]})
    assert text == (
        "[gMASK]<sop>" + TOOLS_BLOCK + "<|user|>Weather?<|assistant|><think>r</think><tool_call>get_weather"
        "<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>3</arg_value>"
        "</tool_call><|observation|><tool_response>sunny</tool_response><tool_response>windy</tool_response>"
        "<|assistant|><think>"
    )


def test_a_tool_result_given_as_a_list_renders_its_items(glm_tok):
    messages = [{"role": "user", "content": "x"}, {"role": "tool", "content": [{"output": "a"}, "b"]}]
    text = glm_tok.render_text(messages, add_generation_prompt=False)
    assert (
        text == "[gMASK]<sop><|user|>x<|observation|><tool_response>a</tool_response><tool_response>b</tool_response>"
    )


def test_json_string_arguments_render_as_the_object_they_hold(glm_tok):
    """The template reads arguments only as a mapping (a JSON string would render none); vLLM's chat_utils
    (`_postprocess_messages`) json-parses them before the template, and so does the local render."""
    as_text = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "", "tool_calls": [_call('{"city": "Oslo"}')]},
    ]
    text = glm_tok.render_text(as_text, add_generation_prompt=False)
    assert text.endswith(
        "<|assistant|></think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call>"
    )


def test_the_render_leaves_the_callers_messages_as_they_were(glm_tok):
    as_text = [{"role": "assistant", "content": "", "tool_calls": [_call('{"city": "Oslo"}')]}]
    glm_tok.render(as_text, add_generation_prompt=False)
    assert as_text[0]["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo"}'
