"""The tool-call findings: each fires on its case and on nothing clean, on both real
tokenizers (Kimi's layout and Qwen3's hermes), and on the recorded real vLLM and SGLang answers.

`TOOL_CASES` has the shape of test_findings.CASES (positive, negative, exact positions, given a family with
`tok`, `p`, `prompt`, `reasoning`, `capture(**changes)`, `output(...)`), so the registry's own positive and
negative tests can run them too; `KIMI_ONLY` are the codes the hermes layout cannot have (no section
markers, no call id on the ids).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest
from finding_family import Family
from test_tool_calls import TOOL_CODES, recorded_capture

from tokview.core.analysis import analyze
from tokview.core.findings import ERROR, RULES, default_severity
from tokview.core.record import Capture
from tokview.core.tool_calls import parse_tool_calls

QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
REASONING = "Okay, I should check the weather in Paris."
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
ARGS = '{"city": "Paris"}'
KIMI_ONLY = {"tool_section_unclosed", "tool_call_id_form", "tool_call_id_renumbered"}


@pytest.fixture(params=["kimi", "qwen"])
def fam(request, kimi_tok, qwen_tok, kimi_profile, qwen_profile) -> Family:
    if request.param == "kimi":
        prompt = kimi_tok.render(QUESTION, template_kwargs={"thinking": True})
        return Family(kimi_tok, kimi_profile, prompt, kimi_tok.encode(REASONING), kimi_tok.encode("Sunny."))
    prompt = qwen_tok.render(QUESTION, template_kwargs={"enable_thinking": True})
    prompt += [qwen_profile.think_open_id] + qwen_tok.encode("\n")
    return Family(qwen_tok, qwen_profile, prompt, qwen_tok.encode(REASONING + "\n"), qwen_tok.encode("\n\nSunny."))


# -- building calls in a family's layout ------------------------------------------------------------------


def kimi(f: Any) -> bool:
    return f.p.tool_calls.parser == "kimi_k2"


def call(f: Any, name: str = "get_weather", args: str = ARGS, call_id: str | None = None, end: bool = True):
    """One call's ids: Kimi `begin ID argument_begin ARGS end`, hermes `<tool_call>\\nJSON\\n</tool_call>`."""
    lay, enc = f.p.tool_calls, f.tok.encode
    if kimi(f):
        ids = [lay.call_begin_id, *enc(call_id or f"functions.{name}:0"), lay.argument_begin_id, *enc(args)]
    else:
        ids = [lay.call_begin_id, *enc(f'\n{{"name": "{name}", "arguments": {args}}}\n')]
    return ids + ([lay.call_end_id] if end else [])


def section(f: Any, *calls: list[int], close: bool = True) -> list[int]:
    lay = f.p.tool_calls
    if not kimi(f):
        return [i for k, c in enumerate(calls) for i in ([*f.tok.encode("\n")] if k else []) + c]
    return [lay.section_begin_id, *[i for c in calls for i in c]] + ([lay.section_end_id] if close else [])


def with_tools(f: Any, output: list[int], **changes: Any) -> Capture:
    settings = {"thinking": True, "max_new_tokens": 256, "tools": TOOLS}
    return f.capture(output_ids=output, settings=settings, finish_reason="tool_calls", **changes)


def clean(f: Any) -> Capture:
    return with_tools(f, f.output(answer=section(f, call(f))))


def server_call(f: Any, args: str = ARGS, call_id: str = "functions.get_weather:0") -> dict[str, Any]:
    return {"id": call_id if kimi(f) else "chatcmpl-tool-9a1b", "name": "get_weather", "arguments": args}


def chat(f: Any, calls: list[dict[str, Any]] | None, server: str = "vllm") -> Capture:
    """The clean call as a chat answer whose `tool_calls` field is `calls`."""
    base = clean(f)
    return dataclasses.replace(
        base,
        endpoint=f"{server}-chat",
        server_kind=server,
        reasoning=f.tok.decode(f.reasoning),
        content=None,
        reasoning_field="reasoning",
        tool_calls=calls,
    )


def markers_lost(f: Any, tool_choice: Any = None) -> Capture:
    """The clean chat answer whose ids came back without the layout's marker ids (SGLang's streamed
    `sglext.output_ids`, `--quirk stream-misses-ids`), the server's tool_calls still holding the call."""
    lay, base = f.p.tool_calls, chat(f, [server_call(f)])
    markers = {lay.section_begin_id, lay.section_end_id, lay.call_begin_id, lay.call_end_id, lay.argument_begin_id}
    settings = {**base.settings, **({"tool_choice": tool_choice} if tool_choice is not None else {})}
    return dataclasses.replace(base, output_ids=[i for i in base.output_ids if i not in markers], settings=settings)


