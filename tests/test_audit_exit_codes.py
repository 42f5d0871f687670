"""`tokview audit` exits as `tokview batch` does when rows are unreadable: 4 (finished, but the data set
is not the whole file), with each skipped row named `FILE:LINE: why` on stderr, not 0."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKVIEW = [sys.executable, "-c", "import sys; from tokview.cli import main; sys.exit(main())"]
GOOD = {"id": "x", "conversations": [{"from": "human", "value": "hello"}, {"from": "gpt", "value": "Hello world !"}]}


def _audit(data: Path, db: Path, *more: str) -> subprocess.CompletedProcess:
    argv = [*TOKVIEW, "audit", str(data), "--db", str(db), *more]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_unreadable_rows_exit_4_and_are_listed(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(
        json.dumps(GOOD) + "\nnot json\n" + json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n"
    )
    done = _audit(data, tmp_path / "a.duckdb")
    assert done.returncode == 4, done.stderr
    assert "1 imported" in done.stdout
    assert "2 unreadable" in done.stdout
    prefix = "tokview: bad row skipped: "
    skipped = [line.removeprefix(prefix) for line in done.stderr.splitlines() if line.startswith(prefix)]
    assert len(skipped) == 2
    assert skipped[0].startswith(f"{data}:2: ")
    assert skipped[1].startswith(f"{data}:3: ")
    assert "no assistant turn" in skipped[1]
    assert "Traceback" not in done.stderr
    js = _audit(data, tmp_path / "b.duckdb", "--json")
    assert js.returncode == 4
    assert len(json.loads(js.stdout)["bad_rows"]) == 2


def test_a_clean_audit_exits_0(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(GOOD) + "\n")
    done = _audit(data, tmp_path / "a.duckdb")
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr


def test_a_file_whose_every_row_is_unreadable_names_each_row_before_its_error(tmp_path):
    """Every row bad: the audit said only "no row … could be read as a sample", and not why (a mixed file listed
    each bad row's `FILE:LINE: why`)."""
    data = tmp_path / "d.jsonl"
    data.write_text("not json\n" + json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    done = _audit(data, tmp_path / "a.duckdb")
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith(f"tokview: bad row skipped: {data}:1: ")
    assert lines[1].startswith(f"tokview: bad row skipped: {data}:2: ") and "no assistant turn" in lines[1]
    assert lines[-1] == f"tokview: error: no row of {data} could be read as a sample"


def test_a_bad_rows_terminal_escapes_are_printed_escaped(tmp_path):
    """A dataset's value quoted in a bad-row line ran its terminal escapes (a window title, a screen clear)."""
    data = tmp_path / "esc.jsonl"
    bad = {"id": "a", "input_ids": [1, "x\x1b]0;PWNED\x07\x1b[2J", 3], "loss_mask": [0, 1, 1]}
    good = {"id": "b", "input_ids": [1, 2, 163586], "loss_mask": [0, 1, 1]}
    data.write_text(json.dumps(bad) + "\n" + json.dumps(good) + "\n")
    done = _audit(data, tmp_path / "e.duckdb")
    assert done.returncode == 4, done.stderr
    assert "\x1b" not in done.stderr and "\x07" not in done.stderr
    assert 'input_ids[1] = "x\\u001b]0;PWNED\\u0007\\u001b[2J" is not a token id' in done.stderr, done.stderr
