"""Tool calls on ids: the profile's layout, the parse, the segment kinds, the server's
`tool_calls` in the capture (plain, stream, dual, the store), and the alignment of the call ids to that field.

Real answers: the vLLM and SGLang recordings in tests/recordings/tools (their ordinary ids are the tiny
models' vocabulary: `kimi_output` spells them with the recorded token strings and encodes the text with the
Kimi-layout tokenizer; every special id stays as served). Qwen3's hermes layout is built from its tokenizer.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from facts import RECORDINGS

from tokview.core import segments as seg
from tokview.core.alignment import HIDDEN, KEPT
from tokview.core.analysis import analyze
from tokview.core.profiles import (
    KIMI_TOOL_CALLS,
    QWEN3_TOOL_CALLS,
    ProfileError,
    check_tool_layout_fits,
    detect_profile,
    get_profile,
    load_profile_toml,
    profile_fields,
    profile_from_fields,
)
from tokview.core.record import Capture
from tokview.core.tool_calls import _not_object, field_name, glm_value, parse_tool_calls, tool_calls_of_response
from tokview.servers.capture import merge_dual
from tokview.servers.chat import parse_chat
from tokview.servers.vllm import merge_chat_stream

TOOLS_REC = RECORDINGS / "tools"
MARKERS = (163595, 163596, 163597, 163598, 163599)
TOOL_CODES = {
    "tool_section_unclosed",
    "tool_call_unclosed",
    "tool_call_out_of_order",
    "tool_arguments_not_object",
    "tool_not_declared",
    "tool_call_id_form",
    "tool_section_in_reasoning",
    "text_after_tool_calls",
    "tool_calls_field_mismatch",
    "tool_calls_missing_from_ids",
    "tool_call_id_renumbered",
}


def _tiny_tokens() -> dict[int, str]:
    """Token strings of the tiny models' ordinary ids, from their chains."""
    table: dict[int, str] = {}
    for name in ("tiny-kimi-tools.info.json", "tiny-kimi-tools-b.info.json"):
        info = json.loads((TOOLS_REC / name).read_text())
        ids, tokens = info["chain_ids"], info["chain_tokens"]
        if ids and isinstance(ids[0], list):
            pairs = [p for chain_ids, chain_tokens in zip(ids, tokens) for p in zip(chain_ids, chain_tokens)]
        else:
            pairs = list(zip(ids, tokens))
        table.update((i, t.replace("Ġ", " ")) for i, t in pairs if i < 163584)
    return table


TINY = _tiny_tokens()


def kimi_output(recorded: list[int], tok: Any) -> list[int]:
    """The recorded output ids in the Kimi-layout tokenizer: special ids as served, each run of ordinary ids
    spelled with the tiny vocabulary and encoded."""
    out: list[int] = []
    run: list[str] = []
    for token_id in [*recorded, None]:
        if token_id is not None and token_id < 163584:
            run.append(TINY[token_id])
            continue
        if run:
            out += tok.encode("".join(run))
            run = []
        if token_id is not None:
            out.append(token_id)
    return out


def recorded_capture(name: str, tok: Any, **changes: Any) -> Capture:
    """A chat capture from a recorded answer: its fields as `parse_chat` reads them, its output ids in the
    Kimi-layout tokenizer, the request's tools in its settings (as the proxy records them)."""
    body = json.loads((TOOLS_REC / f"{name}.json").read_text())
    request = json.loads((TOOLS_REC / f"{name}.req.json").read_text())
    fields = parse_chat(body, "POST /v1/chat/completions")
    kind = "sglang" if name.startswith("sgl") else "vllm"
    fields["output_ids"] = kimi_output(fields["output_ids"], tok)
    fields["usage"] = {}  # counted in the tiny vocabulary
    kwargs = request.get("chat_template_kwargs") or {}
    settings = {"tools": request.get("tools"), "thinking": kwargs.get("thinking", True), "mode": "proxy"}
    base = dict(fields, settings=settings, endpoint=f"{kind}-chat", server_kind=kind, raw_response=body)
    base.update(changes)
    return Capture(**base)


def tool_codes(capture: Capture, profile: Any, tok: Any) -> set[str]:
    return set(analyze(capture, profile, tok).codes) & TOOL_CODES


# -- the layout in profiles -----------------------------------------------------------------------------


