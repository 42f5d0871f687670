"""Qwen3-Coder's and Qwen3.5's XML tool calls (the `qwen3_coder` layout): `<tool_call>` then `<function=NAME>`, per
argument `<parameter=K>` with the value on its own lines, `</function>`, `</tool_call>`.

Before, such a template got no layout at all: its calls were answer ids, unchecked, so a dropped call, a wrong name
or a value the server read otherwise passed silently. Now the calls are read off the ids as the servers' qwen3_coder
parsers read them, compared with the server's `tool_calls` by value (vLLM and SGLang convert the text apart), and a
tool loop runs on the simulator over loopback with every turn extending the one before. The template here is Qwen3's
own (the tokenizer's) with its hermes JSON pieces replaced by XML ones (tests/qwen3_coder_template.py)."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
from qwen3_coder_template import coder_folder, moved_markers_folder
from test_glm_tools_sim import _run as run_chain
from test_qwen3_tools_sim import CALL, TOOLS, TRACE

from tokview.core.analysis import analyze
from tokview.core.profiles import detect_profile
from tokview.core.record import Capture
from tokview.core.tokenizer import load_tokenizer
from tokview.core.tool_calls import parse_tool_calls
from tokview.core.xml_tool_calls import arguments_agree, history_arguments, xml_call
from tokview.export.formats import served_calls

TYPED = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"type": "integer"},
                    "score": {"type": "number"},
                    "exact": {"type": "boolean"},
                    "filters": {"type": "object"},
                    "since": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                },
            },
        },
    }
]


def body(name: str, *params: tuple[str, str]) -> str:
    inside = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"\n<function={name}>\n{inside}</function>\n"


def test_a_template_that_writes_function_xml_gets_the_qwen3_coder_layout(coder_tok, qwen_tok):
    assert detect_profile(coder_tok).tool_calls.parser == "qwen3_coder"
    assert detect_profile(qwen_tok).tool_calls.parser == "hermes"


def test_the_body_reads_as_the_qwen3_coder_parsers_read_it():
    text = body(
        "search",
        ("query", "  spaced  "),
        ("limit", "5"),
        ("score", "2.0"),
        ("exact", "true"),
        ("filters", '{"lang": "en"}'),
        ("since", "null"),
        ("extra", "7"),
    )
    call = xml_call(text, TYPED)
    assert call.name == "search" and call.error is None
    assert json.loads(call.arguments or "") == {
        "query": "  spaced  ",  # a string as written, spaces and all (one newline dropped at each end only)
        "limit": 5,
        "score": 2,  # a whole number is an int (vLLM)
        "exact": True,
        "filters": {"lang": "en"},
        "since": None,  # nullable: null
        "extra": "7",  # not in the schema: text
    }
    # a value ended by the next <parameter= (no </parameter>), and a string typed value "null" kept as text
    cut = "\n<function=search>\n<parameter=query>\nnull\n<parameter=limit>\n3\n</parameter>\n</function>\n"
    assert json.loads(xml_call(cut, TYPED).arguments or "") == {"query": "null", "limit": 3}
    assert xml_call("\n{}\n", TYPED).error is not None and xml_call("<function=x", TYPED).name is None


def test_the_servers_arguments_are_compared_by_value():
    params = (("query", "null"), ("limit", "5"), ("exact", "true"), ("filters", '{"a": [1, 2]}'))
    vllm = '{"query": "null", "limit": 5, "exact": true, "filters": {"a": [1, 2]}}'
    sglang_stream = '{"query": null, "limit": 5, "exact": true, "filters": {"a": [1, 2]}}'  # null for any type
    assert arguments_agree(params, vllm) and arguments_agree(params, sglang_stream)
    assert not arguments_agree(params, vllm.replace("5", "6"))
    assert not arguments_agree(params, '{"query": "null", "limit": 5, "exact": true}')  # a key lost
    assert not arguments_agree(params, '{"query": "nul", "limit": 5, "exact": true, "filters": {"a": [1, 2]}}')
    assert not arguments_agree(params, None) and not arguments_agree(params, "[1]")


def _capture(tok, profile, output_text: str, server_calls: list[dict] | None) -> Capture:
    kwargs = {"tools": TOOLS, "enable_thinking": False}
    prompt = tok.render([{"role": "user", "content": "Weather?"}], template_kwargs=kwargs)
    output = tok.encode(output_text) + [profile.stop_ids[0]]
    return Capture(
        prompt_ids=prompt,
        output_ids=output,
        finish_reason="tool_calls",
        endpoint="vllm-chat",
        server_kind="vllm",
        content="",
        tool_calls=server_calls,
        settings={"tools": TOOLS, "mode": "chat"},
    )


def _server(name: str, arguments: str) -> dict:
    return {"id": "chatcmpl-tool-1", "name": name, "arguments": arguments}


def test_a_call_the_server_read_otherwise_is_found_and_one_it_read_alike_is_not(coder_tok):
    profile = detect_profile(coder_tok)
    written = "<tool_call>" + body("get_weather", ("city", "Paris"), ("days", "2")) + "</tool_call>"

    def codes(calls: list[dict] | None) -> set[str]:
        c = _capture(coder_tok, profile, written, calls)
        return {f.code for f in analyze(c, profile, coder_tok).findings if f.severity != "info"}

    assert codes([_server("get_weather", '{"city": "Paris", "days": 2}')]) == set()
    assert codes([_server("get_weather", '{"city":"Paris","days":2}')]) == set()  # SGLang's stream fragments
    assert "tool_calls_field_mismatch" in codes([_server("get_weather", '{"city": "Paris", "days": 3}')])
    assert "tool_calls_field_mismatch" in codes([_server("get_time", '{"city": "Paris", "days": 2}')])
    assert "tool_calls_field_mismatch" in codes([])  # the parser dropped the call
    broken = _capture(coder_tok, profile, "<tool_call>\nget_weather Paris\n</tool_call>", [])
    [bad] = [f for f in analyze(broken, profile, coder_tok).findings if f.code == "tool_arguments_not_object"]
    assert "holds no <function=NAME>" in bad.detail and "The harness never sees this call" in bad.detail


def test_a_history_sends_back_the_values_as_written(coder_tok):
    """Re-rendered from the exported call, the assistant turn is the ids the model wrote: `2.50` and `true` stay text
    where their typed values would render `2.5` and `True`; the values that render back keep their types."""
    params = (("query", "cats"), ("limit", "5"), ("score", "2.50"), ("exact", "true"))
    assert json.loads(history_arguments(params, TYPED, "search")) == {
        "query": "cats",
        "limit": 5,
        "score": "2.50",
        "exact": "true",
    }
    profile = detect_profile(coder_tok)
    written = "<tool_call>" + body("get_weather", ("city", "Paris"), ("days", "02")) + "</tool_call>"
    capture = _capture(coder_tok, profile, written, None)
    (call,) = served_calls(capture, profile, coder_tok)
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "days": "02"}
    messages = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    kwargs = {"tools": TOOLS, "enable_thinking": False}
    rendered = coder_tok.render(messages, add_generation_prompt=False, template_kwargs=kwargs)
    assert rendered[len(capture.prompt_ids) : len(capture.prompt_ids) + len(capture.output_ids)] == capture.output_ids


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_a_qwen3_coder_tool_loop_runs_on_the_simulator_token_exact(tmp_path, coder_dir, coder_tok, kind):
    """The simulated model writes the XML calls, the simulated servers return them as their qwen3_coder parsers
    do, and `tokview batch --history served` runs the loop: the served calls are the calls on the ids, typed by the
    request's tools, and every later prompt extends the turn before (on SGLang, whose parser returns no whitespace
    content to re-render)."""
    calls = [CALL, {**CALL, "id": "t0", "function": {"name": "get_time", "arguments": '{"city": "Oslo", "days": 1}'}}]
    results = [{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in calls]
    turn = {"role": "assistant", "content": "", "tool_calls": calls}
    messages = [TRACE["messages"][0], turn, *results, turn, *results, {"role": "assistant", "content": "Done."}]
    trace = {**TRACE, "messages": messages}
    turns = run_chain(tmp_path, coder_dir, {"tool-calls": "each", "tool-rounds": 2}, kind, trace=trace, profile=None)
    assert [len(t.capture.tool_calls or []) for t in turns] == [2, 2, 0]
    layout = detect_profile(coder_tok).tool_calls
    for t in turns[:2]:
        on_ids = parse_tool_calls(t.capture.output_ids, layout, coder_tok, TOOLS).calls
        assert [c["name"] for c in t.capture.tool_calls] == [c.name for c in on_ids] == ["get_weather", "get_time"]
        assert [json.loads(c["arguments"]) for c in t.capture.tool_calls] == [json.loads(c.arguments) for c in on_ids]
        assert isinstance(json.loads(t.capture.tool_calls[0]["arguments"])["days"], int)
        text = coder_tok.decode(t.capture.output_ids, skip_special_tokens=False)
        assert "<tool_call>\n<function=get_weather>\n<parameter=city>\n" in text
    if kind == "sglang":
        assert all(t.capture.settings["chain"]["extends"] is True for t in turns[1:])
        assert [[f.code for f in s.findings if f.severity != "info"] for s in turns] == [[], [], []]
    else:  # vLLM returns the "\n\n" after </think> as content: sent back, the template writes another newline
        assert all(f.code == "session_prefix_break" for s in turns for f in s.findings if f.severity != "info")
        assert not any(f.code.startswith("tool_") for s in turns for f in s.findings)


@pytest.mark.parametrize(
    ("quirk", "code"),
    [("unclosed-section", "tool_call_unclosed"), ("parser-drops-call", "tool_calls_field_mismatch")],
)
def test_a_qwen3_coder_tool_quirk_fires_its_finding(tmp_path, coder_dir, quirk, code):
    turns = run_chain(tmp_path, coder_dir, {quirk: True}, trace=TRACE, profile=None)
    assert code in {f.code for f in turns[0].findings}


def test_markers_at_other_ids_get_the_layout_with_those_ids(qwen_tok_dir, tmp_path):
    """Qwen3.5 has Qwen3's `<tool_call>` at 248058: no built-in layout's ids fitted, so it had no layout and its
    calls went unchecked. The layout whose marker texts the tokenizer has is taken with the tokenizer's ids."""
    moved = moved_markers_folder(coder_folder(qwen_tok_dir, tmp_path / "coder"))
    layout = detect_profile(load_tokenizer(moved)).tool_calls
    assert (layout.parser, layout.call_begin_id, layout.call_end_id) == ("qwen3_coder", 151659, 151660)
    shutil.copytree(qwen_tok_dir, tmp_path / "qwen")
    layout = detect_profile(load_tokenizer(moved_markers_folder(tmp_path / "qwen"))).tool_calls
    assert (layout.parser, layout.call_begin_id, layout.call_end_id) == ("hermes", 151659, 151660)
    turns = run_chain(tmp_path, moved, {}, "sglang", trace=TRACE, profile=None)
    assert [len(t.capture.tool_calls or []) for t in turns] == [1, 0]
    assert 151659 in turns[0].capture.output_ids and 151657 not in turns[0].capture.output_ids
    assert turns[1].capture.settings["chain"]["extends"] is True
    assert [[f.code for f in s.findings if f.severity != "info"] for s in turns] == [[], []]


