"""`--select all` exports every stored sample, those no default selection takes among them: the summary and the
manifest say how many have error findings, were cut by max tokens or were rejected, and name the refused rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokview.cli import main
from tokview.store import Store


def test_a_select_all_export_says_what_it_holds_that_no_default_selection_would(
    tmp_path: Path, make_capture: Any, put: Any, capsys: Any
) -> None:
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        put(store, "whole", make_capture("q1", answer="fine"))
        cut_capture = make_capture("q2", answer="cut short", finish_reason="length")
        cut_capture.output_ids = cut_capture.output_ids[:-1]  # no stop id: cut mid-turn
        cut = put(store, "cut", cut_capture)
        rejected = put(store, "rejected", make_capture("q3", answer="meh"))
        store.record_verdict(rejected, "rejected", reason="duplicate")
        empty = make_capture("q4", answer="x")
        empty.output_ids = []
        refused = put(store, "empty", empty)
    out = tmp_path / "all.jsonl"
    assert main(["export", "--db", str(db), "--format", "speculators", "--select", "all", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "WARNING: of the exported rows, 1 was cut by max tokens, 1 was rejected by a reviewer" in err, err
    assert f"refused, first of each: no_supervised_tokens: {refused}" in err, err
    counts = json.loads((tmp_path / "all.manifest.json").read_text())["counts"]
    assert counts["unfit"] == {"cut_by_max_tokens": 1, "rejected": 1}  # the cut one counted once
    assert counts["refused_examples"] == {"no_supervised_tokens": [refused]}
    assert cut != rejected
    assert main(["export", "--db", str(db), "--format", "speculators", "--out", str(tmp_path / "valid.jsonl")]) == 0
    err = capsys.readouterr().err
    assert "WARNING" not in err  # the default selection holds none of them