def test_builtin_profiles_name_their_tool_call_layout():
    assert get_profile("kimi-k2.5").tool_calls == KIMI_TOOL_CALLS
    assert get_profile("kimi-k2-thinking").tool_calls == KIMI_TOOL_CALLS
    assert get_profile("qwen3").tool_calls == QWEN3_TOOL_CALLS
    assert get_profile("plain").tool_calls is None
    assert get_profile("deepseek-r1").tool_calls is None
    assert [i for _, i, _ in KIMI_TOOL_CALLS.named_ids()] == [163595, 163596, 163597, 163598, 163599]
    assert [i for _, i, _ in QWEN3_TOOL_CALLS.named_ids()] == [151657, 151658]


def test_detected_profiles_get_the_layout_their_tokenizer_has(kimi_tok, qwen_tok):
    assert detect_profile(kimi_tok).tool_calls == KIMI_TOOL_CALLS
    assert detect_profile(qwen_tok).tool_calls == QWEN3_TOOL_CALLS


def test_layout_ids_are_checked_against_the_tokenizer(kimi_tok, qwen_tok):
    check_tool_layout_fits(get_profile("kimi-k2.5"), kimi_tok, "kimi-k2.5")
    check_tool_layout_fits(get_profile("qwen3"), qwen_tok, "qwen3")
    with pytest.raises(ProfileError, match=r"tool_calls.call_begin_id 151657 is .* not '<tool_call>'"):
        check_tool_layout_fits(get_profile("qwen3"), kimi_tok, "qwen3")
    past = get_profile("kimi-k2.5").with_overrides(tool_calls=dataclasses.replace(KIMI_TOOL_CALLS, call_end_id=999999))
    with pytest.raises(ProfileError, match="call_end_id = 999999 is not an id of this tokenizer"):
        check_tool_layout_fits(past, kimi_tok, "x.toml")
    same = get_profile("kimi-k2.5").with_overrides(
        tool_calls=dataclasses.replace(KIMI_TOOL_CALLS, call_end_id=163597, call_end="<|tool_call_begin|>")
    )
    with pytest.raises(ProfileError, match="are the same id"):
        check_tool_layout_fits(same, kimi_tok, "x.toml")


def test_a_profile_file_names_the_tool_call_ids(tmp_path: Path):
    by_name = tmp_path / "a.toml"
    by_name.write_text('[profile]\nbase = "plain"\nname = "a"\ntool_calls = "hermes"\n')
    assert load_profile_toml(by_name).tool_calls == QWEN3_TOOL_CALLS
    table = tmp_path / "b.toml"
    table.write_text(
        '[profile]\nbase = "qwen3"\nname = "b"\n[profile.tool_calls]\nparser = "hermes"\n'
        'call_begin = "<tc>"\ncall_begin_id = 7\n'
    )
    layout = load_profile_toml(table).tool_calls
    assert layout is not None
    assert (layout.call_begin_id, layout.call_begin, layout.call_end_id) == (7, "<tc>", 151658)
    none = tmp_path / "c.toml"
    none.write_text('[profile]\nbase = "kimi-k2.5"\nname = "c"\ntool_calls = "none"\n')
    assert load_profile_toml(none).tool_calls is None
    for body, message in (
        ('tool_calls = "llama3_json"', "known: kimi_k2, hermes, glm47, qwen3_coder, none"),
        ("[profile.tool_calls]\nparser = 'hermes'\ncall_begin_id = '7'", "call_begin_id has the wrong type"),
        ("[profile.tool_calls]\nparser = 'hermes'\nsection = 1", "unknown keys"),
        ("tool_calls = 3", "must be a parser name or a table"),
    ):
        bad = tmp_path / "bad.toml"
        bad.write_text(f'[profile]\nbase = "qwen3"\nname = "d"\n{body}\n')
        with pytest.raises(ProfileError, match=message):
            load_profile_toml(bad)


def test_a_run_records_the_layout_and_reads_it_back():
    profile = get_profile("qwen3").with_overrides(name="custom", tool_calls=KIMI_TOOL_CALLS)
    fields = json.loads(json.dumps(profile_fields(profile)))
    assert profile_from_fields(fields) == profile
    older = {k: v for k, v in profile_fields(get_profile("kimi-k2.5")).items() if k != "tool_calls"}
    assert profile_from_fields(older).tool_calls == KIMI_TOOL_CALLS  # recorded before layouts: the built-in's


# -- the parse and the kinds on real answers --------------------------------------------------------------