def test_the_servers_own_conversions_disagree_in_text_and_agree_by_value(tmp_path, coder_dir, coder_tok):
    """A `number` parameter written `7.0` (what `| string` makes of 7.0) is 7 in vLLM's answer and 7.0 in SGLang's:
    the simulated SGLang converts as SGLang does, so its `tool_calls` are not tokview's reading in text; no finding
    says they differ, and its 7.0 sent back renders `7.0` again, so the loop extends id for id."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "move",
                "parameters": {
                    "type": "object",
                    "properties": {"x": {"type": "number", "enum": [7.0]}, "y": {"type": "number", "enum": [2.5]}},
                },
            },
        }
    ]
    call = {"id": "m0", "type": "function", "function": {"name": "move", "arguments": '{"x": 1.0, "y": 2.5}'}}
    messages = [
        {"role": "user", "content": "Move."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "m0", "content": "moved"},
        {"role": "assistant", "content": "Done."},
    ]
    trace = {"id": "m", "tools": tools, "messages": messages}
    turns = run_chain(tmp_path, coder_dir, {}, "sglang", trace=trace, profile=None)
    served = turns[0].capture.tool_calls
    (on_ids,) = parse_tool_calls(
        turns[0].capture.output_ids, detect_profile(coder_tok).tool_calls, coder_tok, tools
    ).calls
    assert on_ids.parameters == (("x", "7.0"), ("y", "2.5"))
    assert (served[0]["arguments"], on_ids.arguments) == ('{"x": 7.0, "y": 2.5}', '{"x": 7, "y": 2.5}')
    assert turns[1].capture.settings["chain"]["extends"] is True
    assert [[f.code for f in s.findings if f.severity != "info"] for s in turns] == [[], []]


def test_any_servers_reading_agrees_and_a_different_value_does_not():
    """What the servers answer for the same text: SGLang and older vLLM read no `anyOf` (an Optional[int] comes back
    as text), a boolean that is not `true` is false, an id past 2**53 stays exact, NaN, a container written as a
    JSON string holding a Python literal is decoded twice (vLLM)."""
    agree = [
        (("n", "1712345678901234567"), 1712345678901234567),
        (("b", "yes"), False),
        (("b", "True"), True),
        (("f", "NaN"), float("nan")),
        (("o", "\"{'k': 1}\""), {"k": 1}),
        (("o", '"src/a.py"'), "src/a.py"),
        (("s", "null"), None),
        (("o", "\"{'k': 1}\""), "{'k': 1}"),  # decoded once (SGLang, older vLLM)
        (("i", "2.0"), 2),
    ]
    for (key, text), value in agree:
        assert arguments_agree(((key, text),), json.dumps({key: value})), (text, value)
    differ = [
        (("n", "1712345678901234567"), 1712345678901234568),
        (("b", "true"), False),
        (("i", "2"), 3),
        (("s", "abc"), "abd"),
        (("o", '{"k": 1}'), {"k": 2}),
        (("s", "    return x\n"), "return x"),  # an edit tool's indentation lost: no server strips a value
        (("o", "[true]"), [1]),
        (("o", "[1, 2]"), [2, 1]),
    ]
    for (key, text), value in differ:
        assert not arguments_agree(((key, text),), json.dumps({key: value})), (text, value)


@pytest.mark.parametrize("value", ["...", "{1, 2}", "b'x'", "1j", "[" * 3000, "[" * 3000 + "]" * 3000])
def test_a_value_no_json_can_hold_is_no_crash(coder_tok, value):
    """`ast.literal_eval` of an object-typed value gives `...` or a set, or JSON nested past Python's limit: the
    servers' parsers fail on it and return no call; tokview said nothing and crashed in analysis and export."""
    schema = [{"type": "function", "function": {"name": "f", "parameters": {"properties": {"o": {"type": "object"}}}}}]
    call = xml_call(body("f", ("o", value)), schema)
    assert call.name == "f" and call.parameters == (("o", value),)
    json.loads(history_arguments(call.parameters, schema, "f"))
    assert not arguments_agree(call.parameters, '{"o": {}}')
    arguments_agree(call.parameters, "[" * 3000)
    profile = detect_profile(coder_tok)
    output = "<tool_call>" + body("f", ("o", value)) + "</tool_call>"
    capture = _capture(coder_tok, profile, output, [_server("f", '{"o": {}}')])
    capture = dataclasses.replace(capture, settings={"tools": schema, "mode": "chat"})
    codes = {f.code for f in analyze(capture, profile, coder_tok).findings}
    assert codes & {"tool_arguments_not_object", "tool_calls_field_mismatch"}


