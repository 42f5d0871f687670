"""`tokview audit`: datasets made by other pipelines, read back into the store and checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tokview.export import export
from tokview.export.audit import audit, encode_literal
from tokview.store import SampleFilter, Store

from test_store_fixtures import kimi, make_capture, profile, put

ROOT = Path(__file__).resolve().parents[1]


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _codes(store: Store, run_id: str) -> dict[str, list[str]]:
    return {r.prompt_id: r.codes for r in store.samples_page(SampleFilter(run_id=run_id), limit=1000)}


def test_encode_literal_keeps_typed_markers_literal():
    ids = encode_literal(kimi(), "a <think> b")
    assert 163606 not in ids and kimi().decode(ids) == "a <think> b"


def test_specforge_rows(tmp_path):
    rows = [
        {"id": "good", "conversations": [{"role": "user", "content": "what is the answer"},
                                         {"role": "assistant", "content": "The answer is forty - two",
                                          "reasoning_content": "Okay , let me think"}], "status": "success"},
        # reasoning read from the wrong field by the pipeline: the row carries none → empty reasoning
        {"id": "wrong-field", "conversations": [{"role": "user", "content": "hello"},
                                                {"role": "assistant", "content": "Hello world !"}]},
        {"id": "typed-think", "conversations": [{"role": "user", "content": "hello"},
                                                {"role": "assistant", "content": "<think>hmm</think> yes",
                                                 "reasoning": "Okay"}]},
        {"id": "cut", "truncated": True, "messages": [{"role": "user", "content": "why"},
                                                      {"role": "assistant", "content": "because",
                                                       "thinking": "Okay"}]},
        "not json",
        {"id": "no-assistant", "messages": [{"role": "user", "content": "hi"}]},
    ]
    with Store(tmp_path / "a.duckdb") as store:
        report = audit(store, _write(tmp_path / "sf.jsonl", rows), tokenizer=kimi(), profile=profile())
        assert (report.rows, report.imported, len(report.bad_rows)) == (6, 4, 2)
        assert report.bad_rows[0].startswith("line 5") and "line 6" in report.bad_rows[1]
        codes = _codes(store, "audit-sf")
        assert "empty_reasoning" in codes["wrong-field"]
        assert "literal_think_text" in codes["typed-think"]
        assert "truncated" in codes["cut"] and "think_close_missing" not in codes["good"]
        assert not [c for c in codes["good"] if c not in ("think_open_in_prompt", "parser_hidden_ids")]
        assert report.by_code["empty_reasoning"] == 1 and "audit-sf" in [r["run_id"] for r in store.runs()]
        good = store.load_sample(store.samples_page(SampleFilter(text="good"))[0].sample_id).capture
        assert good.endpoint == "imported" and good.reasoning_field == "reasoning_content"


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
    broken["input_ids"][close:close + 1] = kimi().encode("</") + kimi().encode("think>")  # retokenized text
    broken["loss_mask"] = [0] * broken["loss_mask"].index(1) + [1] * (len(broken["input_ids"]) -
                                                                       broken["loss_mask"].index(1))
    _write(out, lines + [json.dumps(broken)])
    with Store(tmp_path / "a.duckdb") as store:
        report = audit(store, out, tokenizer=kimi(), profile=profile(), name="spec")
        assert report.imported == 3 and not report.bad_rows
        codes = _codes(store, "audit-spec")
        assert "truncated" in codes["conv-b"]
        assert {"think_close_missing", "literal_think_text"} <= set(codes["conv-x"])
        sample = store.load_sample(store.samples_page(SampleFilter(text="conv-a"))[0].sample_id)
        assert sample.capture.output_ids == make_capture().output_ids


def test_audit_cli_report_and_errors(tmp_path):
    data = _write(tmp_path / "d.jsonl", [{"id": "x", "conversations": [
        {"from": "human", "value": "hello"}, {"from": "gpt", "value": "Hello world !"}]}])
    cmd = [sys.executable, "-c", "import sys; from tokview.cli import main; sys.exit(main())", "audit", str(data),
           "--db", str(tmp_path / "c.duckdb")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "audit audit-d: 1 rows, 1 imported" in done.stdout and "empty_reasoning" in done.stdout
    missing = subprocess.run(cmd[:4] + [str(tmp_path / "none.jsonl")], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "not found" in missing.stderr and "Traceback" not in missing.stderr