def vllm_stream_lost(f: Any, tool_choice: Any) -> Capture:
    """What vLLM's stream keeps of a call (#27482): no chunk for the ids that give no delta (the markers and the call
    id), so only the arguments and the call's end marker, whose delta is their closing brace: JSON text, decoded."""
    base = chat(f, [server_call(f)])
    answer = [*f.tok.encode(ARGS), f.p.tool_calls.call_end_id]
    return dataclasses.replace(
        base, output_ids=f.output(answer=answer), settings={**base.settings, "tool_choice": tool_choice}
    )


def forced_json(f: Any, tool_choice: Any = "required") -> Capture:
    """A forced call answered as plain JSON (a server whose forced-call grammar is a JSON schema): no markers."""
    base = chat(f, [server_call(f)])
    answer = f.tok.encode('[{"name": "get_weather", "parameters": {"city": "Paris"}}]')
    settings = {**base.settings, "tool_choice": tool_choice}
    return dataclasses.replace(base, output_ids=f.output(answer=answer), settings=settings)


def calls_of(f: Any, c: Capture):
    return parse_tool_calls(c.output_ids, f.p.tool_calls, f.tok)


def at(c: Capture, *out_positions: int) -> tuple[int, ...]:
    return tuple(len(c.prompt_ids) + i for i in out_positions)


def span_at(c: Capture, span: tuple[int, int]) -> tuple[int, ...]:
    return at(c, *range(*span))


@dataclasses.dataclass(frozen=True)
class Case:
    positive: Callable[[Any], Capture]
    negative: Callable[[Any], Capture]
    positions: Callable[[Any, Capture], tuple[int, ...]]


def _stray_end(f: Any) -> list[int]:
    lay = f.p.tool_calls
    return f.output(answer=section(f, call(f) + [lay.call_end_id]))


def _text_after(f: Any) -> list[int]:
    return f.output(answer=section(f, call(f)) + f.tok.encode(" Done, calling it."))


TOOL_CASES = {
    "tool_section_unclosed": Case(
        lambda f: with_tools(f, f.output(answer=section(f, call(f), close=False))),
        clean,
        lambda f, c: at(c, calls_of(f, c).sections[0][0]),
    ),
    "tool_call_unclosed": Case(
        lambda f: with_tools(f, f.output(answer=section(f, call(f, end=False)))),
        clean,
        lambda f, c: at(c, calls_of(f, c).calls[0].span[0]),
    ),
    "tool_call_out_of_order": Case(
        lambda f: with_tools(f, _stray_end(f)),
        clean,
        lambda f, c: at(c, calls_of(f, c).calls[0].span[1]),  # the second end, right after the call's own
    ),
    "tool_arguments_not_object": Case(
        lambda f: with_tools(f, f.output(answer=section(f, call(f, args="[1]")))),
        clean,
        lambda f, c: span_at(c, calls_of(f, c).calls[0].arguments_span),
    ),
    "tool_not_declared": Case(
        lambda f: with_tools(f, f.output(answer=section(f, call(f, name="get_time")))),
        clean,
        lambda f, c: span_at(c, calls_of(f, c).calls[0].id_span or calls_of(f, c).calls[0].arguments_span),
    ),
    "tool_call_id_form": Case(
        lambda f: with_tools(f, f.output(answer=section(f, call(f, call_id="get_weather:0")))),
        clean,
        lambda f, c: span_at(c, calls_of(f, c).calls[0].id_span),
    ),
    "tool_section_in_reasoning": Case(
        lambda f: with_tools(f, f.output(answer=section(f, call(f)), close=False)),
        clean,
        lambda f, c: at(c, calls_of(f, c).markers[0]),
    ),
    "text_after_tool_calls": Case(
        lambda f: with_tools(f, _text_after(f)),
        clean,
        lambda f, c: at(c, *range(calls_of(f, c).end, len(c.output_ids) - 1)),
    ),
    "tool_calls_field_mismatch": Case(
        lambda f: chat(f, [server_call(f, args='{"city": "Lyon"}')]),
        lambda f: chat(f, [server_call(f)]),
        lambda f, c: at(c, calls_of(f, c).calls[0].span[0]),
    ),
    "tool_calls_missing_from_ids": Case(
        markers_lost,
        forced_json,  # a forced call answered as plain JSON: no markers by design
        lambda f, c: (),
    ),
    "tool_call_id_renumbered": Case(
        lambda f: chat(f, [server_call(f, call_id="functions.get_weather:1")], server="sglang"),
        lambda f: chat(f, [server_call(f)], server="sglang"),
        lambda f, c: at(c, calls_of(f, c).calls[0].span[0]),
    ),
}