def test_a_value_that_writes_the_layout_s_own_tags_stays_whole(coder_tok):
    """Code that prints `</parameter>` or `</function>`: the value ends at the `</parameter>` the layout goes on
    after, so the history renders the call back id for id (cut at the first `</parameter>`, it lost the rest)."""
    code = "print('</parameter>')\nprint('</function>')\nx = '<parameter=y>'"
    profile = detect_profile(coder_tok)
    written = "<tool_call>" + body("get_weather", ("city", code), ("days", "2")) + "</tool_call>"
    capture = _capture(coder_tok, profile, written, None)
    (call,) = served_calls(capture, profile, coder_tok)
    assert json.loads(call["function"]["arguments"]) == {"city": code, "days": 2}
    messages = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    rendered = coder_tok.render(
        messages, add_generation_prompt=False, template_kwargs={"tools": TOOLS, "enable_thinking": False}
    )
    assert rendered[len(capture.prompt_ids) : len(capture.prompt_ids) + len(capture.output_ids)] == capture.output_ids
    # a value that writes a whole parameter block on lines of its own (a doc of this very format) stays whole
    doc = "Example:\n<parameter=city>\nbar\n</parameter>\nend"
    assert xml_call(body("get_weather", ("city", doc), ("days", "2"))).parameters == (("city", doc), ("days", "2"))
    # a value whose </parameter> the model left out ends where the next parameter opens, as the parsers end it
    missing = "\n<function=f>\n<parameter=a>\n1\n<parameter=b>\n2\n</parameter>\n</function>\n"
    assert xml_call(missing).parameters == (("a", "1"), ("b", "2"))
    repeated = "\n<function=f>\n<parameter=a>\none\n<parameter=a>\ntwo\n</parameter>\n</function>\n"
    assert json.loads(xml_call(repeated).arguments or "") == {"a": "two"}  # what every parser answers