def test_parse_of_a_recorded_kimi_call(kimi_tok):
    capture = recorded_capture("vllm_t1", kimi_tok)
    out = capture.output_ids
    calls = parse_tool_calls(out, KIMI_TOOL_CALLS, kimi_tok)
    begin = out.index(163595)
    assert calls.sections == ((begin, out.index(163596) + 1),)
    assert not calls.problems
    (call,) = calls.calls
    assert (call.call_id, call.name, call.arguments) == ("functions.get_weather:0", "get_weather", '{"city": "Paris"}')
    assert call.span == (out.index(163597), out.index(163599) + 1)
    assert call.arguments_error is None
    assert kimi_tok.decode(out[slice(*call.id_span)]) == "functions.get_weather:0"
    assert calls.markers == tuple(i for i, t in enumerate(out) if t in MARKERS)


def test_tool_ids_get_their_own_kinds_and_the_rest_keeps_its_own(kimi_tok, kimi_profile):
    capture = recorded_capture("vllm_t1", kimi_tok)
    analysis = analyze(capture, kimi_profile, kimi_tok)
    n, out = len(capture.prompt_ids), capture.output_ids
    kinds = analysis.kinds[n:]
    assert [kinds[i] for i, t in enumerate(out) if t in MARKERS] == [seg.TOOL_MARKER] * 5
    call = parse_tool_calls(out, KIMI_TOOL_CALLS).calls[0]
    assert set(kinds[slice(*call.id_span)]) == {seg.TOOL_CALL_ID}
    assert set(kinds[slice(*call.arguments_span)]) == {seg.TOOL_ARGUMENTS}
    assert kinds[out.index(163607)] == seg.CLOSER
    assert kinds[-1] == seg.STOP
    assert set(kinds[: out.index(163607)]) == {seg.REASONING}
    # the segments partition the ids and agree with the kinds (the run starts include the calls' edges)
    assert [k for s in analysis.segments for k in [s.kind] * len(s)] == list(analysis.kinds)
    assert seg.segment(capture.prompt_ids, out, kimi_profile, tool_calls=True) == list(analysis.segments)


def test_an_output_without_calls_keeps_the_kinds_it_had(kimi_tok, kimi_profile, make_capture):
    capture = make_capture()
    calls = seg.tool_calls_on_ids(capture.output_ids, kimi_profile)
    assert calls is not None
    assert not calls.found
    kinds = seg.token_kinds(capture.prompt_ids, capture.output_ids, kimi_profile, tool_calls=calls)
    assert kinds == seg.token_kinds(capture.prompt_ids, capture.output_ids, kimi_profile)
    assert list(analyze(capture, kimi_profile, kimi_tok).kinds) == kinds
    assert not set(kinds) & set(seg.TOOL_KINDS)


# -- the alignment: call id and arguments kept by tool_calls, markers hidden by the tool parser ------------


@pytest.mark.parametrize("name", ["vllm_t1", "sgl_t1"])
def test_call_id_and_arguments_are_kept_by_the_tool_calls_field(name, kimi_tok, kimi_profile):
    capture = recorded_capture(name, kimi_tok)
    analysis = analyze(capture, kimi_profile, kimi_tok)
    al, out = analysis.alignment, capture.output_ids
    assert al is not None
    assert al.unmatched_text == ""
    call = parse_tool_calls(out, KIMI_TOOL_CALLS).calls[0]
    assert {al.statuses[i] for i in range(*call.id_span)} == {KEPT}
    assert {field_name(al.fields[i]) for i in range(*call.id_span)} == {"tool_calls[0].id"}
    assert {al.statuses[i] for i in range(*call.arguments_span)} == {KEPT}
    assert {field_name(al.fields[i]) for i in range(*call.arguments_span)} == {"tool_calls[0].function.arguments"}
    assert [al.statuses[i] for i, t in enumerate(out) if t in (*MARKERS, 163607, 163586)] == [HIDDEN] * 7
    assert {field_name(al.fields[i]) for i in range(out.index(163607))} == {"reasoning"}
    hidden = next(f for f in analysis.findings if f.code == "parser_hidden_ids")
    assert len(hidden.positions) == 7
    assert analysis.valid, analysis.codes
    assert not set(analysis.codes) & TOOL_CODES, analysis.codes
    assert "parser_split_mismatch" not in analysis.codes  # the call text is no answer the content lost