def test_every_tool_code_has_a_case_and_is_registered():
    assert set(TOOL_CASES) == TOOL_CODES
    assert set(RULES) >= TOOL_CODES


@pytest.mark.parametrize("code", sorted(TOOL_CASES))
def test_positive(fam, code):
    if code in KIMI_ONLY and not kimi(fam):
        pytest.skip("the hermes layout has no section markers and writes no call id")
    case = TOOL_CASES[code]
    capture = case.positive(fam)
    analysis = analyze(capture, fam.p, fam.tok)
    hits = [f for f in analysis.findings if f.code == code]
    assert len(hits) == 1, analysis.codes
    assert hits[0].severity == default_severity(code), analysis.codes
    assert hits[0].positions == case.positions(fam, capture)
    assert hits[0].detail
    assert analysis.valid == (default_severity(code) != ERROR)


@pytest.mark.parametrize("code", sorted(TOOL_CASES))
def test_negative(fam, code):
    capture = TOOL_CASES[code].negative(fam)
    assert code not in analyze(capture, fam.p, fam.tok).codes


def test_clean_calls_have_no_tool_finding_and_are_valid(fam):
    for capture in (clean(fam), chat(fam, [server_call(fam)])):
        analysis = analyze(capture, fam.p, fam.tok)
        assert not set(analysis.codes) & TOOL_CODES, analysis.codes
        assert analysis.valid, analysis.codes


def test_lost_calls_are_one_error_not_also_the_mismatch_warning(fam):
    named = {"type": "function", "function": {"name": "get_weather"}}
    codes = analyze(markers_lost(fam), fam.p, fam.tok).codes
    assert "tool_calls_missing_from_ids" in codes and "tool_calls_field_mismatch" not in codes
    for forced in ("required", named):
        if kimi(fam):  # Kimi's forced calls are written with its markers: losing them is the error
            assert "tool_calls_missing_from_ids" in analyze(markers_lost(fam, forced), fam.p, fam.tok).codes
        vllm_lost = vllm_stream_lost(fam, forced)  # what is left decodes to JSON, but a marker is left too
        assert "tool_calls_missing_from_ids" in analyze(vllm_lost, fam.p, fam.tok).codes
        # (a hermes call without its tags is JSON text, as a JSON-schema forced answer is: the two look alike)
        assert "tool_calls_missing_from_ids" not in analyze(forced_json(fam, forced), fam.p, fam.tok).codes


def test_more_calls_in_the_field_than_on_the_ids_is_the_mismatch_warning_not_lost_ids(fam):
    """SGLang's hermes parser makes one call of each element of a JSON array inside one `<tool_call>`: every id is
    there, so it is the field that differs (a warning), not ids lost on the way (an error)."""
    two = chat(fam, [server_call(fam), server_call(fam, args='{"city": "Rome"}')])
    analysis = analyze(two, fam.p, fam.tok)
    assert "tool_calls_missing_from_ids" not in analysis.codes
    assert "tool_calls_field_mismatch" in analysis.codes


def test_a_call_begun_inside_a_call_is_out_of_order_and_the_first_unclosed(fam):
    lay = fam.p.tool_calls
    inner = call(fam)
    output = fam.output(answer=section(fam, [lay.call_begin_id, *fam.tok.encode("x")] + inner))
    found = {f.code: f for f in analyze(with_tools(fam, output), fam.p, fam.tok).findings}
    assert {"tool_call_out_of_order", "tool_call_unclosed"} <= set(found)
    begin = output.index(lay.call_begin_id)
    assert found["tool_call_unclosed"].positions == (len(fam.prompt) + begin,)


def test_a_kimi_call_without_argument_begin_is_out_of_order(kimi_tok, kimi_profile):
    lay = kimi_profile.tool_calls
    ids = [lay.call_begin_id, *kimi_tok.encode("functions.get_weather:0" + ARGS), lay.call_end_id]
    fam = Family(kimi_tok, kimi_profile, kimi_tok.render(QUESTION), kimi_tok.encode(REASONING), [])
    capture = with_tools(fam, fam.output(answer=section(fam, ids)))
    hit = next(f for f in analyze(capture, kimi_profile, kimi_tok).findings if f.code == "tool_call_out_of_order")
    assert "has no <|tool_call_argument_begin|>" in hit.detail


