"""`tokview audit`: datasets made by other pipelines, read back into the store and checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from builders import kimi, make_capture, profile, put

from tokview.errors import TokviewError
from tokview.export import export
from tokview.export.audit import audit, encode_literal
from tokview.store import SampleFilter, Store

ROOT = Path(__file__).resolve().parents[1]


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _codes(store: Store, run_id: str) -> dict[str, list[str]]:
    return {r.prompt_id: r.codes for r in store.samples_page(SampleFilter(run_id=run_id), limit=1000)}


def test_encode_literal_keeps_typed_markers_literal():
    ids = encode_literal(kimi(), "a <think> b")
    assert 163606 not in ids
    assert kimi().decode(ids) == "a <think> b"


def test_specforge_rows(tmp_path):
    rows = [
        {
            "id": "good",
            "conversations": [
                {"role": "user", "content": "what is the answer"},
                {
                    "role": "assistant",
                    "content": "The answer is forty - two",
                    "reasoning_content": "Okay , let me think",
                },
            ],
            "status": "success",
        },
        # reasoning read from the wrong field by the pipeline: the row carries none → empty reasoning
        {
            "id": "wrong-field",
            "conversations": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "Hello world !"}],
        },
        {
            "id": "typed-think",
            "conversations": [
                {"role": "user", "content": "hello"},
                {"role": "assistant", "content": "<think>hmm</think> yes", "reasoning": "Okay"},
            ],
        },
        {
            "id": "cut",
            "truncated": True,
            "messages": [
                {"role": "user", "content": "why"},
                {"role": "assistant", "content": "because", "thinking": "Okay"},
            ],
        },
        "not json",
        {"id": "no-assistant", "messages": [{"role": "user", "content": "hi"}]},
    ]
    with Store(tmp_path / "a.duckdb") as store:
        report = audit(store, _write(tmp_path / "sf.jsonl", rows), tokenizer=kimi(), profile=profile())
        assert (report.rows, report.imported, len(report.bad_rows)) == (6, 4, 2)
        assert report.bad_rows[0].startswith("line 5")
        assert "line 6" in report.bad_rows[1]
        codes = _codes(store, "audit-sf")
        assert "empty_reasoning" in codes["wrong-field"]
        assert "literal_think_text" in codes["typed-think"]
        assert "truncated" in codes["cut"]
        assert "think_close_missing" not in codes["good"]
        assert not [c for c in codes["good"] if c not in ("think_open_in_prompt", "parser_hidden_ids")]
        assert report.by_code["empty_reasoning"] == 1
        assert "audit-sf" in [r["run_id"] for r in store.runs()]
        good = store.load_sample(store.samples_page(SampleFilter(text="good"))[0].sample_id).capture
        assert good.endpoint == "imported"
        assert good.reasoning_field == "reasoning_content"


def test_speculators_rows_round_trip_and_bad_ids_are_found(tmp_path):
    with Store(tmp_path / "src.duckdb") as src:
        put(src, "conv-a", make_capture())
        put(src, "conv-b", make_capture(finish_reason="length", stop=False))
        out = tmp_path / "spec.jsonl"
        export(src, "speculators", out, select="all", tokenizer=kimi(), profile=profile())
    lines = out.read_text().splitlines()
    broken = json.loads(lines[0])
    broken["id"], broken["primary_id"] = "conv-x_gen0", "conv-x"
    close = broken["input_ids"].index(163607)
    broken["input_ids"][close : close + 1] = kimi().encode("</") + kimi().encode("think>")  # retokenized text
    broken["loss_mask"] = [0] * broken["loss_mask"].index(1) + [1] * (
        len(broken["input_ids"]) - broken["loss_mask"].index(1)
    )
    _write(out, lines + [json.dumps(broken)])
    with Store(tmp_path / "a.duckdb") as store:
        report = audit(store, out, tokenizer=kimi(), profile=profile(), name="spec")
        assert report.imported == 3
        assert not report.bad_rows
        codes = _codes(store, "audit-spec")
        assert "truncated" in codes["conv-b"]
        assert {"think_close_missing", "literal_think_text"} <= set(codes["conv-x"])
        sample = store.load_sample(store.samples_page(SampleFilter(text="conv-a"))[0].sample_id)
        assert sample.capture.output_ids == make_capture().output_ids


def test_audit_cli_report_and_errors(tmp_path):
    data = _write(
        tmp_path / "d.jsonl",
        [
            {
                "id": "x",
                "conversations": [{"from": "human", "value": "hello"}, {"from": "gpt", "value": "Hello world !"}],
            }
        ],
    )
    cmd = [
        sys.executable,
        "-c",
        "import sys; from tokview.cli import main; sys.exit(main())",
        "audit",
        str(data),
        "--db",
        str(tmp_path / "c.duckdb"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "audit audit-d: 1 rows, 1 imported" in done.stdout
    assert "empty_reasoning" in done.stdout
    missing = subprocess.run(cmd[:4] + [str(tmp_path / "none.jsonl")], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1
    assert "not found" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_one_out_of_range_id_is_a_bad_row_with_its_line_and_the_rest_goes_on(tmp_path):
    with Store(tmp_path / "src.duckdb") as src:
        put(src, "conv-a", make_capture())
        out = tmp_path / "spec.jsonl"
        export(src, "speculators", out, select="all", tokenizer=kimi(), profile=profile())
    good = json.loads(out.read_text().splitlines()[0])
    rows = []
    for i, bad in enumerate((-1, 2**31, 2**64)):
        row = json.loads(json.dumps(good))
        row["id"], row["primary_id"] = f"bad{i}_gen0", f"bad{i}"
        row["input_ids"][3] = bad
        rows.append(row)
    huge_idx = json.loads(json.dumps(good))
    huge_idx["primary_id"], huge_idx["metadata"]["idx"] = "huge-idx", 2**40  # fits no INTEGER column
    _write(out, rows + [huge_idx, good])
    with Store(tmp_path / "a.duckdb") as store:
        report = audit(store, out, tokenizer=kimi(), profile=profile(), name="ids")
        assert report.rows == 5
        assert report.imported == 1  # the good row after the bad ones still goes in
        assert [b.split(":")[0] for b in report.bad_rows] == ["line 1", "line 2", "line 3", "line 4"]
        assert "input_ids[3] = -1 is not a token id" in report.bad_rows[0]
        assert "input_ids[3] = 2147483648" in report.bad_rows[1]
        assert "18446744073709551616" in report.bad_rows[2]
        assert [r.prompt_id for r in store.samples_page(SampleFilter(run_id="audit-ids"))] == ["conv-a"]


def test_an_assistant_turn_that_is_not_text_is_a_bad_row_and_the_rest_goes_on(tmp_path):
    """A number, a bool or an object as the answer once stopped the whole audit with an AttributeError."""
    rows = [
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": 5}]},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": True}]},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": {"a": 1}}]},
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "ok", "reasoning_content": 3},
            ]
        },
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "fine"}]},
    ]
    data = tmp_path / "odd.jsonl"
    _write(data, rows)
    with Store(tmp_path / "a.duckdb") as store:
        report = audit(store, data, tokenizer=kimi(), profile=profile(), name="odd")
    assert report.rows == 5
    assert report.imported == 1
    assert [b.split(":")[0] for b in report.bad_rows] == ["line 1", "line 2", "line 3", "line 4"]
    assert "message 2 `value` must be a string or a list of text parts, not a number" in report.bad_rows[0]
    assert "message 2 `reasoning_content` must be a string, not a number" in report.bad_rows[3]


def test_a_line_of_a_dataset_that_is_not_utf8_is_a_bad_row_and_the_rest_is_audited(tmp_path):
    data = tmp_path / "latin.jsonl"
    good = {"id": "x", "conversations": [{"from": "human", "value": "hello"}, {"from": "gpt", "value": "yes"}]}
    bad = {"id": "y", "conversations": [{"from": "human", "value": "caf\u00e9"}, {"from": "gpt", "value": "yes"}]}
    data.write_bytes((json.dumps(good) + "\n" + json.dumps(bad, ensure_ascii=False) + "\n").encode("latin-1"))
    cmd = [
        sys.executable,
        "-c",
        "import sys; from tokview.cli import main; sys.exit(main())",
        "audit",
        str(data),
        "--db",
        str(tmp_path / "c.duckdb"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 4, done.stderr  # the line alone is refused, as `tokview batch` refuses it
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert f"{data}:2: not UTF-8 text (byte 0xe9 at column " in done.stderr, done.stderr
    assert "1 imported as samples" in done.stdout


def test_kimi_inline_rows_are_audited_as_structure_not_literal_text(tmp_path):
    served = make_capture()
    inline = {
        "id": "ki",
        "conversations": [
            {"role": "user", "content": "what is the answer"},
            {"role": "assistant", "content": "<think>Okay , let me think</think>The answer is forty - two"},
        ],
    }
    typed = {
        "id": "typed",
        "conversations": [
            {"role": "user", "content": "what is the answer"},
            {"role": "assistant", "content": "<think>hmm</think> yes", "reasoning_content": "Okay"},
        ],
    }
    with Store(tmp_path / "a.duckdb") as store:
        report = audit(store, _write(tmp_path / "ki.jsonl", [inline, typed]), tokenizer=kimi(), profile=profile())
        codes = _codes(store, "audit-ki")
        sample = store.load_sample(store.samples_page(SampleFilter(text="ki"))[0].sample_id).capture
    assert report.imported == 2
    assert "literal_think_text" not in codes["ki"]
    assert sample.output_ids == served.output_ids
    assert "literal_think_text" in codes["typed"]  # a reasoning field beside it: "<think>" in content was typed


def test_a_plain_models_rows_are_never_split_on_empty_think_delimiters(tmp_path):
    from plain_tokenizer import build_plain_tokenizer_dir

    from tokview.core.profiles import detect_profile
    from tokview.core.tokenizer import load_tokenizer
    from tokview.export.audit import split_inline

    tok = load_tokenizer(build_plain_tokenizer_dir(tmp_path / "plain-tok"))
    plain = detect_profile(tok)
    assert not plain.has_reasoning
    assert split_inline("hello there", plain) is None
    row = {"id": "p", "conversations": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    with Store(tmp_path / "a.duckdb") as store:
        report = audit(store, _write(tmp_path / "plain.jsonl", [row]), tokenizer=tok, profile=plain)
        sample = store.load_sample(store.samples_page(SampleFilter(text="p"))[0].sample_id).capture
    assert report.imported == 1
    assert sample.content == "hello"
    assert sample.reasoning is None


def test_audit_reads_a_parquet_dataset_like_its_jsonl(tmp_path):
    import duckdb

    with Store(tmp_path / "src.duckdb") as src:
        put(src, "p1", make_capture())
        put(src, "p2", make_capture(answer="two"))
        export(src, "speculators", tmp_path / "d.jsonl", select="all", tokenizer=kimi(), profile=profile())
    pq = tmp_path / "d.parquet"
    duckdb.connect().execute(
        f"COPY (SELECT * FROM read_json_auto('{tmp_path / 'd.jsonl'}')) TO '{pq}' (FORMAT parquet)"
    )
    with Store(tmp_path / "a.duckdb") as store:
        from_jsonl = audit(store, tmp_path / "d.jsonl", tokenizer=kimi(), profile=profile())
        from_parquet = audit(store, pq, tokenizer=kimi(), profile=profile(), name="d-parquet")  # another file
    assert from_jsonl.imported == from_parquet.imported == 2
    assert from_parquet.by_code == from_jsonl.by_code


def test_an_audit_never_replaces_another_files_samples_nor_keeps_a_review_of_ids_that_changed(tmp_path):
    """The run is named after the file's stem, so `p1/train.jsonl` and `p2/train.jsonl` went into one run, and the
    second audit replaced the first one's samples of the same row ids, keeping their approvals on ids nobody
    reviewed. Another file (or another tokenizer) into an existing run is refused; the same file audited again after
    an edit puts a reviewed row whose ids changed back to pending."""
    import pytest

    from tokview.errors import UserError

    row = {"id": "r1", "input_ids": [1, 2, 3, 163586], "loss_mask": [0, 0, 1, 1]}
    (tmp_path / "p1").mkdir()
    (tmp_path / "p2").mkdir()
    first = _write(tmp_path / "p1" / "train.jsonl", [row])
    second = _write(tmp_path / "p2" / "train.jsonl", [{**row, "input_ids": [9, 9, 9, 163586]}])
    with Store(tmp_path / "a.duckdb") as store:
        audit(store, first, tokenizer=kimi(), profile=profile())
        [sample] = store.samples_page(SampleFilter(run_id="audit-train"))
        store.record_verdict(sample.sample_id, "approved", override=True)
        with pytest.raises(UserError, match=r"run audit-train already holds an audit of .*p1/train.jsonl: name this"):
            audit(store, second, tokenizer=kimi(), profile=profile())
        assert store.load_sample(sample.sample_id).capture.prompt_ids == [1, 2]
        assert store.load_sample(sample.sample_id).status == "approved"
        report = audit(store, first, tokenizer=kimi(), profile=profile())  # the same file again: nothing changed
        assert (report.review_reset, store.load_sample(sample.sample_id).status) == (0, "approved")
        _write(first, [{**row, "input_ids": [1, 2, 4, 163586]}])  # edited since
        report = audit(store, first, tokenizer=kimi(), profile=profile())
        assert report.review_reset == 1 and "1 reviewed samples hold other ids now: pending again" in report.render()
        again = store.load_sample(sample.sample_id)
        assert (again.status, again.capture.output_ids) == ("pending", [4, 163586])
        assert audit(store, second, tokenizer=kimi(), profile=profile(), name="train-2").imported == 1


def test_a_row_that_supervises_several_spans_is_read_as_one_turn_per_span(tmp_path):
    """An agent trajectory's row supervises each answer and masks the turns between (tool results, user turns). Read
    as one answer from the first supervised id on, its masked turns were supervised on export and its answers
    analysed as one (false findings). Each span is now a turn whose prompt is every id before it."""
    first, second = make_capture(), make_capture(answer="two")
    im_end = len(first.prompt_ids) - 1 - first.prompt_ids[::-1].index(163586)  # the user turn's end
    between = kimi().encode("the tool said 42") + first.prompt_ids[im_end:]  # its end, then the generation prompt
    ids = [*first.prompt_ids, *first.output_ids, *between, *second.output_ids]
    mask = [0] * len(first.prompt_ids) + [1] * len(first.output_ids) + [0] * len(between) + [1] * len(second.output_ids)
    data = _write(tmp_path / "traj.jsonl", [{"id": "t", "input_ids": ids, "loss_mask": mask}])
    with Store(tmp_path / "a.duckdb") as store:
        report = audit(store, data, tokenizer=kimi(), profile=profile())
        assert (report.rows, report.imported, report.bad_rows) == (1, 2, [])
        rows = store.samples_page(SampleFilter(run_id="audit-traj"))
        turns = sorted((store.load_sample(r.sample_id) for r in rows), key=lambda s: s.capture.prompt_ids.__len__())
        assert [t.capture.output_ids for t in turns] == [first.output_ids, second.output_ids]
        assert turns[1].capture.prompt_ids == [*first.prompt_ids, *first.output_ids, *between]
        alone = audit(
            store,
            _write(
                tmp_path / "one.jsonl",
                [
                    {
                        "id": "o",
                        "input_ids": ids[: len(mask) - len(second.output_ids) - len(between)],
                        "loss_mask": mask[: len(mask) - len(second.output_ids) - len(between)],
                    }
                ],
            ),
            tokenizer=kimi(),
            profile=profile(),
        )
        assert [[f.code for f in t.findings] for t in turns] == [list(alone.by_code)] * 2  # as each answer alone
        out = tmp_path / "again.jsonl"
        export(store, "speculators", out, select="all", run="audit-traj", tokenizer=kimi(), profile=profile())
    supervised = sorted(
        tuple(i for i, m in zip(r["input_ids"], r["loss_mask"]) if m)
        for r in map(json.loads, out.read_text().splitlines())
    )
    assert supervised == sorted([tuple(first.output_ids), tuple(second.output_ids)])  # never the turn between


def test_a_pipe_is_audited_and_a_dataset_with_no_row_leaves_no_run(tmp_path):
    """`tokview audit <(zcat rows.jsonl.gz)` was refused as "dataset not found", and a dataset with no readable row
    left its run behind in the store, listed as if it held an audit."""
    import os
    import threading

    fifo = tmp_path / "rows.jsonl"
    os.mkfifo(fifo)
    row = json.dumps({"id": "b", "input_ids": [1, 2, 163586], "loss_mask": [0, 1, 1]}) + "\n"
    writer = threading.Thread(target=lambda: fifo.write_text(row))
    import pytest

    from tokview.errors import UserError

    with Store(tmp_path / "a.duckdb") as store:
        with pytest.raises(UserError, match="is a pipe or a device: name its audit with --name"):
            audit(store, fifo, tokenizer=kimi(), profile=profile())  # /dev/fd/63 every time: no name of its own
        writer.start()
        assert audit(store, fifo, tokenizer=kimi(), profile=profile(), name="rows").imported == 1
        writer.join()
        with pytest.raises(UserError, match="run audit-rows already holds an audit of"):  # another pipe, one name
            audit(store, fifo, tokenizer=kimi(), profile=profile(), name="rows")
        empty = _write(tmp_path / "empty.jsonl", [])
        assert audit(store, empty, tokenizer=kimi(), profile=profile()).imported == 0
        assert [r["run_id"] for r in store.runs()] == ["audit-rows"]


def test_the_same_file_named_otherwise_is_the_same_audit(tmp_path):
    import os

    (tmp_path / "d").mkdir()
    data = _write(tmp_path / "d" / "rows.jsonl", [{"id": "b", "input_ids": [1, 2, 163586], "loss_mask": [0, 1, 1]}])
    os.symlink(tmp_path / "d", tmp_path / "link")
    with Store(tmp_path / "a.duckdb") as store:
        assert audit(store, data, tokenizer=kimi(), profile=profile()).imported == 1
        again = tmp_path / "link" / ".." / "d" / "rows.jsonl"
        assert audit(store, tmp_path / "link" / "rows.jsonl", tokenizer=kimi(), profile=profile()).imported == 1
        assert audit(store, again, tokenizer=kimi(), profile=profile()).imported == 1


def test_masked_ids_after_the_last_supervised_span_are_no_answers_ids_and_never_supervised_on_export(tmp_path):
    """A template's newline after `<|im_end|>` (or padding) is masked after a row's last supervised span. It was kept
    as the end of the last answer, so an export of the audit supervised it, and findings saw ids after the stop."""
    capture = make_capture()
    tail = [*kimi().encode("\n"), 0, 0]
    ids = [*capture.prompt_ids, *capture.output_ids, *tail]
    mask = [0] * len(capture.prompt_ids) + [1] * len(capture.output_ids) + [0] * len(tail)
    clean = {"id": "clean", "input_ids": ids[: -len(tail)], "loss_mask": mask[: -len(tail)]}
    data = _write(tmp_path / "tail.jsonl", [{"id": "tail", "input_ids": ids, "loss_mask": mask}, clean])
    with Store(tmp_path / "a.duckdb") as store:
        report = audit(store, data, tokenizer=kimi(), profile=profile())
        assert (report.imported, report.masked_tails, report.bad_rows) == (2, 1, [])
        assert "1 rows mask ids after their last supervised id: left out" in report.render()
        codes = _codes(store, "audit-tail")
        assert codes["tail"] == codes["clean"]  # no finding about ids after the stop
        tailed = store.load_sample(store.samples_page(SampleFilter(text="tail"))[0].sample_id)
        assert tailed.capture.output_ids == capture.output_ids
        out = tmp_path / "again.jsonl"
        export(store, "speculators", out, select="all", run="audit-tail", tokenizer=kimi(), profile=profile())
    for row in map(json.loads, out.read_text().splitlines()):
        assert [i for i, m in zip(row["input_ids"], row["loss_mask"]) if m] == capture.output_ids


def test_a_truncated_answer_is_found_wherever_tokviews_own_exports_say_it(tmp_path):
    """Audit read a finish reason only from `metadata.finish_reason`: the Parquet export's `finish_reason` column and
    a trajectory row's `metadata.turns[k].finish_reason` were not read, so their truncated answers were audited as
    whole."""
    cut = make_capture(finish_reason="length", stop=False)
    with Store(tmp_path / "src.duckdb") as src:
        put(src, "cut", cut)
        export(src, "parquet", tmp_path / "d.parquet", select="all", tokenizer=kimi(), profile=profile())
    whole = make_capture(answer="two")
    ids = [*cut.prompt_ids, *cut.output_ids, *whole.output_ids]
    start = len(cut.prompt_ids)
    mask = [0] * start + [1] * len(cut.output_ids) + [0] + [1] * (len(whole.output_ids) - 1)
    turns = [
        {"turn": 0, "output_span": [start, start + len(cut.output_ids)], "finish_reason": "length"},
        {"turn": 1, "output_span": [start + len(cut.output_ids) + 1, len(ids)], "finish_reason": "stop"},
    ]
    row = {"id": "t", "input_ids": ids, "loss_mask": mask, "metadata": {"turns": turns}}
    trajectory = _write(tmp_path / "traj.jsonl", [row])
    with Store(tmp_path / "a.duckdb") as store:
        parquet = audit(store, tmp_path / "d.parquet", tokenizer=kimi(), profile=profile())
        assert parquet.by_code.get("truncated") == 1
        audit(store, trajectory, tokenizer=kimi(), profile=profile())
        rows = store.samples_page(SampleFilter(run_id="audit-traj"))
        by_len = sorted((store.load_sample(r.sample_id) for r in rows), key=lambda s: len(s.capture.prompt_ids))
        assert [s.capture.finish_reason for s in by_len] == ["length", "stop"]
        assert "truncated" in [f.code for f in by_len[0].findings]
        assert "truncated" not in [f.code for f in by_len[1].findings]


def test_a_tool_loops_history_reasoning_reaches_the_template_as_the_server_and_trainers_render_it(
    tmp_path, qwen_tok, qwen_tok_dir
):
    """Qwen3's template keeps the reasoning of the assistant turns inside the running tool loop; the audit took it
    out of every history turn, so a tool loop's later turn was audited on prompt ids no server served."""
    from tokview.core.profiles import get_profile

    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
    history = [
        {"role": "user", "content": "add one and two"},
        {"role": "assistant", "content": "", "reasoning_content": "I should call the adder", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
    ]
    row = {
        "id": "loop",
        "tools": tools,
        "conversations": [*history, {"role": "assistant", "content": "It is 3.", "reasoning_content": "done"}],
    }
    qwen3 = get_profile("qwen3")
    with Store(tmp_path / "a.duckdb") as store:
        audit(store, _write(tmp_path / "loop.jsonl", [row]), tokenizer=qwen_tok, profile=qwen3)
        (only,) = store.samples_page(SampleFilter(run_id="audit-loop"))
        prompt = store.load_sample(only.sample_id).capture.prompt_ids
    kwargs = {**qwen3.template_kwargs(True), "tools": tools}
    assert prompt == qwen_tok.render(history, template_kwargs=kwargs)
    assert "I should call the adder" in qwen_tok.decode(prompt)


def test_ids_outside_the_tokenizer_ask_whether_it_is_the_datasets(tmp_path, qwen_tok):
    """A Kimi dataset audited with Qwen3's tokenizer (or the other way round, the default Kimi layout on a Qwen3 export)
    flagged every row, and the report said nothing of why."""
    with Store(tmp_path / "src.duckdb") as src:
        put(src, "p1", make_capture())
        export(src, "speculators", tmp_path / "d.jsonl", select="all", tokenizer=kimi(), profile=profile())
    with Store(tmp_path / "a.duckdb") as store:
        wrong = audit(store, tmp_path / "d.jsonl", tokenizer=qwen_tok, profile=profile(), name="wrong")
        right = audit(store, tmp_path / "d.jsonl", tokenizer=kimi(), profile=profile(), name="right")
    assert wrong.by_code["unknown_token_id"] == 1
    assert "is --tokenizer the dataset's model's?" in wrong.render()
    assert "is --tokenizer" not in right.render()


def test_a_conversation_past_the_prompt_size_limit_is_a_bad_row_not_gigabytes(tmp_path, monkeypatch):
    """A 60 MB line took 12.8 GB and two minutes (batch refuses such a prompt as `prompt_too_large`)."""
    monkeypatch.setenv("TOKVIEW_MAX_PROMPT_MB", "1")
    big = "x" * (1 << 20) + "y"
    wide = "世" * 400_000  # 1.2 MB of UTF-8 in 400,000 characters: counted as batch counts it
    rows = [
        {"messages": [{"role": "user", "content": big}, {"role": "assistant", "content": "ok"}]},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "fine"}]},
        {"messages": [{"role": "user", "content": wide}, {"role": "assistant", "content": "ok"}]},
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "ok", "reasoning_content": big},
            ]
        },
    ]
    data = tmp_path / "big.jsonl"
    _write(data, rows)
    with Store(tmp_path / "a.duckdb") as store:
        report = audit(store, data, tokenizer=kimi(), profile=profile(), name="big")
    assert (report.rows, report.imported) == (4, 1)
    assert [b.split(":")[0] for b in report.bad_rows] == ["line 1", "line 3", "line 4"]
    assert report.bad_rows[0].startswith("line 1: its text holds 1.0 MiB, past the 1 MiB a prompt may hold")
    monkeypatch.setenv("TOKVIEW_MAX_PROMPT_MB", "64MB")  # refused once, before any row: not a bad row each
    with Store(tmp_path / "b.duckdb") as store, pytest.raises(TokviewError, match="TOKVIEW_MAX_PROMPT_MB"):
        audit(store, data, tokenizer=kimi(), profile=profile(), name="big")


