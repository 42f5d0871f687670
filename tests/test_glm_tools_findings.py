"""The tool findings on ids for GLM's layout (issue 23 item 4 through the glm-4.7 profile's `glm47` layout): each one
that applies to GLM fires on the GLM-layout tokenizer's ids at the call's positions, and a clean call has none.
Kimi's own (section markers, call id form, SGLang's renumbered ids) never do: GLM writes no section and no id, and its
arguments are always an object (pairs), so `tool_arguments_not_object` has nothing to find."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from finding_family import Family
from test_tool_calls import TOOL_CODES

from tokview.core.analysis import analyze
from tokview.core.glm_layout import GLM_ID
from tokview.core.profiles import BUILTIN_PROFILES
from tokview.core.record import Capture
from tokview.core.tokenizer import load_tokenizer

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
NEVER_FOR_GLM = {"tool_section_unclosed", "tool_call_id_form", "tool_call_id_renumbered", "tool_arguments_not_object"}


@pytest.fixture(scope="module")
def fam(glm_tok_dir) -> Family:
    tok, profile = load_tokenizer(glm_tok_dir), BUILTIN_PROFILES["glm-4.7"]
    prompt = tok.render([{"role": "user", "content": "Weather in Paris?"}], template_kwargs={"enable_thinking": True})
    return Family(tok, profile, prompt, tok.encode("Check the weather."), tok.encode("Sunny."))


def call(f: Family, name: str = "get_weather", city: str = "Paris", end: bool = True) -> list[int]:
    enc = f.tok.encode
    ids = [GLM_ID["<tool_call>"], *enc(name), GLM_ID["<arg_key>"], *enc("city"), GLM_ID["</arg_key>"]]
    ids += [GLM_ID["<arg_value>"], *enc(city), GLM_ID["</arg_value>"]]
    return ids + ([GLM_ID["</tool_call>"]] if end else [])


def with_tools(f: Family, output: list[int], **changes: Any) -> Capture:
    settings = {"thinking": True, "max_new_tokens": 256, "tools": TOOLS}
    return f.capture(output_ids=output, settings=settings, finish_reason="tool_calls", **changes)


def chat(f: Family, arguments: str) -> Capture:
    server = [{"id": "chatcmpl-tool-9a1b", "name": "get_weather", "arguments": arguments}]
    return dataclasses.replace(
        with_tools(f, f.output(answer=call(f))),
        endpoint="vllm-chat",
        server_kind="vllm",
        reasoning=f.tok.decode(f.reasoning),
        content=None,
        reasoning_field="reasoning",
        tool_calls=server,
    )


def codes(f: Family, capture: Capture) -> set[str]:
    return set(analyze(capture, f.p, f.tok).codes) & TOOL_CODES


CASES = {
    "tool_call_unclosed": lambda f: with_tools(f, f.output(answer=call(f, end=False))),
    "tool_call_out_of_order": lambda f: with_tools(f, f.output(answer=call(f) + [GLM_ID["</tool_call>"]])),
    "tool_not_declared": lambda f: with_tools(f, f.output(answer=call(f, name="get_time"))),
    "tool_section_in_reasoning": lambda f: with_tools(f, f.output(answer=call(f), close=False)),
    "text_after_tool_calls": lambda f: with_tools(f, f.output(answer=call(f) + f.tok.encode(" Done."))),
    "tool_calls_field_mismatch": lambda f: chat(f, '{"city": "Lyon"}'),
    "tool_calls_missing_from_ids": lambda f: markers_lost(f),
}


def markers_lost(f: Family) -> Capture:
    """The clean chat answer whose ids came back without GLM's call and argument markers, its tool_calls still
    holding the call."""
    tags = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")
    markers = {GLM_ID[tag] for tag in tags}
    base = chat(f, '{"city": "Paris"}')
    return dataclasses.replace(base, output_ids=[i for i in base.output_ids if i not in markers])


def test_clean_glm_calls_have_no_tool_finding_and_are_valid(fam):
    for capture in (with_tools(fam, fam.output(answer=call(fam))), chat(fam, '{"city": "Paris"}')):
        analysis = analyze(capture, fam.p, fam.tok)
        assert (set(analysis.codes) & TOOL_CODES, analysis.valid) == (set(), True)


@pytest.mark.parametrize("code", sorted(CASES))
def test_each_glm_case_fires_its_finding_alone(fam, code):
    assert codes(fam, CASES[code](fam)) == {code}


def test_every_tool_code_is_a_glm_case_or_kimis_own():
    assert set(CASES) | NEVER_FOR_GLM == TOOL_CODES


def test_the_server_calls_chatcmpl_id_is_no_finding_for_glm(fam):
    assert "tool_call_id_form" not in codes(fam, chat(fam, '{"city": "Paris"}'))