def test_model_b_content_before_the_calls_aligns_to_content(kimi_tok, kimi_profile):
    capture = recorded_capture("vllm_b_nothink", kimi_tok)
    analysis = analyze(capture, kimi_profile, kimi_tok)
    al, out = analysis.alignment, capture.output_ids
    before = out.index(163595)
    assert capture.content == "I will call a tool"
    assert al is not None
    assert al.unmatched_text == ""
    assert {field_name(al.fields[i]) for i in range(before)} == {"content"}
    assert analysis.valid, analysis.codes
    assert not set(analysis.codes) & TOOL_CODES, analysis.codes


# -- the server's tool_calls in the capture ----------------------------------------------------------------


def test_chat_answers_carry_the_servers_tool_calls(kimi_tok):
    want = [{"id": "functions.get_weather:0", "name": "get_weather", "arguments": '{"city": "Paris"}'}]
    for name in ("vllm_t1", "sgl_t1"):
        assert recorded_capture(name, kimi_tok).tool_calls == want
    assert recorded_capture("vllm_choice_none", kimi_tok).tool_calls is None


def _sse(name: str) -> list[dict[str, Any]]:
    lines = (TOOLS_REC / name).read_text().splitlines()
    return [json.loads(x[6:]) for x in lines if x.startswith("data: ") and x != "data: [DONE]"]


def test_a_stream_folds_its_tool_call_deltas_into_the_plain_answers_calls():
    plain = parse_chat(json.loads((TOOLS_REC / "vllm_t1.json").read_text()), "x")["tool_calls"]
    for name in ("vllm_t1_stream.txt", "sgl_t1_stream_sglext.txt"):
        chunks = _sse(name)
        assert merge_chat_stream(chunks)["tool_calls"] == plain, name
        assert tool_calls_of_response({"stream": True, "n_chunks": len(chunks), "chunks": chunks}) == plain


def test_a_dual_capture_takes_the_chat_paths_tool_calls(kimi_tok):
    chat = recorded_capture("vllm_t1", kimi_tok)
    raw = dataclasses.replace(chat, endpoint="sglang-generate", tool_calls=None, raw_response={"text": ""})
    dual = merge_dual(raw, chat, chat.output_ids)
    assert dual.tool_calls == chat.tool_calls
    assert dual.parsed_raw_response == chat.raw_response


def test_tool_calls_survive_the_store(store, kimi_tok, kimi_profile):
    from builders import put

    chat = recorded_capture("sgl_t2_rc", kimi_tok)
    raw = dataclasses.replace(chat, endpoint="sglang-generate", tool_calls=None, raw_response={"text": ""})
    for prompt_id, capture in (("chat", chat), ("dual", merge_dual(raw, chat, chat.output_ids))):
        sample_id = put(store, prompt_id, capture)
        back = store.load_sample(sample_id).capture
        assert (
            back.tool_calls
            == capture.tool_calls
            == [{"id": "functions.get_weather:1", "name": "get_weather", "arguments": '{"city": "Paris"}'}]
        )
        assert analyze(back, kimi_profile, kimi_tok).findings == analyze(capture, kimi_profile, kimi_tok).findings