def test_the_profile_is_named_for_its_layout_and_a_hermes_profile_is_refused(coder_dir, coder_tok, tmp_path, capsys):
    """A Qwen3-Coder folder was detected as `qwen3`, the built-in hermes profile's name: `--profile qwen3`, the name
    the run and the manifest showed, then read every XML call as nameless JSON and exported `{"name": ""}` calls."""
    from tokview.cli import main
    from tokview.core.profiles import get_profile

    assert detect_profile(coder_tok).name == "qwen3-coder"
    assert get_profile("qwen3-coder").tool_calls.parser == "qwen3_coder"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "hi"}) + "\n")
    args = ["batch", str(prompts), "--server", "http://127.0.0.1:9", "--db", str(tmp_path / "s.duckdb")]
    assert main([*args, "--tokenizer", str(coder_dir), "--profile", "qwen3"]) != 0
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and "writes <function=…> XML ones" in said[0] and "--profile qwen3-coder" in said[0]
    from tokview.sim.config import SimConfigError
    from tokview.sim.server import served_profile

    with pytest.raises(SimConfigError, match="writes <function=…> XML ones"):  # the simulator, and doctor, alike
        served_profile("qwen3", coder_tok)


def test_a_call_whose_name_cannot_be_read_is_refused_in_a_conversation_export(coder_tok):
    """Nameless calls (`{"name": "", "arguments": ""}`) were written into specforge and sharegpt conversations."""
    from tokview.export.formats import Refused

    profile = detect_profile(coder_tok)
    capture = _capture(coder_tok, profile, "<tool_call>\nget_weather Paris\n</tool_call>", None)
    with pytest.raises(Refused, match="tool_call_unreadable"):
        served_calls(capture, profile, coder_tok)
    whole = (("scale", "5.0"), ("flag", "true"), ("n", "5"))
    tools = [{"function": {"name": "g", "parameters": {"properties": {k: {"type": "number"} for k, _ in whole}}}}]
    assert history_arguments(whole, tools, "g") == '{"scale": 5.0, "flag": "true", "n": 5}'


