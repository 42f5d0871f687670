"""A GLM sample's exported calls carry the arguments its request's `tools` typed: a `string` parameter's value
stays text (`"42"`), as vLLM's glm47 parser returned it, instead of being re-read as a number."""

from __future__ import annotations

import json

import pytest

from tokview.core.profiles import BUILTIN_PROFILES
from tokview.core.record import Capture
from tokview.core.tokenizer import load_tokenizer
from tokview.export.formats import served_calls

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"zip": {"type": "string"}, "days": {"type": "integer"}}},
        },
    }
]
CALL = (
    "<tool_call>get_weather<arg_key>zip</arg_key><arg_value>42</arg_value>"
    "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>"
)


@pytest.fixture(scope="module")
def glm_tok(glm_tok_dir):
    return load_tokenizer(glm_tok_dir)


def test_a_string_parameter_is_exported_as_the_text_it_was(glm_tok):
    capture = Capture(prompt_ids=[1], output_ids=glm_tok.encode(CALL), settings={"tools": TOOLS})
    (call,) = served_calls(capture, BUILTIN_PROFILES["glm-4.7"], glm_tok)
    assert json.loads(call["function"]["arguments"]) == {"zip": "42", "days": 3}