# -- the recorded real answers ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("vllm_t1", set()),
        ("sgl_t1", set()),
        ("vllm_b_nothink", set()),
        ("sgl_b_nothink", set()),
        ("vllm_t2_rc", set()),  # vLLM echoes the model's :0
        ("vllm_b_think", {"tool_section_in_reasoning"}),
        ("sgl_b_think", {"tool_section_in_reasoning"}),
        ("sgl_t2_rc", {"tool_call_id_renumbered"}),  # SGLang's :1 (one call in the history)
        ("vllm_choice_none", {"tool_calls_field_mismatch"}),  # the parser ate the calls, returned none
    ],
)
def test_recorded_answers(name, expected, kimi_tok, kimi_profile):
    analysis = analyze(recorded_capture(name, kimi_tok), kimi_profile, kimi_tok)
    assert set(analysis.codes) & TOOL_CODES == expected
    assert analysis.valid, analysis.codes
    assert "think_close_missing" not in analysis.codes  # model B: the section ended the reasoning


def test_a_renumbered_id_from_a_server_that_should_echo_it_is_a_mismatch(kimi_tok, kimi_profile):
    capture = recorded_capture("sgl_t2_rc", kimi_tok, server_kind="vllm", endpoint="vllm-chat")
    assert set(analyze(capture, kimi_profile, kimi_tok).codes) & TOOL_CODES == {"tool_calls_field_mismatch"}


def test_a_recorded_call_to_a_function_the_request_did_not_offer(kimi_tok, kimi_profile):
    other = [{"type": "function", "function": {"name": "get_time"}}]
    capture = recorded_capture("vllm_t1", kimi_tok)
    capture = dataclasses.replace(capture, settings={**capture.settings, "tools": other})
    hit = next(f for f in analyze(capture, kimi_profile, kimi_tok).findings if f.code == "tool_not_declared")
    assert "'get_weather'" in hit.detail
    assert "declared: get_time" in hit.detail


def test_without_recorded_tools_nothing_is_undeclared(kimi_tok, kimi_profile):
    """An imported capture (no `mode`: not tokview's own request) may have lost the request's tools."""
    capture = recorded_capture("vllm_t1", kimi_tok)
    capture = dataclasses.replace(capture, settings={"thinking": True}, endpoint="imported")
    assert "tool_not_declared" not in analyze(capture, kimi_profile, kimi_tok).codes


@pytest.mark.parametrize("mode", ["proxy", "raw", "chat", "dual"])
def test_a_call_in_a_request_of_ours_without_tools_is_undeclared(mode, kimi_tok, kimi_profile):
    """The proxy records a request's tools, and the batch sends none: a call there was never offered."""
    capture = recorded_capture("vllm_t1", kimi_tok)
    capture = dataclasses.replace(capture, settings={"thinking": True, "mode": mode})
    hit = next(f for f in analyze(capture, kimi_profile, kimi_tok).findings if f.code == "tool_not_declared")
    assert "declared: none" in hit.detail


def test_the_tool_findings_keep_the_thinking_findings_of_a_truly_open_reasoning(kimi_tok, kimi_profile):
    """A section inside reasoning is no excuse for a closer that never comes when there are no calls."""
    capture = recorded_capture("vllm_t1", kimi_tok)
    cut = capture.output_ids[: capture.output_ids.index(163607)] + [163586]
    analysis = analyze(dataclasses.replace(capture, output_ids=cut), kimi_profile, kimi_tok)
    assert "think_close_missing" in analysis.codes


def test_serialised_findings_name_positions_inside_the_sample(fam):
    for code, case in TOOL_CASES.items():
        if code in KIMI_ONLY and not kimi(fam):
            continue
        capture = case.positive(fam)
        total = len(capture.prompt_ids) + len(capture.output_ids)
        for finding in analyze(capture, fam.p, fam.tok).findings:
            assert all(0 <= p < total for p in finding.positions), (code, finding)
            json.dumps(finding.__dict__)


def test_a_call_cut_by_the_token_limit_is_said_to_be_cut_not_unparsed(fam):
    """A call the token limit cut comes back as no tool_calls: the mismatch said the server ran no tool parser (or
    tool_choice was none), sending a team to check its server flags for a max_tokens cut."""
    f = fam
    cut = dataclasses.replace(
        chat(f, None), output_ids=f.output(answer=section(f, call(f, end=False), close=False)), finish_reason="length"
    )
    [mismatch] = [x for x in analyze(cut, f.p, f.tok).findings if x.code == "tool_calls_field_mismatch"]
    assert "cut at its token limit" in mismatch.detail and "no tool parser" not in mismatch.detail
    unparsed = analyze(chat(f, None), f.p, f.tok).findings
    assert any(x.code == "tool_calls_field_mismatch" and "no tool parser" in x.detail for x in unparsed)
