"""`tokview stats` and `tokview export` on the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tokview.store import Store

from test_store_fixtures import make_capture, put

ROOT = Path(__file__).resolve().parents[1]
TOKVIEW = [sys.executable, "-c", "import sys; from tokview.cli import main; sys.exit(main())"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*TOKVIEW, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def _db(tmp_path: Path) -> Path:
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        a = put(store, "p1", make_capture())
        put(store, "p2", make_capture(finish_reason="length", stop=False))
        put(store, "p3", make_capture(answer="yes"))
        store.record_verdict(a, "approved")
        store.put_failure("p4", None, "run1", "HTTP 503 after 3 retries")
    return db


def test_stats_text_and_json(tmp_path):
    db = _db(tmp_path)
    text = _cli("stats", "--db", str(db))
    assert text.returncode == 0, text.stderr
    assert "samples   3  (pending 2, approved 1, rejected 0)" in text.stdout
    assert "HTTP 503 after 3 retries" in text.stdout and "truncated [error]" in text.stdout
    js = json.loads(_cli("stats", "--db", str(db), "--json").stdout)
    assert js["prompts"] == 3 and js["invalid"] == 1 and js["failures"]["total"] == 1
    assert js["output_len"]["max"] >= js["output_len"]["p50"]
    missing = _cli("stats", "--db", str(tmp_path / "none.duckdb"))
    assert missing.returncode == 1 and "not found" in missing.stderr


def test_export_cli_selects_and_writes_sidecars(tmp_path):
    db = _db(tmp_path)
    out = tmp_path / "out" / "train.jsonl"
    done = _cli("export", "--db", str(db), "--out", str(out), "--select", "approved")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert len(out.read_text().splitlines()) == 1
    manifest = json.loads((out.parent / "train.manifest.json").read_text())
    assert manifest["counts"]["exported"] == 1 and manifest["select"] == "approved"
    assert json.loads((out.parent / "train.token_freq.json").read_text())
    valid = _cli("export", "--db", str(db), "--out", str(tmp_path / "v.parquet"), "--format", "parquet")
    assert valid.returncode == 0 and "exported 2 of 2" in valid.stderr
    none = _cli("export", "--db", str(db), "--out", str(tmp_path / "n.jsonl"), "--run", "nope")
    assert none.returncode == 1 and "no samples match" in none.stderr and "Traceback" not in none.stderr
