"""Prompt rows are checked when the file is read (line numbers, clean messages), and the exit code says
when rows were skipped or the file held nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokview.batch import BatchConfig, InputError, read_prompts
from tokview.batch.config import BatchSummary, reason_class
from tokview.cli import main


def _write(tmp_path: Path, *lines: str, name: str = "p.jsonl", bom: bool = False) -> Path:
    path = tmp_path / name
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + "".join(line + "\n" for line in lines).encode("utf-8"))
    return path


def _row(**kw) -> str:
    return json.dumps(kw)


@pytest.mark.parametrize(
    "row, expected",
    [
        (_row(id="a", messages=[{"role": "user", "content": 123}]), "line 1: message 1 `content` must be a string"),
        (_row(id="a", messages=[{"role": "user", "content": {"a": 1}}]), "not an object"),
        (_row(id="a", conversations=[{"from": "human", "value": 5}]), "line 1: message 1 `value` must be a string"),
        (
            _row(id="a", messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
            "part 1 (image_url) has no text string",
        ),
        (_row(id="a", messages=[{"role": "user", "content": [7]}]), "part 1 is a number"),
        ('{"id": "a", "prompt": "hi \\ud800 there"}', "lone UTF-16 surrogate U+D800"),
        ('{"id": "a\\u0000b", "prompt": "hi"}', "control character U+0000"),
        (_row(id=[1], prompt="hi"), "`id` must be a string or a whole number"),
        (_row(id=1.0, prompt="hi"), "not the decimal 1.0 (an integer column with a missing value is written as"),
        (_row(id="a", prompt="hi", system_prompt="Be brief."), "`system_prompt` is not read, so the prompt would go"),
        (
            _row(id="a", messages=[{"role": "user", "content": "<image>\nWhat is this?"}], image="coco/1.jpg"),
            "`image` is not sent (tokview sends text only)",
        ),
        (_row(id="a", messages=[{"role": "user", "content": "x", "reasoning_content": 3}]), "must be a string"),
    ],
)
def test_a_bad_row_is_named_by_line_when_the_file_is_read(tmp_path, row, expected):
    path = _write(tmp_path, row, _row(id="good", prompt="fine"))
    rows, bad = read_prompts(path)
    assert [r.prompt_id for r in rows] == ["good"]
    assert len(bad) == 1, bad
    assert bad[0].startswith("line 1:"), bad
    assert expected.split("line 1: ")[-1] in bad[0], bad


def test_an_object_as_content_is_not_stored_as_an_empty_prompt(tmp_path):
    # before: parse_row kept {"a": 1} as the content and the template rendered an empty user turn
    rows, bad = read_prompts(_write(tmp_path, _row(id="x", messages=[{"role": "user", "content": {"a": 1}}])))
    assert rows == []
    assert "message 1 `content` must be a string or a list of text parts, not an object" in bad[0]


def test_text_parts_still_read(tmp_path):
    rows, bad = read_prompts(
        _write(
            tmp_path,
            _row(
                id="x",
                messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
            ),
        )
    )
    assert not bad
    assert rows[0].messages[0]["content"] == "ab"


def test_the_same_id_with_other_text_is_a_conflict_not_a_duplicate(tmp_path):
    path = _write(tmp_path, _row(id="q", prompt="one"), _row(id="q", prompt="one"), _row(id="q", prompt="two"))
    rows, bad = read_prompts(path)
    assert len(rows) == 2  # the identical repeat stays a duplicate for the planner to count
    assert bad == [
        "line 3: id 'q' conflicts with line 1: same id, different conversation (give one of them another id)"
    ]


def test_a_byte_order_mark_is_not_a_bad_row(tmp_path):
    rows, bad = read_prompts(_write(tmp_path, _row(id="a", prompt="hi"), bom=True))
    assert not bad
    assert [r.prompt_id for r in rows] == ["a"]


def test_json_errors_have_a_clean_message(tmp_path):
    _rows, bad = read_prompts(_write(tmp_path, '{"id": "a", "prompt": "tab\there"}', "{nope"))
    assert bad[0] == (
        "line 1: not valid JSON: a raw control character U+0009 inside a string at column 27 "
        "(JSON needs it escaped as \\t)"
    )
    assert bad[1] == "line 2: not valid JSON: expecting property name enclosed in double quotes at column 2"
    assert not any(" at at " in b for b in bad)


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_an_empty_or_blank_file_is_an_error_not_a_run_of_zero(tmp_path, capsys, content):
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(InputError, match="holds no prompt rows"):
        read_prompts(path)
    db = tmp_path / "never.duckdb"
    code = main(["batch", str(path), "--server", "http://127.0.0.1:9", "--db", str(db)])
    err = capsys.readouterr().err
    assert code == 1
    assert len(err.strip().splitlines()) == 1
    assert "holds no prompt rows" in err
    assert not db.exists()


@pytest.mark.parametrize("indent", [None, 2])
def test_a_json_array_file_is_refused_in_one_line_not_run_as_hundreds_of_bad_rows(tmp_path, capsys, indent):
    """A ShareGPT or Alpaca `.json` dump (an array) ran as 522 "not valid JSON" bad rows and exit 4, which a script
    reads as a finished run; one line exits 1 now, before a store is made."""
    rows = [{"id": f"r{i}", "conversations": [{"from": "human", "value": f"hi {i}"}]} for i in range(3)]
    path = tmp_path / "dump.json"
    path.write_text("\ufeff\n" + json.dumps(rows, indent=indent))
    db = tmp_path / "never.duckdb"
    code = main(["batch", str(path), "--server", "http://127.0.0.1:9", "--db", str(db)])
    err = capsys.readouterr().err
    assert code == 1, err
    assert len(err.strip().splitlines()) == 1, err
    assert "is a JSON array, not JSONL (one JSON object per line)" in err
    assert not db.exists()


def test_a_system_prompt_beside_a_system_turn_is_the_turn_sent(tmp_path):
    """Only a `system_prompt` no turn carries is refused (`_check_unread`): beside one, the turn is what is sent."""
    row = _row(
        id="s",
        system_prompt="Be brief.",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
    )
    rows, bad = read_prompts(_write(tmp_path, row))
    assert not bad and rows[0].messages[0] == {"role": "system", "content": "Be brief."}


def test_skipped_bad_rows_make_exit_code_4_and_failures_win():
    summary = BatchSummary(run_id="r", input=3, ok=2, skipped=1, bad_rows=["line 2: x"])
    assert summary.exit_code == 4
    summary.failed, summary.ok = 1, 1
    assert summary.exit_code == 3
    assert BatchSummary(run_id="r", input=1, ok=1).exit_code == 0


@pytest.mark.parametrize("flag", ["--temperature", "--top-p", "--timeout"])
@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
def test_non_finite_numbers_are_refused(tmp_path, capsys, flag, value):
    db = tmp_path / "never.duckdb"
    path = _write(tmp_path, _row(id="a", prompt="hi"))
    code = main(["batch", str(path), "--server", "http://127.0.0.1:9", "--db", str(db), f"{flag}={value}"])
    err = capsys.readouterr().err
    assert code == 1
    assert f"{flag} must be a finite number" in err
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(InputError, match="finite"):
        BatchConfig(
            servers=["http://x"], temperature=float(value)
        ).validate() if flag == "--temperature" else BatchConfig(
            servers=["http://x"], top_p=float(value)
        ).validate() if flag == "--top-p" else BatchConfig(servers=["http://x"], timeout=float(value)).validate()


def test_sim_and_doctor_refuse_non_finite_seconds(capsys):
    assert main(["sim", "--latency", "inf", "--port", "0"]) == 1
    assert main(["doctor", "--server", "http://127.0.0.1:9", "--timeout", "nan"]) == 1
    err = capsys.readouterr().err
    assert "--latency must be a finite number" in err
    assert "--timeout must be a finite number" in err


def test_failures_are_grouped_by_reason_class():
    reasons = {
        "HTTP 500 from POST /generate: boom 1 (gave up after 4 attempts)": 3,
        "HTTP 500 from POST /generate: boom 2 (gave up after 4 attempts)": 2,
        "timed out after 5s waiting for POST http://127.0.0.1:1/generate (gave up after 4 attempts)": 1,
        "unexpected error: TypeError: 'int' object is not iterable": 1,
        "over_max_length: the prompt has 40 tokens, the server's max_model_len is 32": 2,
    }
    summary = BatchSummary(run_id="r", input=9, failed=9, failures_by_reason=reasons)
    assert summary.failures_by_class == {
        "HTTP 500 from POST /generate": 5,
        "over_max_length": 2,
        "timed out": 1,
        "unexpected error: TypeError": 1,
    }
    assert summary.failure_examples()["HTTP 500 from POST /generate"].startswith("HTTP 500 from POST /generate: boom 1")
    assert "failed x5: HTTP 500 from POST /generate (e.g. HTTP 500" in summary.render()
    assert reason_class("cannot connect to http://h:1 (ConnectError: refused)") == "cannot connect"
    # a proxy's streams cut at any chunk are one kind (`tokview stats` listed a line per chunk count)
    cut = ["abandoned by the client after 1 chunk (the upstream request was closed)"]
    cut += [f"abandoned by the client after {n} chunks (the upstream request was closed)" for n in (2, 17, 250)]
    assert {reason_class(r) for r in cut} == {"abandoned by the client after N chunks"}
    assert reason_class("the upstream aborted the stream after 9 chunks: engine died") == (
        "the upstream aborted the stream after N chunks"
    )


def test_an_unused_field_with_a_lone_surrogate_does_not_reject_the_row(tmp_path):
    rows, bad = read_prompts(
        _write(
            tmp_path,
            '{"id": "a", "prompt": "hi", "meta": "\\udc80"}',
            '{"id": "b", "prompt": "hi", "system": "\\udc80"}',
        )
    )
    assert [r.prompt_id for r in rows] == ["a"]
    assert bad[0].startswith("line 2: a lone UTF-16 surrogate U+DC80")


BATCH_PROMPTS = Path(__file__).resolve().parents[1] / "sample_data" / "plain_prompts.jsonl"


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--retries", "-1"], "--retries must be 0 or more"),
        (["--timeout", "-1"], "--timeout must be more than 0"),
        (["--timeout", "0"], "--timeout must be more than 0"),
        (["--limit", "-1"], "--limit must be at least 1"),
        (["--limit", "0"], "--limit must be at least 1"),
        (["--concurrency", "0"], "--concurrency must be at least 1"),
        (["--samples-per-prompt", "0"], "--samples-per-prompt must be between 1 and 10,000"),
        (["--samples-per-prompt", "100000000"], "--samples-per-prompt must be between 1 and 10,000"),  # planned whole
        (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
        (["--top-p", "1.5"], "--top-p must be above 0 and at most 1"),
        (["--top-p", "-0.1"], "--top-p must be above 0 and at most 1"),
        (["--top-p", "0"], "--top-p must be above 0 and at most 1 (vLLM and SGLang refuse 0)"),
        (["--temperature", "-1"], "--temperature must be 0 or more"),
        (["--server", "http://127.0.0.1:99999"], "out of range"),
        (["--server", "http://"], "bad server URL"),
        (["--server", "ftp://127.0.0.1:8000"], "http:// or https://"),
        # flags that cannot go together: each failed every row on its own (exit 3, failures stored), or ran chat
        # under the raw run's id
        (["--chat-template-kwargs", '{"add_generation_prompt": false}'], "may not set add_generation_prompt"),
        (["--chat-template-kwargs", '{"messages": 1, "tokenize": true}'], "may not set messages, tokenize"),
        (["--backend", "sglang", "--mode", "chat", "--chat-template-kwargs", '{"tools": []}'], "may not set tools"),
        (["--backend", "sglang-chat", "--mode", "raw"], "it runs --mode chat, not raw"),
        (["--backend", "sglang-chat", "--mode", "dual"], "it runs --mode chat, not dual"),
        (["--backend", "sglang-chat", "--logprobs", "5"], "names logprob tokens by text"),
        (["--backend", "sglang", "--mode", "chat", "--logprobs", "5"], "names logprob tokens by text"),
    ],
)
def test_bad_numbers_and_urls_are_one_line_usage_errors(tmp_path, capsys, flags, message):
    db = tmp_path / "never.duckdb"
    server = [] if "--server" in flags else ["--server", "http://127.0.0.1:9"]
    code = main(["batch", str(BATCH_PROMPTS), "--db", str(db), *server, *flags])
    err = capsys.readouterr().err
    assert code == 1
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err
    assert not db.exists()  # refused before the database file was created


def test_iter_rows_is_the_public_reader_for_jsonl_and_parquet(tmp_path):
    import duckdb

    from tokview.batch.inputs import iter_rows

    pq = tmp_path / "p.parquet"
    duckdb.connect().execute(
        f"COPY (SELECT * FROM read_json_auto('{BATCH_PROMPTS}') LIMIT 3) TO '{pq}' (FORMAT parquet)"
    )
    from_jsonl = [row for _, row in iter_rows(BATCH_PROMPTS)][:3]
    from_parquet = [row for _, row in iter_rows(pq)]
    assert len(from_parquet) == 3
    assert [r["id"] for r in from_parquet] == [r["id"] for r in from_jsonl]
    assert [r.get("prompt") for r in from_parquet] == [r.get("prompt") for r in from_jsonl]


def test_agent_traces_read_from_parquet_are_the_jsonl_rows_without_other_rows_keys(tmp_path, kimi_tok):
    """A struct column holds every row's keys: each row's `tools` declared the other rows' parameters as null (28
    ids more in every prompt, and a model that called them), and object arguments rendered `"zone": null`."""
    import duckdb

    from tokview.batch.inputs import iter_rows, without_nulls

    traces = Path(__file__).resolve().parents[1] / "sample_data" / "agent_traces.jsonl"
    pq = tmp_path / "traces.parquet"
    duckdb.connect().execute(f"COPY (SELECT * FROM read_json_auto('{traces}')) TO '{pq}' (FORMAT parquet)")
    from_jsonl = [row for _, row in iter_rows(traces)]
    from_parquet = [row for _, row in iter_rows(pq)]
    assert len(from_parquet) == len(from_jsonl) > 3
    assert any("tools" in row for row in from_jsonl)
    for pq_row, json_row in zip(from_parquet, from_jsonl):
        assert pq_row.get("tools") == json_row.get("tools"), json_row["id"]
        # an explicit `"content": null` reads as absent (Parquet cannot tell them apart): the same prompt ids
        assert pq_row["messages"] == without_nulls(json_row["messages"]), json_row["id"]
        kwargs = {"tools": json_row["tools"]} if "tools" in json_row else {}
        assert kimi_tok.render(pq_row["messages"], template_kwargs=kwargs) == kimi_tok.render(
            json_row["messages"], template_kwargs=kwargs
        ), json_row["id"]


def test_agent_traces_are_sent_whole_on_chat_and_refused_on_the_paths_that_would_drop_their_tools(tmp_path):
    """A row's tool definitions and an assistant turn's tool_calls were once dropped without a word (the server
    generated from another prompt); then refused outright. Now the chat path sends them, and the raw and dual
    paths, which render no tools and read no calls, refuse the row on the path `tokview batch` plans with (its
    fast reader once let a `tools` row through)."""
    import json

    from tokview.batch.config import BatchConfig
    from tokview.batch.worklist import plan_work
    from tokview.core.prompts import PromptError, parse_row

    tools_row = {
        "id": "t1",
        "tools": [{"type": "function", "function": {"name": "get_weather"}}],
        "messages": [{"role": "user", "content": "weather?"}],
    }
    nameless_call = {
        "id": "t2",
        "tools": tools_row["tools"],
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function"}]},
            {"role": "tool", "content": "sunny"},
        ],
    }
    assert parse_row(tools_row, line=3).tools == tools_row["tools"]
    with pytest.raises(PromptError, match="line 3: message 2: call 1 has no function name"):
        parse_row(nameless_call, line=3)
    path = tmp_path / "p.jsonl"
    ok = {"id": "ok", "messages": [{"role": "user", "content": "hi"}]}
    path.write_text("".join(json.dumps(r) + "\n" for r in (tools_row, nameless_call, ok)))
    identity = {"model": "m", "tokenizer": "t", "profile": "p"}
    for mode, planned in (("raw", 1), ("dual", 1), ("chat", 2)):
        config = BatchConfig(servers=[], prompts_path=path, mode=mode)
        work = plan_work(config, config.sample_settings(identity), lambda _f: set())
        assert work.planned == planned
        assert work.bad[-1].startswith("line 2: message 2: call 1 has no function name")
        if mode != "chat":
            assert len(work.bad) == 2
            assert work.bad[0].startswith("line 1: the row is an agent trace")
            assert "only --mode chat" in work.bad[0]
    import duckdb  # a Parquet file's rows are said as rows, as every other message of one says

    pq = tmp_path / "p.parquet"
    duckdb.connect().execute(f"COPY (SELECT * FROM read_json_auto('{path}') LIMIT 1) TO '{pq}' (FORMAT parquet)")
    config = BatchConfig(servers=[], prompts_path=pq, mode="raw")
    work = plan_work(config, config.sample_settings(identity), lambda _f: set())
    assert work.bad[0].startswith("row 1: the row is an agent trace"), work.bad


def test_many_agent_rows_in_a_raw_run_are_said_once_with_what_to_do(capsys):
    from tokview.batch.inputs import AGENT_ROW, say_bad_rows

    say_bad_rows("p.jsonl", [f"line {n}: the row {AGENT_ROW} sends as the file means it" for n in range(1, 31)])
    err = capsys.readouterr().err.splitlines()
    assert err[20] == "tokview: … and 10 more bad rows"
    assert err[21] == "tokview: note: 30 rows are agent traces: run with --mode chat to generate them"


def test_a_prompts_file_whose_rows_carry_generation_settings_is_told_they_are_not_read(tmp_path, vllm_sim, capsys):
    """A row holding `max_tokens` and `chat_template_kwargs` (a saved request body) was generated with the command
    line's settings, thinking on, saying nothing."""
    from tokview.batch.inputs import row_settings_note
    from tokview.cli import main

    rows = tmp_path / "p.jsonl"
    rows.write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "chat_template_kwargs": {}})
        + "\n"
    )
    assert main(["batch", str(rows), "--server", vllm_sim.url, "--db", str(tmp_path / "s.duckdb")]) == 0
    said = capsys.readouterr().err
    assert "generation settings (max_tokens, chat_template_kwargs), which batch does not read" in said
    plain = tmp_path / "q.jsonl"
    plain.write_text(json.dumps({"prompt": "hi", "id": "a"}) + "\n")
    assert row_settings_note(plain) is None
    assert row_settings_note(tmp_path / "missing.jsonl") is None  # the run says what is wrong with the file
    agent = tmp_path / "agent.jsonl"  # a saved agent request: its tool_choice is not sent either
    agent.write_text(json.dumps({"prompt": "hi", "tool_choice": "none", "parallel_tool_calls": False}) + "\n")
    assert "generation settings (tool_choice, parallel_tool_calls), which batch does not read" in str(
        row_settings_note(agent)
    )


def test_a_line_cut_short_is_told_at_its_own_last_column(tmp_path):
    """The newline stayed in the text handed to the JSON reader, so a cut line was "expecting value at column 1" (of
    the line after it)."""
    from tokview.batch.inputs import iter_jsonl_fast

    path = tmp_path / "cut.jsonl"
    path.write_text('{"id": "a", "prompt": "hi"}\n{"id": "x", "messages": [ \n')
    said = [str(v) for _, v, _ in iter_jsonl_fast(path)][1]
    assert said == "line 2: not valid JSON: expecting value at column 27"