def test_a_mask_over_the_prompt_or_a_second_stop_and_a_text_of_other_ids_are_said(tmp_path):
    """Rows of another pipeline whose loss mask supervises the user turn too (all 1s), or a second `<|im_end|>` after
    the answer's, were audited clean: the output held the prompt's stop and more after it. A `text` that is not the
    row's ids decoded was never read, though SpecForge's is_preformatted path trains on it."""
    capture = make_capture()
    ids = [*capture.prompt_ids, *capture.output_ids]
    n = len(capture.prompt_ids)
    good = {"id": "good", "input_ids": ids, "loss_mask": [0] * n + [1] * len(capture.output_ids)}
    good["text"] = kimi().decode(ids, skip_special_tokens=False)
    rows = [
        good,
        {"id": "all", "input_ids": ids, "loss_mask": [1] * len(ids)},
        {"id": "twice", "input_ids": [*ids, 163586], "loss_mask": good["loss_mask"] + [1]},
        {**good, "id": "text", "text": good["text"].replace("forty", "fifty")},
    ]
    data = _write(tmp_path / "masks.jsonl", rows)
    with Store(tmp_path / "a.duckdb") as store:
        report = audit(store, data, tokenizer=kimi(), profile=profile())
        codes = _codes(store, "audit-masks")
    assert "output_past_stop" not in codes["good"] + codes["text"]
    assert "output_past_stop" in codes["all"] and "output_past_stop" in codes["twice"]
    assert report.invalid == 2 and report.text_differs == [4]
    assert "1 rows hold a `text` that is not their input_ids decoded (line 4)" in report.render()