def test_a_coder_template_that_never_thinks_is_a_model_without_reasoning(qwen_tok_dir, tmp_path):
    """Qwen3-Coder's template never writes <think> and has no switch, though the vocabulary holds it: read with think
    delimiters, an audited plain answer got a `<think></think>` the model never wrote and doctor doubted the profile.
    Qwen3-2507 Instruct's (hermes calls) likewise; both are built in under those names."""
    from qwen3_coder_template import coder_template

    from tokview.core.profiles import get_profile

    template = coder_template(qwen_tok_dir)
    switch = "{%- if enable_thinking is defined and enable_thinking is false %}\n        {{- '<think>\\n\\n</think>\\n\\n' }}"
    assert switch in template
    never = template.replace(switch, "{%- if false %}")
    never = never.replace("'\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + ", "")
    never = never.replace("'</think>' in message.content", "false").replace(".split('</think>')", ".split('@@')")
    never = never.replace(".split('<think>')", ".split('@@')")
    assert "think>" not in never, never[never.index("think>") - 200 :][:400]
    folder = tmp_path / "coder"
    shutil.copytree(qwen_tok_dir, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": never}))
    profile = detect_profile(load_tokenizer(folder))
    assert (profile.name, profile.has_reasoning, profile.tool_calls.parser) == ("qwen3-coder", False, "qwen3_coder")
    assert profile.history_reasoning == get_profile("qwen3-coder").history_reasoning == "none"
    assert not get_profile("qwen3-coder").has_reasoning and not get_profile("qwen3-instruct").has_reasoning
    hermes = never.replace(XML_CALL_MARK, "<tool_call>\\n")  # no <function=: hermes calls
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": hermes}))
    assert detect_profile(load_tokenizer(folder)).name == "qwen3-instruct"


XML_CALL_MARK = "<tool_call>\\n<function="


def test_show_names_an_xml_calls_fields_and_aligns_its_values(coder_tok):
    """`show` labelled a call's name `tool_calls[0].id` and its values hidden, as if the parser had lost them."""
    from tokview.core.alignment import HIDDEN
    from tokview.core.tool_calls import field_name

    assert field_name(2, "qwen3_coder") == field_name(2, "glm47") == "tool_calls[0].function.name"
    assert field_name(2, "kimi_k2") == "tool_calls[0].id"
    profile = detect_profile(coder_tok)
    written = "<tool_call>" + body("get_weather", ("city", "Cairo"), ("days", "4")) + "</tool_call>"
    capture = _capture(coder_tok, profile, written, [_server("get_weather", '{"city": "Cairo", "days": 4}')])
    analysis = analyze(capture, profile, coder_tok)
    out = capture.output_ids
    hidden = {coder_tok.piece_text(out[i]) for i in analysis.alignment.positions(HIDDEN)}
    assert not hidden & {"C", "airo", "4", "Cairo", "_weather"}, hidden
