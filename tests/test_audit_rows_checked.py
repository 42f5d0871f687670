"""`tokview audit` reads a row as batch reads a prompts file: what batch refuses is a bad row, a metadata value the
analysis cannot read is a bad row (never a crash halfway), and an answer that calls tools keeps its calls."""

from __future__ import annotations

import json
from pathlib import Path

from builders import kimi, profile

from tokview.export.audit import audit
from tokview.store import SampleFilter, Store

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
CALL = {"id": "functions.f:0", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _ok(question: str = "hi") -> dict:
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": "ab"}]}


def test_metadata_the_analysis_cannot_read_is_a_bad_row_and_the_rows_after_it_are_audited(tmp_path):
    row = {"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}
    rows = [
        {**row, "metadata": {"usage": [1]}},  # crashed the audit (exit 70): the rows after it never read
        {**row, "metadata": {"sampling_params": "x"}},
        {**row, "metadata": {"finish_reason": 7}},
        {**row, "metadata": {"usage": {"completion_tokens": 2}}},
    ]
    with Store(tmp_path / "a.duckdb") as store:
        report = audit(store, _write(tmp_path / "m.jsonl", rows), tokenizer=kimi(), profile=profile())
    assert report.imported == 1
    assert report.bad_rows == [
        "line 1: metadata.usage = [1] is not an object",
        'line 2: metadata.sampling_params = "x" is not an object',
        "line 3: metadata.finish_reason = 7 is not text",
    ]


def test_what_batch_refuses_in_a_conversation_is_a_bad_row(tmp_path):
    object_content = {"messages": [{"role": "user", "content": {"x": 1}}, {"role": "assistant", "content": "ab"}]}
    rows = [object_content, {**_ok(), "id": "\u001b[2Jx"}, _ok("a\ud800b"), _ok()]
    with Store(tmp_path / "a.duckdb") as store:
        report = audit(store, _write(tmp_path / "c.jsonl", rows), tokenizer=kimi(), profile=profile())
    assert report.imported == 1  # the object content rendered as an empty user turn, stored as a good sample
    assert [b.split(":")[0] for b in report.bad_rows] == ["line 1", "line 2", "line 3"]
    assert "not an object" in report.bad_rows[0] and "U+001B" in report.bad_rows[1] and "U+D800" in report.bad_rows[2]


def test_a_last_turn_that_calls_tools_keeps_its_calls_and_the_prompt_declares_the_tools(tmp_path):
    """The answer was read as reasoning and content only: a call turn became `</think><|im_end|>`, an
    `empty_answer` error; and the prompt was rendered without the row's tools."""
    row = {
        "tools": TOOLS,
        "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [CALL]}],
    }
    with Store(tmp_path / "a.duckdb") as store:
        report = audit(store, _write(tmp_path / "t.jsonl", [row]), tokenizer=kimi(), profile=profile())
        assert (report.imported, report.bad_rows) == (1, [])
        [page] = store.samples_page(SampleFilter(run_id="audit-t"), limit=10)
        capture = store.load_sample(page.sample_id).capture
    tok = kimi()
    expected_prompt = tok.render(row["messages"][:1], template_kwargs={"thinking": True, "tools": TOOLS})
    whole = tok.render(row["messages"], add_generation_prompt=False, template_kwargs={"thinking": True, "tools": TOOLS})
    assert capture.prompt_ids == expected_prompt
    assert capture.output_ids == whole[len(expected_prompt) : whole.index(163586, len(expected_prompt)) + 1]
    assert 163595 in capture.output_ids  # <|tool_calls_section_begin|>
    assert "empty_answer" not in page.codes and "tool_calls_field_mismatch" not in page.codes, page.codes
    assert report.by_code.get("empty_answer", 0) == 0


def test_a_dataset_named_with_escapes_or_bytes_that_are_not_utf8(tmp_path, capsys):
    """The report line printed the file name raw (an escape sequence in it ran); a name that is not UTF-8 failed as
    "cannot write to the store", even with --name."""
    import os

    from tokview.cli import main

    hostile = tmp_path / "a\x1b]0;PWN\x07b.jsonl"
    _write(hostile, [_ok()])
    assert main(["audit", str(hostile), "--db", str(tmp_path / "a.duckdb")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "audit-a\\x1b]0;PWN\\x07b: 1 rows" in out
    raw = os.path.join(os.fsencode(tmp_path), b"e\xff.jsonl")
    with open(raw, "wb") as f:
        f.write((json.dumps(_ok()) + "\n").encode())
    named = os.fsdecode(raw)
    assert main(["audit", named, "--db", str(tmp_path / "a.duckdb")]) == 1
    assert "file name is not UTF-8: name its audit with --name" in capsys.readouterr().err
    for _ in range(2):  # and again: the same file, its stored source compared as stored
        assert main(["audit", named, "--db", str(tmp_path / "a.duckdb"), "--name", "e"]) == 0


def test_a_pre_tokenized_row_whose_answer_calls_tools_is_no_field_mismatch(tmp_path):
    """A pre-tokenized row has no server fields: its calls on the ids were compared with a `tool_calls` that was never
    there ("the server returned 0 call(s), the ids hold 1"), a false warning on every tool-calling row of an export."""
    tok = kimi()
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [CALL]}]
    prompt = tok.render(messages[:1], template_kwargs={"thinking": True, "tools": TOOLS})
    whole = tok.render(messages, add_generation_prompt=False, template_kwargs={"thinking": True, "tools": TOOLS})
    whole = whole[: whole.index(163586, len(prompt)) + 1]
    row = {"input_ids": whole, "loss_mask": [0] * len(prompt) + [1] * (len(whole) - len(prompt))}
    with Store(tmp_path / "a.duckdb") as store:
        report = audit(store, _write(tmp_path / "p.jsonl", [row]), tokenizer=tok, profile=profile())
        [page] = store.samples_page(SampleFilter(run_id="audit-p"), limit=10)
    assert report.imported == 1 and 163595 in whole[len(prompt) :]
    assert "tool_calls_field_mismatch" not in page.codes, page.codes


def test_a_speculators_row_missing_half_its_ids_is_named_so(tmp_path):
    """It said "no `messages`, `conversations` or `prompt` field", about a row that is plainly a speculators one."""
    rows = [{"input_ids": [1, 2, 3]}, {"loss_mask": [0, 1]}, {**_ok(), "input_ids": [1, 2]}, _ok()]
    with Store(tmp_path / "a.duckdb") as store:
        report = audit(store, _write(tmp_path / "s.jsonl", rows), tokenizer=kimi(), profile=profile())
    assert report.bad_rows == [
        "line 1: `input_ids` without `loss_mask`: a speculators row needs both",
        "line 2: `loss_mask` without `input_ids`: a speculators row needs both",
    ]
    assert report.imported == 2  # a conversation with extra ids is still read as its conversation