def test_reasoning_audited_with_thinking_off_is_said_not_blamed_on_a_servers_parser(tmp_path):
    """`--no-thinking` on rows that carry reasoning: the reasoning was in no id, and `parser_split_mismatch` said
    "the server split reasoning/content" of a dataset no server made."""
    rows = [
        {
            "id": "reasons",
            "conversations": [
                {"role": "user", "content": "what is the answer"},
                {
                    "role": "assistant",
                    "content": "The answer is forty - two",
                    "reasoning_content": "Okay , let me think",
                },
            ],
        },
        {
            "id": "plain",
            "conversations": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"}],
        },
    ]
    with Store(tmp_path / "a.duckdb") as store:
        report = audit(store, _write(tmp_path / "off.jsonl", rows), tokenizer=kimi(), profile=profile(), thinking=False)
        codes = _codes(store, "audit-off")
    assert report.reasoning_dropped == [1]
    assert "1 rows carry reasoning, audited with thinking off: no ids hold it (line 1)" in report.render()
    assert "parser_split_mismatch" not in codes["reasons"], codes


def test_the_turns_tokviews_own_exports_name_are_the_audited_samples_turns(tmp_path):
    """Audit numbered a speculators or Parquet row's turn by nothing (its `metadata.turn`, its `turn` column unread)
    and a trajectory row's answers from 0, so a row split at a break named its turn 4 `#turn0`, and `tokview show`
    of an exported row id found nothing in the audited store."""
    with Store(tmp_path / "src.duckdb") as src:
        for t in (0, 3):
            put(src, "chat", make_capture(question=f"turn {t}"), turn=t)
        export(src, "speculators", tmp_path / "s.jsonl", select="all", tokenizer=kimi(), profile=profile())
        export(src, "parquet", tmp_path / "d.parquet", select="all", tokenizer=kimi(), profile=profile())
    first, second = make_capture(), make_capture(answer="two")
    ids = [*first.prompt_ids, *first.output_ids, *second.output_ids]
    start, middle = len(first.prompt_ids), len(first.prompt_ids) + len(first.output_ids)
    mask = [0] * start + [1] * len(first.output_ids) + [0] + [1] * (len(second.output_ids) - 1)
    turns = [{"turn": 4, "output_span": [start, middle]}, {"turn": 5, "output_span": [middle + 1, len(ids)]}]
    row = {"id": "chat_gen0_from_turn4", "primary_id": "chat", "input_ids": ids, "loss_mask": mask}
    trajectory = _write(tmp_path / "traj.jsonl", [{**row, "metadata": {"turns": turns}}])
    with Store(tmp_path / "a.duckdb") as store:
        for data, name in ((tmp_path / "s.jsonl", "s"), (tmp_path / "d.parquet", "d"), (trajectory, "traj")):
            audit(store, data, tokenizer=kimi(), profile=profile())
            rows = store.samples_page(SampleFilter(run_id=f"audit-{name}"))
            want = [4, 5] if name == "traj" else [0, 3]
            assert sorted(store.load_sample(r.sample_id).turn for r in rows) == want, name
    from tokview.cli import main

    assert main(["show", "--db", str(tmp_path / "a.duckdb"), "chat#turn5_gen0", "--json"]) == 0


def test_a_re_audit_says_what_an_earlier_audit_stored_that_it_did_not(tmp_path):
    """Rows the file no longer has (or rows a newer tokview names otherwise: a turn its own exports name) stayed in
    the run beside the new samples, and the report said nothing of them."""
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": "ok"}]} for q in "abc"]
    data = _write(tmp_path / "d.jsonl", rows)
    with Store(tmp_path / "a.duckdb") as store:
        assert audit(store, data, tokenizer=kimi(), profile=profile()).stale == 0
        _write(tmp_path / "d.jsonl", rows[:2])
        again = audit(store, data, tokenizer=kimi(), profile=profile())
    assert again.stale == 1
    assert "note: 1 samples of an earlier audit of this file were not audited again" in again.render()
