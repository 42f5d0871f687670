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
    assert out.splitlines()[-1] == f"  open it: tokview ui --db {db}"  # how to look at what was made


def test_demo_headless_without_db_says_the_store_is_temporary(capsys):
    assert main(["demo", "--no-ui", "--limit", "1"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert "temporary store, removed on exit" in last and "tokview ui --db demo.duckdb" in last


def test_demo_refuses_a_bad_limit(capsys):
    assert main(["demo", "--no-ui", "--limit", "0"]) == 1
    assert "--limit" in capsys.readouterr().err
