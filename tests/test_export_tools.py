"""Per-generation exports of tool-calling samples (issue 23 item 5), recorded by `tokview proxy` against the
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
    assert SECTION_BEGIN in out and out[-1] == STOP and calling["metadata"]["is_tool_call"] is True
    assert rows[1]["metadata"]["is_tool_call"] is False and rows[2]["metadata"]["is_tool_call"] is True


def test_specforge_rows_carry_tools_calls_and_results_in_specforges_shapes(recorded, tmp_path) -> None:
    db, answers, _ = recorded
    rows, _ = _export(db, "specforge", tmp_path / "f.jsonl")
    first, second, _ = rows
    assert json.loads(first["tools"]) == TOOLS
    [call] = first["conversations"][-1]["tool_calls"]
    served = answers[0]["tool_calls"][0]
    assert call == {"id": served["id"], "type": "function", "function": served["function"]}
    assert first["conversations"][-1]["content"] == "" and first["conversations"][-1]["reasoning_content"]
    history = second["conversations"]
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant"]
    assert history[1]["tool_calls"][0]["id"] == served["id"] and history[2]["tool_call_id"] == served["id"]
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
    assert specforge["tool_rows"]["rows"] == 3 and specforge["tool_rows"]["exact"] == 2
    assert "reasoning" in specforge["tool_rows"]["why_not_exact"]
    render = manifest["rerender"]["speculators_render"]
    assert render["render_failed"] == 2 and render["tool_rows"]["rows"] == 3


def test_sharegpt_rows_carry_the_same_tool_fields_under_from_and_value(recorded, tmp_path) -> None:
    db, answers, _ = recorded
    rows, _ = _export(db, "sharegpt", tmp_path / "g.jsonl")
    turns = rows[1]["conversations"]
    assert [t["from"] for t in turns] == ["human", "gpt", "tool", "gpt"]
    assert turns[1]["tool_calls"][0]["id"] == answers[0]["tool_calls"][0]["id"]
    assert turns[2]["tool_call_id"] == answers[0]["tool_calls"][0]["id"] and json.loads(rows[1]["tools"]) == TOOLS