def test_show_names_the_field_each_id_landed_in(tmp_path, capsys, kimi_tok, kimi_profile):
    from builders import put

    from tokview.cli import main
    from tokview.store import Store

    db = tmp_path / "s.duckdb"
    capture = recorded_capture("vllm_t1", kimi_tok)
    with Store(db) as s:
        s.put_run("run1", settings={}, profile="kimi-k2.5", tokenizer_hash=kimi_tok.fingerprint())
        sample_id = put(s, "p", capture)
    start = len(capture.prompt_ids)
    assert main(["show", sample_id, "--db", str(db), "--from", str(start), "--count", "80"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {int(line.split()[0]): line for line in lines if line.strip() and line.split()[0].isdigit()}
    out = capture.output_ids
    call = parse_tool_calls(out, KIMI_TOOL_CALLS).calls[0]
    assert "tool_marker" in rows[start + out.index(163595)]
    assert "hidden (tool parser)" in rows[start + out.index(163595)]
    assert rows[start + call.id_span[0]].rstrip().endswith("kept tool_calls[0].id")
    assert rows[start + call.arguments_span[0]].rstrip().endswith("kept tool_calls[0].function.arguments")
    assert rows[start].rstrip().endswith("kept")  # reasoning: its segment column says so


# -- hermes (Qwen3) ---------------------------------------------------------------------------------------

HERMES_CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


def hermes_capture(qwen_tok: Any, body: str = HERMES_CALL, **changes: Any) -> Capture:
    prompt = qwen_tok.render([{"role": "user", "content": "Weather in Paris?"}], template_kwargs={})
    text = f"<think>\nI check.\n</think>\n\n<tool_call>\n{body}\n</tool_call>"
    output = qwen_tok.encode(text) + [151645]
    base: dict[str, Any] = dict(
        prompt_ids=prompt,
        output_ids=output,
        finish_reason="tool_calls",
        endpoint="vllm-chat",
        server_kind="vllm",
        reasoning="I check.\n",
        content=None,
        reasoning_field="reasoning",
        tool_calls=[{"id": "chatcmpl-tool-1f0e", "name": "get_weather", "arguments": '{"city": "Paris"}'}],
        settings={"tools": [{"type": "function", "function": {"name": "get_weather"}}], "thinking": True},
    )
    base.update(changes)
    return Capture(**base)


def test_hermes_calls_on_qwen3_ids(qwen_tok, qwen_profile):
    capture = hermes_capture(qwen_tok)
    out = capture.output_ids
    calls = parse_tool_calls(out, QWEN3_TOOL_CALLS, qwen_tok)
    (call,) = calls.calls
    assert (call.name, call.arguments, call.call_id) == ("get_weather", '{"city": "Paris"}', None)
    assert calls.sections == ((out.index(151657), out.index(151658) + 1),)
    assert not calls.problems
    analysis = analyze(capture, qwen_profile, qwen_tok)
    n = len(capture.prompt_ids)
    assert analysis.kinds[n + out.index(151657)] == seg.TOOL_MARKER == analysis.kinds[n + out.index(151658)]
    al = analysis.alignment
    assert al is not None
    assert al.statuses[out.index(151657)] == HIDDEN == al.statuses[out.index(151658)]
    named = {field_name(al.fields[i], "hermes") for i in range(*call.arguments_span) if al.statuses[i] == KEPT}
    assert named == {"tool_calls[0].function.name", "tool_calls[0].function.arguments"}
    assert not set(analysis.codes) & TOOL_CODES, analysis.codes
    assert "empty_answer" not in analysis.codes  # the calls are the turn's answer


@pytest.mark.parametrize(
    ("body", "name"),
    [
        ('{"name": "search", "arguments": {"query": "Cairo"}}', "search"),  # a one-token name
        ('{"arguments": {"query": "Cairo"}, "name": "search"}', "search"),  # the keys the other way round
        ('{"name": "get_weather", "arguments": {"query": "Cairo"}}', "get_weather"),
        ('{"name": "search", "arguments": {"query": "Cairo", "filters": {"year": 2020}}}', "search"),  # nested
        ('{"arguments": {"name": "Bob", "query": "Cairo"}, "name": "search"}', "search"),  # "name" inside the arguments
        ('{"name": "search", "parameters": {"query": "Cairo"}}', "search"),  # the key SGLang's qwen25 parser also reads
    ],
)
def test_a_hermes_calls_name_and_arguments_each_align_to_their_own_field(qwen_tok, qwen_profile, body, name):
    """Aligned to the name and the arguments as one text, a one-token name (`search`) was shown hidden and the `": "`
    after `"name"` kept in the arguments (one as drift), the arguments' own ids hidden; cut at the `"arguments"` key,
    a nested value's first ids were still hidden, and a `"name"` inside the arguments was taken for the call's."""
    call_json = json.loads(body)
    arguments = call_json.get("arguments", call_json.get("parameters"))
    server = [{"id": "call-1", "name": name, "arguments": json.dumps(arguments)}]
    capture = hermes_capture(qwen_tok, body, tool_calls=server)
    out = capture.output_ids
    (call,) = parse_tool_calls(out, QWEN3_TOOL_CALLS, qwen_tok).calls
    al = analyze(capture, qwen_profile, qwen_tok).alignment
    assert al is not None
    span = range(*call.arguments_span)
    kept = {qwen_tok.decode([out[i]]): field_name(al.fields[i], "hermes") for i in span if al.statuses[i] == KEPT}
    fields = {"name": "tool_calls[0].function.name", "arguments": "tool_calls[0].function.arguments"}
    assert {piece for piece, field in kept.items() if field == fields["name"]} == set(
        qwen_tok.pieces(qwen_tok.encode(name))
    )
    assert {"query", "C", "airo"} <= {piece for piece, field in kept.items() if field == fields["arguments"]}
    if "name" not in arguments:  # the call's own keys are no field's text
        assert all(piece.strip() not in ("name", "arguments", "parameters") for piece in kept), kept
    assert not any(al.statuses[i] == "drift" for i in span)


def test_hermes_json_that_is_no_call_object_is_found(qwen_tok, qwen_profile):
    for body in ('{"name": "get_weather", "arguments": [1]}', '{"name": "get_weather", "arguments": {"city": "Par'):
        assert "tool_arguments_not_object" in tool_codes(hermes_capture(qwen_tok, body), qwen_profile, qwen_tok)


def test_runs_read_at_the_tool_edges_match_the_runs_found_id_by_id():
    """`run_starts` with the calls names every edge where a tool kind begins or ends: the runs read off those
    few positions are the runs `groupby` finds over every id, whatever order the markers come in."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from tokview.core.profiles import BUILTIN_PROFILES

    ids = st.lists(st.one_of(st.sampled_from([*MARKERS, 163606, 163607, 163586, 151657, 151658]), st.integers(0, 99)))

    @settings(max_examples=400, deadline=None)
    @given(prompt=ids, output=ids, name=st.sampled_from(["kimi-k2.5", "qwen3"]))
    def check(prompt, output, name):
        profile = BUILTIN_PROFILES[name]
        calls = seg.tool_calls_on_ids(output, profile)
        kinds = seg.token_kinds(prompt, output, profile, tool_calls=calls)
        found = seg.delimiter_positions(output, profile)
        starts = seg.run_starts(prompt, len(output), profile, found, calls)
        assert seg.segments_from_kinds(kinds, len(prompt), starts) == seg.segments_from_kinds(kinds, len(prompt))
        plain = seg.token_kinds(prompt, output, profile)
        changed = {i for i, (a, b) in enumerate(zip(kinds, plain)) if a != b}
        assert all(kinds[i] in seg.TOOL_KINDS and plain[i] in (seg.REASONING, seg.ANSWER) for i in changed)

    check()


def test_a_profile_file_whose_tool_ids_this_tokenizer_lacks_is_refused_where_profiles_are_resolved(
    tmp_path: Path, kimi_tok
):
    """Every command resolves `--profile` through core.resolve: the tool-call ids are checked there too."""
    from tokview.core.profiles import ProfileError
    from tokview.core.resolve import load_tokenizer_and_profile

    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[profile]\nbase = "kimi-k2.5"\nname = "bad"\n[profile.tool_calls]\nparser = "kimi_k2"\nsection_begin_id = 5\n'
    )
    with pytest.raises(ProfileError, match=r"tool_calls.section_begin_id 5 is .* not '<\|tool_calls_section_begin\|>'"):
        load_tokenizer_and_profile(profile=str(bad), tokenizer=kimi_tok)


def test_a_key_given_twice_is_read_as_the_parser_reads_it_the_last():
    from tokview.core.alignment import _top_level_values

    raw = b'\n{"name": "a", "name": "search", "arguments": {"q": 1}}\n'
    found = _top_level_values(raw)
    assert raw[slice(*found["name"])] == b'"search"'
    assert raw[slice(*found["arguments"])] == b'{"q": 1}'
    cut = b'{"name": "search", "arguments": {"q": "unfini'
    assert cut[slice(*_top_level_values(cut)["arguments"])] == b'{"q": "unfini', "a value cut short runs to the end"


def test_a_call_nested_deeper_than_pythons_json_reads_is_a_finding_not_a_crash(qwen_tok, qwen_profile):
    """A model that writes `[[[[…` into a call: `json.loads` raises RecursionError (no ValueError), and the whole
    analysis (so the sample's capture) failed with it."""
    deep = "[" * 100_000 + "]" * 100_000
    for body in ('{"name": "f", "arguments": ' + deep + "}", deep):
        codes = tool_codes(hermes_capture(qwen_tok, body), qwen_profile, qwen_tok)
        assert "tool_arguments_not_object" in codes
    assert glm_value(deep[:50_000] + "x") == deep[:50_000] + "x"  # neither JSON nor a literal: the text
    assert _not_object(deep) == "the arguments are JSON nested too deeply to parse"
