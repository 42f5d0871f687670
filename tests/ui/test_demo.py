"""`tokview demo --no-ui`: simulators on loopback, three runs through run_batch, a summary with findings."""

from __future__ import annotations

from pathlib import Path

from tokview.cli import main
from tokview.store import Store


def test_demo_headless_fills_a_store_with_findings(tmp_path, capsys):
    db = tmp_path / "demo.duckdb"
    assert main(["demo", "--no-ui", "--db", str(db), "--limit", "3"]) == 0
    out = capsys.readouterr().out
    assert "demo-chat" in out
    assert "demo-old-vllm" in out
    assert "demo-truncated" in out
    with Store(db) as store:
        stats = store.stats()
        assert stats["samples"] == 9
        assert {"parser_hidden_ids", "parser_split_mismatch", "truncated"} <= set(stats["findings"])
        assert stats["truncated"] == 3
        assert stats["invalid"] >= 3
    assert "parser_split_mismatch" in out
    assert out.splitlines()[-1] == f"  open it: tokview ui --db {db}"  # how to look at what was made


def test_demo_headless_without_db_says_the_store_is_temporary(capsys):
    assert main(["demo", "--no-ui", "--limit", "1"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert "temporary store, removed on exit" in last
    assert "tokview ui --db demo.duckdb" in last


def test_demo_refuses_a_bad_limit(capsys):
    assert main(["demo", "--no-ui", "--limit", "0"]) == 1
    assert "--limit" in capsys.readouterr().err


def test_demo_with_the_app_shows_progress_then_current_counts_and_says_the_store_is_gone(
    capsys, monkeypatch, tokenizer, profile
):
    """The app itself is replaced by a stand-in that does what a user would: generate one more sample."""
    from tokview.core.analysis import analyze
    from tokview.ui import examples
    from tokview.ui.app import TokviewApp

    seen = {}

    def stand_in(self) -> None:
        store = self.session.store
        seen["path"], seen["who"] = Path(store.path), self.session.who
        seen["before"] = store.stats()["samples"]
        capture = examples.short_capture()
        store.put_sample("extra@demo", "extra", "demo-chat", capture, analyze(capture, profile, tokenizer))

    monkeypatch.setattr(TokviewApp, "run", stand_in)
    monkeypatch.setattr("tokview.commands.ui.has_terminal", lambda: True)  # pytest's stdin is none
    monkeypatch.setenv("USER", "dana")
    assert main(["demo", "--limit", "2"]) == 0
    captured = capsys.readouterr()
    assert "temporary store (removed when you quit" in captured.err
    assert "run 1/3" in captured.err
    assert "run 3/3" in captured.err
    assert "2/2" in captured.err
    assert f"  {seen['before'] + 1} samples" in captured.out  # counted after the app, not before it
    assert "the temporary store is removed now" in captured.out.splitlines()[-1]
    assert not seen["path"].exists()
    assert seen["who"] == "dana"
    assert str(seen["path"]) not in captured.out  # no path to a store that is gone


def test_demo_on_agent_traces_says_the_raw_run_skipped_them_as_bad_rows(capsys):
    """The raw run sends no tools, so every agent-trace row is a bad row for it: it read "ok 0 failed 0", exit 0."""
    traces = Path(__file__).resolve().parents[2] / "sample_data" / "agent_traces.jsonl"
    assert main(["demo", "--no-ui", "--prompts", str(traces), "--limit", "2"]) == 0
    [raw] = [line for line in capsys.readouterr().out.splitlines() if "demo-truncated" in line]
    assert "bad rows 2 (first: row 1: an agent trace needs --mode chat" in raw, raw


def test_without_a_terminal_the_demo_fills_its_store_headless_and_the_app_refuses_in_one_line(capsys, tmp_path):
    """cron, CI, a script's redirect: the app waited forever for keys, writing its escapes into the log."""
    assert main(["demo", "--limit", "1", "--db", str(tmp_path / "d.duckdb")]) == 0
    captured = capsys.readouterr()
    assert "no terminal for the app: filling the store headless (as --no-ui)" in captured.err
    assert main(["ui", "--db", str(tmp_path / "d.duckdb")]) == 1
    assert "the app needs a terminal" in capsys.readouterr().err


def test_no_usable_temporary_folder_is_one_line(capsys, monkeypatch):
    import tempfile

    def none_usable(*args, **kwargs):
        raise FileNotFoundError(2, "No usable temporary directory found in ['/tmp', '/var/tmp']")

    monkeypatch.setattr(tempfile, "TemporaryDirectory", none_usable)
    assert main(["demo", "--no-ui", "--limit", "1"]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert "pass --db PATH" in line


def test_demo_on_a_prompts_file_exits_as_batch_would(tmp_path, capsys):
    """Bad rows are named `FILE:LINE` and exit 4; a file whose every request fails (past the simulated server's
    context) exits 3. The demo exited 0 naming none of them."""
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"id": "a", "prompt": "hi"}\n{"id": "b", "prompt": 7}\n')
    assert main(["demo", "--no-ui", "--prompts", str(mixed), "--db", str(tmp_path / "m.duckdb")]) == 4
    assert f"bad row skipped: {mixed}:2" in capsys.readouterr().err
    huge = tmp_path / "huge.jsonl"
    huge.write_text('{"id": "big", "prompt": "' + "x " * 40_000 + '"}\n')  # past the simulator's 32,768 ids
    assert main(["demo", "--no-ui", "--prompts", str(huge), "--db", str(tmp_path / "h.duckdb")]) == 3


def test_demo_refuses_a_store_holding_other_runs_and_runs_again_on_its_own(tmp_path, capsys, monkeypatch):
    """It wrote 36 simulator samples into a team's store without a word; an `--select valid` export then took 24 of
    them as the team's. A store of the demo's own runs takes a second demo."""
    from tokview.store import Store

    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    data = tmp_path / "d.jsonl"
    data.write_text('{"id": "a", "input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}\n')
    theirs = tmp_path / "theirs.duckdb"
    assert main(["audit", str(data), "--db", str(theirs)]) == 0
    with Store(theirs) as store:
        before = store.run_ids()
    capsys.readouterr()
    assert main(["demo", "--no-ui", "--db", str(theirs), "--limit", "1"]) == 1
    err = capsys.readouterr().err
    assert f"--db {theirs} holds runs that are not the demo's ({before[0]})" in err and err.count("\n") == 1
    with Store(theirs) as store:
        assert store.run_ids() == before
    mine = tmp_path / "demo.duckdb"
    assert main(["demo", "--no-ui", "--db", str(mine), "--limit", "1"]) == 0
    assert main(["demo", "--no-ui", "--db", str(mine), "--limit", "1"]) == 0
