"""`tokview demo --no-ui`: simulators on loopback, three runs through run_batch, a summary with findings."""

from __future__ import annotations

from tokview.cli import main
from tokview.store import Store


def test_demo_headless_fills_a_store_with_findings(tmp_path, capsys):
    db = tmp_path / "demo.duckdb"
    assert main(["demo", "--no-ui", "--db", str(db), "--limit", "3"]) == 0
    out = capsys.readouterr().out
    assert "demo-chat" in out and "demo-old-vllm" in out and "demo-truncated" in out
    with Store(db) as store:
        stats = store.stats()
        assert stats["samples"] == 9
        assert {"parser_hidden_ids", "parser_split_mismatch", "truncated"} <= set(stats["findings"])
        assert stats["truncated"] == 3 and stats["invalid"] >= 3
    assert "parser_split_mismatch" in out


def test_demo_refuses_a_bad_limit(capsys):
    assert main(["demo", "--no-ui", "--limit", "0"]) == 1
    assert "--limit" in capsys.readouterr().err
