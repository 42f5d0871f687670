"""GLM's tool-call layout on ids (issue 28 item 1, issue 23 item 4): `<tool_call>NAME<arg_key>K</arg_key>
<arg_value>V</arg_value>…</tool_call>` read off the GLM-layout tokenizer's ids, the arguments made a JSON object as
vLLM's glm47 parser makes them (string values as written, others json-decoded), and the template rendering tools,
calls and results as GLM-4.7's chat_template.jinja does."""

from __future__ import annotations

import json

import pytest

from tokview.core import tool_calls as tc
from tokview.core.glm_layout import GLM_ID
from tokview.core.profiles import BUILTIN_PROFILES, GLM47, detect_profile, tool_layout_from_fields
from tokview.core.tokenizer import load_tokenizer

LAYOUT = BUILTIN_PROFILES["glm-4.7"].tool_calls
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "tags": {"type": "array"}},
            },
        },
    }
]


@pytest.fixture(scope="module")
def glm_tok(glm_tok_dir):
    return load_tokenizer(glm_tok_dir)


def ids_of(tok, text: str) -> list[int]:
    return tok.encode(text)


def test_both_glm_profiles_name_the_glm_layout():
    assert {BUILTIN_PROFILES[n].tool_calls.parser for n in ("glm-4.5", "glm-4.7")} == {GLM47}


def test_the_layouts_ids_are_the_tokenizers(glm_tok):
    assert all(glm_tok.token_to_id(text) == i for _, i, text in LAYOUT.named_ids())


def test_the_detected_profile_reads_glm_tool_calls(glm_tok):
    assert detect_profile(glm_tok).tool_calls == LAYOUT


def test_a_profile_file_can_name_the_glm_layout():
    assert tool_layout_from_fields("glm47", "test") == LAYOUT


def test_a_glm_layout_without_its_argument_ids_is_refused():
    from tokview.core.profiles import ProfileError

    with pytest.raises(ProfileError, match="arg_key"):
        tool_layout_from_fields({"parser": "glm47", "arg_value_end_id": None}, "test")


def test_a_call_is_read_with_its_name_and_arguments(glm_tok):
    text = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"
    parsed = tc.parse_tool_calls(ids_of(glm_tok, text), LAYOUT, glm_tok)
    (call,) = parsed.calls
    assert (call.name, call.arguments, call.arguments_error, parsed.problems) == (
        "get_weather",
        '{"city": "Paris"}',
        None,
        (),
    )


def test_non_string_values_are_json_decoded_and_string_ones_kept(glm_tok):
    text = (
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value> 42 </arg_value><arg_key>days</arg_key>"
        '<arg_value>3</arg_value><arg_key>tags</arg_key><arg_value>["a", "b"]</arg_value></tool_call>'
    )
    (untyped,) = tc.parse_tool_calls(ids_of(glm_tok, text), LAYOUT, glm_tok).calls
    (typed,) = tc.parse_tool_calls(ids_of(glm_tok, text), LAYOUT, glm_tok, tools=TOOLS).calls
    assert json.loads(untyped.arguments) == {"city": 42, "days": 3, "tags": ["a", "b"]}
    assert json.loads(typed.arguments) == {"city": " 42 ", "days": 3, "tags": ["a", "b"]}


def test_glm_4_5_newlines_are_read_too(glm_tok):
    text = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n</tool_call>"
    (call,) = tc.parse_tool_calls(ids_of(glm_tok, text), LAYOUT, glm_tok).calls
    assert (call.name, call.arguments) == ("get_weather", '{"city": "Oslo"}')


def test_two_calls_make_one_section_from_the_first_to_the_last(glm_tok):
    one = "<tool_call>a<arg_key>x</arg_key><arg_value>1</arg_value></tool_call>"
    ids = ids_of(glm_tok, "Let me look." + one + one)
    parsed = tc.parse_tool_calls(ids, LAYOUT, glm_tok)
    first = ids.index(GLM_ID["<tool_call>"])
    assert (len(parsed.calls), parsed.sections, parsed.end) == (2, ((first, len(ids)),), len(ids))


def test_an_unclosed_call_is_a_problem(glm_tok):
    ids = ids_of(glm_tok, "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>")
    parsed = tc.parse_tool_calls(ids, LAYOUT, glm_tok)
    assert [p.code for p in parsed.problems] == [tc.CALL_UNCLOSED]


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>f<arg_value>v</arg_value></tool_call>",  # a value without its key
        "<tool_call>f<arg_key>k</arg_key></tool_call>",  # a key without its value
        "<tool_call>f<arg_key>k<arg_value>v</arg_value></tool_call>",  # the key never closed
        "<arg_key>k</arg_key><tool_call>f</tool_call>",  # an argument outside any call
    ],
)
def test_argument_markers_out_of_place_are_out_of_order(glm_tok, text):
    parsed = tc.parse_tool_calls(ids_of(glm_tok, text), LAYOUT, glm_tok)
    assert tc.OUT_OF_ORDER in [p.code for p in parsed.problems]


def test_a_call_without_arguments_has_an_empty_object(glm_tok):
    (call,) = tc.parse_tool_calls(ids_of(glm_tok, "<tool_call>list_files</tool_call>"), LAYOUT, glm_tok).calls
    assert (call.name, call.arguments, call.arguments_error) == ("list_files", "{}", None)
