"""Per-generation exports of tool-calling samples, recorded by `tokview proxy` against the
simulator: the speculators row is the served ids with every generated id supervised (reasoning, the call
section, the stop); the SpecForge and ShareGPT rows carry the request's `tools`, the assistant's `tool_calls`
and the tool results in the shapes SpecForge reads, re-render to the served ids through the template where the
template allows it, and the manifest counts honestly which rows are exact on which trainer path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from export_tool_sessions import TOOLS, record_tool_session, stored_turns
from transformers import AutoTokenizer

from tokview.cli import main
from tokview.core.analysis import analyze
from tokview.core.record import Capture
from tokview.export import ExportError, export
from tokview.export.formats import history_message
from tokview.store import Store

SECTION_BEGIN, STOP = 163595, 163586


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, kimi_tok, kimi_profile):
    db = tmp_path_factory.mktemp("tools") / "p.duckdb"
    answers = record_tool_session(db, kimi_tok, kimi_profile)
    return db, answers, stored_turns(db)


def _export(db: Path, fmt: str, out: Path) -> tuple[list[dict], dict]:
    assert main(["export", "--db", str(db), "--format", fmt, "--select", "all", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    manifest = json.loads(out.with_name(out.stem + ".manifest.json").read_text())
    return rows, manifest


def test_speculators_tool_rows_are_the_served_ids_with_every_generated_id_supervised(recorded, tmp_path) -> None:
    db, _, turns = recorded
    rows, _ = _export(db, "speculators", tmp_path / "s.jsonl")
    assert len(rows) == 3
    for row, turn in zip(rows, turns):
        n = len(turn["prompt_ids"])
        assert row["input_ids"] == turn["prompt_ids"] + turn["output_ids"]
        assert row["loss_mask"] == [0] * n + [1] * len(turn["output_ids"])
    calling = rows[0]
    out = calling["input_ids"][len(turns[0]["prompt_ids"]) :]
    assert SECTION_BEGIN in out
    assert out[-1] == STOP
    assert calling["metadata"]["is_tool_call"] is True
    assert rows[1]["metadata"]["is_tool_call"] is False
    assert rows[2]["metadata"]["is_tool_call"] is True


def test_specforge_rows_carry_tools_calls_and_results_in_specforges_shapes(recorded, tmp_path) -> None:
    db, answers, _ = recorded
    rows, _ = _export(db, "specforge", tmp_path / "f.jsonl")
    first, second, _ = rows
    assert json.loads(first["tools"]) == TOOLS
    [call] = first["conversations"][-1]["tool_calls"]
    served = answers[0]["tool_calls"][0]
    assert call == {"id": served["id"], "type": "function", "function": served["function"]}
    assert first["conversations"][-1]["content"] == ""
    assert first["conversations"][-1]["reasoning_content"]
    history = second["conversations"]
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant"]
    assert history[1]["tool_calls"][0]["id"] == served["id"]
    assert history[2]["tool_call_id"] == served["id"]
    assert history[1]["reasoning_content"] == answers[0]["reasoning"]


def test_a_tool_row_rerenders_to_the_served_ids_through_the_hf_template_as_specforge_feeds_it(
    recorded, tmp_path, kimi_tok_dir
) -> None:
    """SpecForge's parser json.loads each call's arguments and the template re-serialises them: the row renders
    back to the served prompt + output ids (the Kimi template writes the loop's reasoning while no plain answer
    follows)."""
    db, _, turns = recorded
    [first, *_] = _export(db, "specforge", tmp_path / "f.jsonl")[0]
    hf = AutoTokenizer.from_pretrained(kimi_tok_dir)
    messages = []
    for m in first["conversations"]:
        m = dict(m)
        for call in m.get("tool_calls") or []:
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
        messages.append(m)
    text = hf.apply_chat_template(messages, tools=json.loads(first["tools"]), tokenize=False)
    assert hf(text, add_special_tokens=False)["input_ids"] == turns[0]["prompt_ids"] + turns[0]["output_ids"]


def test_the_manifest_counts_which_tool_rows_are_exact_on_which_path_and_why(recorded, tmp_path) -> None:
    db, _, _ = recorded
    _, manifest = _export(db, "specforge", tmp_path / "f.jsonl")
    specforge = manifest["rerender"]["specforge"]
    # turn 1 ends in a plain answer: re-rendered whole, the template drops the loop's reasoning it was served with
    assert (specforge["rows"], specforge["exact"], specforge["ids_differ"]) == (3, 2, 1)
    assert specforge["first_differing_ids"] == ["session:weather#turn1"]
    assert specforge["tool_rows"]["rows"] == 3
    assert specforge["tool_rows"]["exact"] == 2
    assert "reasoning" in specforge["tool_rows"]["why_not_exact"]
    render = manifest["rerender"]["speculators_render"]
    assert render["render_failed"] == 2
    assert render["tool_rows"]["rows"] == 3


def test_sharegpt_rows_carry_the_same_tool_fields_under_from_and_value(recorded, tmp_path) -> None:
    db, answers, _ = recorded
    rows, _ = _export(db, "sharegpt", tmp_path / "g.jsonl")
    turns = rows[1]["conversations"]
    assert [t["from"] for t in turns] == ["human", "gpt", "tool", "gpt"]
    assert turns[1]["tool_calls"][0]["id"] == answers[0]["tool_calls"][0]["id"]
    assert turns[2]["tool_call_id"] == answers[0]["tool_calls"][0]["id"]
    assert json.loads(rows[1]["tools"]) == TOOLS


# -- rows built from served ids (no server): argument spelling, a hermes layout, the history's reasoning ----------

WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
QUESTION = [{"role": "user", "content": "Weather in Paris?"}]


def _served(prompt, output, settings, server_kind="vllm") -> Capture:
    return Capture(
        prompt_ids=prompt,
        output_ids=output,
        finish_reason="tool_calls",
        messages=QUESTION,
        settings=settings,
        endpoint="vllm-chat",
        server_url="http://127.0.0.1:8000",
        server_kind=server_kind,
    )


def _export_one(tmp_path, capture, tok, prof, fmt):
    store = Store(tmp_path / f"{fmt}.duckdb")
    store.put_run("run1", profile=prof.name, tokenizer_hash=tok.fingerprint())
    store.put_sample("s1", "p1", "run1", capture, analyze(capture, prof, tok), gen_index=0, profile=prof.name)
    result = export(store, fmt, tmp_path / f"{fmt}.jsonl", select="all", tokenizer=tok, profile=prof)
    store.close()
    return result


def _kimi_call(kimi_tok, kimi_profile, arguments: str) -> Capture:
    kwargs = kimi_profile.template_kwargs(True)
    prompt = kimi_tok.render(QUESTION, template_kwargs={**kwargs, "tools": WEATHER})
    call = [163595, 163597, *kimi_tok.encode("functions.get_weather:0"), 163598, *kimi_tok.encode(arguments)]
    output = kimi_tok.encode("I check") + [kimi_profile.think_close_id, *call, 163599, 163596, STOP]
    return _served(prompt, output, {"thinking": True, "chat_template_kwargs": kwargs, "tools": WEATHER})


@pytest.mark.parametrize(("arguments", "exact"), [('{"city": "Paris"}', 1), ('{"city":"Paris"}', 0)])
def test_a_call_is_exact_on_specforges_path_only_when_its_arguments_are_spelled_as_tojson_writes_them(
    tmp_path, kimi_tok, kimi_profile, arguments, exact
) -> None:
    """SpecForge loads the arguments as JSON and the template writes them back with tojson: a model that wrote
    `{"city":"Paris"}` is re-rendered as `{"city": "Paris"}`; the row keeps the text, the count says so."""
    result = _export_one(tmp_path, _kimi_call(kimi_tok, kimi_profile, arguments), kimi_tok, kimi_profile, "specforge")
    [row] = [json.loads(line) for line in (tmp_path / "specforge.jsonl").read_text().splitlines()]
    assert row["conversations"][-1]["tool_calls"][0]["function"]["arguments"] == arguments
    rerender = result.manifest["rerender"]["specforge"]
    assert (rerender["exact"], rerender["tool_rows"]["exact"]) == (exact, exact)


def test_a_hermes_call_row_re_renders_exactly_and_kimi_inline_refuses_it_with_the_reason(
    tmp_path, qwen_tok, qwen_profile
) -> None:
    """Qwen3 writes `</think>\\n\\n<tool_call>…`: the blank between is the template's, not content (as content
    the template would write one more newline); the call's id is the server's (hermes writes none)."""
    p = qwen_profile
    kwargs = p.template_kwargs(True)
    prompt = qwen_tok.render(QUESTION, template_kwargs={**kwargs, "tools": WEATHER})
    body = '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    output = [p.think_open_id, *qwen_tok.encode("\nI check\n"), p.think_close_id, *qwen_tok.encode("\n\n")]
    output += [151657, *qwen_tok.encode(body), 151658, p.stop_ids[0]]
    capture = _served(prompt, output, {"thinking": True, "chat_template_kwargs": kwargs, "tools": WEATHER})
    server_call = {"id": "chatcmpl-tool-7", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    capture.raw_response = {"choices": [{"message": {"content": None, "tool_calls": [server_call]}}]}
    result = _export_one(tmp_path, capture, qwen_tok, p, "specforge")
    [row] = [json.loads(line) for line in (tmp_path / "specforge.jsonl").read_text().splitlines()]
    last = row["conversations"][-1]
    assert last["content"] == ""
    assert last["tool_calls"][0]["id"] == "chatcmpl-tool-7"
    assert json.loads(last["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    assert result.manifest["rerender"]["specforge"]["exact"] == 1
    # a Qwen3 export warns against SpecForge's Qwen built-ins (it named Kimi's, and pointed at an empty list)
    assert "qwen3-thinking" in result.manifest["trainers"]["specforge"]["warning"]
    assert any("qwen3-thinking" in w and "supervises" in w for w in result.manifest["warnings"])
    assert "Qwen3's writes a newline" in result.manifest["rerender"]["specforge"]["tool_rows"]["why_not_exact"]
    with pytest.raises(
        ExportError, match=r"every one of the 1 selected samples was refused \(refused: 1 tool_calls_not_inline\)"
    ):
        _export_one(tmp_path, capture, qwen_tok, p, "kimi-inline")


def test_history_reasoning_is_carried_where_the_server_read_it() -> None:
    """vLLM renders history reasoning sent as `reasoning_content` or `reasoning`; SGLang ignores `reasoning`."""
    sent = {"role": "assistant", "content": None, "reasoning": "I check", "tool_calls": [{"id": "c0"}]}
    assert history_message(sent, "vllm")["reasoning_content"] == "I check"
    assert "reasoning_content" not in history_message(sent, "sglang")
    assert history_message(sent, "sglang")["tool_calls"] == [
        {"id": "c0", "type": "function", "function": {"name": "", "arguments": ""}}
    ]
    result = {"role": "tool", "tool_call_id": "c0", "name": "get_weather", "content": "sunny"}
    assert history_message(result, "sglang") == result


@pytest.mark.parametrize("tool_choice", ["auto", "none"])
def test_an_sglang_row_carries_the_tools_as_sglang_rendered_them(tmp_path, kimi_tok, kimi_profile, tool_choice) -> None:
    """SGLang renders each tool with `"defer_loading": null`, and none with `tool_choice: none`: a row carrying the
    request's tools re-rendered to other ids inside the tools block on every SGLang row with tools (0 of 50 exact
    in SpecForge's own loader)."""
    kwargs = kimi_profile.template_kwargs(True)
    served_tools = None if tool_choice == "none" else [{**WEATHER[0], "defer_loading": None}]
    prompt = kimi_tok.render(QUESTION, template_kwargs={**kwargs, **({"tools": served_tools} if served_tools else {})})
    output = kimi_tok.encode("It is sunny.") if tool_choice == "none" else kimi_tok.encode("I check")
    output = [kimi_profile.think_close_id, *output, STOP]
    settings = {"thinking": True, "chat_template_kwargs": kwargs, "tools": WEATHER, "tool_choice": tool_choice}
    capture = _served(prompt, output, settings, server_kind="sglang")
    capture.finish_reason = "stop"
    result = _export_one(tmp_path, capture, kimi_tok, kimi_profile, "specforge")
    [row] = [json.loads(line) for line in (tmp_path / "specforge.jsonl").read_text().splitlines()]
    assert (json.loads(row["tools"]) if "tools" in row else None) == served_tools
    assert result.manifest["rerender"]["specforge"]["exact"] == 1


def test_another_family_s_manifest_points_at_a_template_only_when_one_was_written(tmp_path, qwen_tok) -> None:
    """A deepseek-r1 sharegpt export (no template written) was told to "register this one"."""
    from tokview.core.profiles import get_profile

    prof = get_profile("deepseek-r1")
    prompt = qwen_tok.render(QUESTION, template_kwargs={})
    capture = _served(prompt, [*qwen_tok.encode("Sunny."), 151645], {"thinking": True})
    capture.finish_reason = "stop"
    specforge = _export_one(tmp_path, capture, qwen_tok, prof, "sharegpt").manifest["trainers"]["specforge"]
    assert specforge["path"].startswith("no template written")
    assert specforge["warning"] == "SpecForge's built-in templates were not checked against these served ids"
