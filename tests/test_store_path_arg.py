"""Every command that reads a store names a folder or a missing file for what it is, in one line."""

from __future__ import annotations

import pytest

from tokview.cli import main
from tokview.errors import ExitCode


@pytest.mark.parametrize(
    "argv",
    [
        ["stats", "--db", "{db}"],
        ["show", "x", "--db", "{db}"],
        ["score", "--db", "{db}", "--server", "http://127.0.0.1:9"],
        ["export", "--db", "{db}", "--out", "{out}"],
    ],
    ids=["stats", "show", "score", "export"],
)
def test_a_folder_given_as_a_store_is_named_a_directory(argv, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    folder = tmp_path / "runs"
    folder.mkdir()
    args = [a.format(db=folder, out=tmp_path / "o.jsonl") for a in argv]
    assert main(args) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err == f"tokview: error: --db {folder} is a directory, not a store: name its .duckdb file\n"


@pytest.mark.parametrize("command", ["stats", "export"])
def test_a_missing_store_is_named_with_the_flag_to_pass(command, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    missing = tmp_path / "missing.duckdb"
    argv = [command, "--db", str(missing)] + (["--out", str(tmp_path / "o.jsonl")] if command == "export" else [])
    assert main(argv) == ExitCode.USAGE
    assert capsys.readouterr().err == f"tokview: error: database not found: {missing} (pass --db PATH)\n"


def test_review_is_a_command_and_names_a_missing_store(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    missing = tmp_path / "missing.duckdb"
    assert main(["review", "--db", str(missing), "--approve"]) == ExitCode.USAGE
    assert capsys.readouterr().err == f"tokview: error: database not found: {missing} (pass --db PATH)\n"


def test_stats_reads_a_store_holding_a_failure_without_a_reason(tmp_path, capsys, monkeypatch):
    """An older store may hold a failure whose reason is NULL (parts once landed them so): stats counts it."""
    import duckdb

    from tokview.store import Store

    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    db = tmp_path / "old.duckdb"
    with Store(db):
        pass
    with duckdb.connect(str(db)) as conn:
        conn.execute("INSERT INTO failures (prompt_id, sample_id, reason) VALUES ('p', 's', NULL)")
    assert main(["stats", "--db", str(db)]) == 0
    assert "(no reason recorded)" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["batch", "proxy", "stats"])
def test_a_store_path_ending_in_a_slash_is_refused_before_anything_is_made(command, tmp_path, capsys, monkeypatch):
    """`--db newdir/` made a file named `newdir` (DuckDB drops the slash): a batch then failed on its parts folder,
    leaving a store holding a run, and the proxy recorded into `newdir`. Refused in one line, nothing made."""
    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.jsonl").write_text('{"id": "a", "prompt": "hi"}\n')
    server = ["--server", "http://127.0.0.1:9"]
    argv = {"batch": ["batch", "p.jsonl", *server], "proxy": ["proxy", *server], "stats": ["stats"]}[command]
    assert main([*argv, "--db", "newdir/"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "newdir/ names a folder: give the store's .duckdb file (e.g. newdir/tokview.duckdb)" in err
    assert err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl"]


def test_a_store_opened_by_a_path_ending_in_a_slash_is_refused_and_nothing_is_made(tmp_path, monkeypatch):
    """The app and library callers open `Store` without the flag's check: the store refuses the path itself."""
    from tokview.store import Store, StoreError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreError, match="newdir/ names a folder"):
        Store("newdir/")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["audit", "{data}", "--db", "{db}"],
        ["demo", "--no-ui", "--db", "{db}"],
        ["batch", "{data}", "--server", "http://127.0.0.1:9", "--db", "{db}"],
        ["proxy", "--server", "http://127.0.0.1:9", "--db", "{db}"],
        ["merge", "{data}", "--into", "{db}"],
    ],
    ids=["audit", "demo", "batch", "proxy", "merge"],
)
def test_a_folder_given_as_the_store_to_create_is_named_a_directory(argv, tmp_path, capsys, monkeypatch):
    """Commands that create the store said DuckDB's "IO Error: Could not read from file …: Is a directory"."""
    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    folder = tmp_path / "runs"
    folder.mkdir()
    data = tmp_path / "d.jsonl"
    data.write_text('{"id": "a", "input_ids": [1, 2], "loss_mask": [0, 1]}\n')
    assert main([a.format(db=folder, data=data) for a in argv]) == ExitCode.USAGE
    flag = argv[argv.index("{db}") - 1]  # merge names its target --into
    assert (
        capsys.readouterr().err
        == f"tokview: error: {flag} {folder} is a directory, not a store: name its .duckdb file\n"
    )


def test_a_store_inside_another_stores_parts_folder_is_refused(tmp_path, capsys, monkeypatch):
    from tokview.store import Store

    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    with Store(tmp_path / "a.duckdb"):
        pass
    (tmp_path / "a.duckdb.parts").mkdir(exist_ok=True)
    inside = tmp_path / "a.duckdb.parts" / "b.duckdb"
    assert main(["stats", "--db", str(inside)]) == ExitCode.USAGE
    assert "is inside a store's parts folder: put the store elsewhere" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["batch", "export", "review", "score"])
def test_an_empty_run_name_is_refused(command, tmp_path, capsys, monkeypatch):
    """A batch stored its samples under the run "", and `export --run ''` read as no --run at all."""
    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    extra = {"batch": ["p.jsonl", "--server", "http://127.0.0.1:9"], "export": ["--out", "o.jsonl"]}
    assert main([command, *extra.get(command, []), "--run", " ", "--db", str(tmp_path / "s.duckdb")]) == ExitCode.USAGE
    assert "argument --run: an empty run name" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["batch", "{prompts}", "--server", "http://127.0.0.1:9", "--db", "{db}"],
        ["stats", "--db", "{db}"],
        ["review", "--db", "{db}", "--status", "pending"],
        ["merge", "{other}", "--into", "{db}"],
    ],
    ids=["batch", "stats", "review", "merge"],
)
def test_a_store_named_as_duckdb_names_a_write_ahead_log_is_refused(argv, tmp_path, capsys, monkeypatch):
    """DuckDB keeps `X.wal` as X's write-ahead log and deletes it once X is written: a store given as
    `--db runs.duckdb.wal` lost its samples to the next write of runs.duckdb."""
    from tokview.store import Store

    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    db = tmp_path / "runs.duckdb.wal"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n')
    with Store(tmp_path / "other.duckdb"):
        pass
    args = [a.format(db=db, prompts=prompts, other=tmp_path / "other.duckdb") for a in argv]
    assert main(args) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "is named as DuckDB names a store's write-ahead log" in err and err.count("\n") == 1
    assert not db.exists() and not (tmp_path / "runs.duckdb").exists()


@pytest.mark.parametrize("command", ["batch", "stats", "merge"])
def test_a_whole_database_where_a_stores_log_goes_is_never_opened_over(command, tmp_path, capsys, monkeypatch):
    """The other order: a database named `runs.duckdb.wal` exists, and `--db runs.duckdb` would have DuckDB replay
    it as runs.duckdb's log and delete it. Refused in one line, before anything is made; the database stays whole."""
    import duckdb

    from tokview.store import Store

    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    log = tmp_path / "runs.duckdb.wal"
    conn = duckdb.connect(str(log))
    conn.execute("CREATE TABLE kept AS SELECT 42 AS answer")
    conn.close()
    before = log.read_bytes()
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n')
    with Store(tmp_path / "other.duckdb"):
        pass
    db = tmp_path / "runs.duckdb"
    argv = {
        "batch": ["batch", str(prompts), "--server", "http://127.0.0.1:9", "--db", str(db)],
        "stats": ["stats", "--db", str(db)],
        "merge": ["merge", str(tmp_path / "other.duckdb"), "--into", str(db)],
    }[command]
    code = main(argv)
    err = capsys.readouterr().err
    assert code != 0 and err.count("\n") == 1
    if command != "stats":  # stats says the store is missing first: it opens nothing either
        assert f"{log} is a whole DuckDB database, where DuckDB keeps {db}'s write-ahead log" in err
    assert log.read_bytes() == before and not db.exists() and not (tmp_path / "runs.duckdb.parts").exists()


def test_the_store_layer_refuses_a_database_where_its_log_goes(tmp_path):
    """Whatever opens the store (the app, a child process), not only the commands' flag check."""
    import duckdb

    from tokview.store import Store, StoreError

    log = tmp_path / "s.duckdb.wal"
    duckdb.connect(str(log)).close()
    with pytest.raises(StoreError, match="would delete it"):
        Store(tmp_path / "s.duckdb")
    assert (tmp_path / "s.duckdb.wal").exists() and not (tmp_path / "s.duckdb").exists()


def test_merge_names_its_own_flag_for_a_bad_target(tmp_path, capsys, monkeypatch):
    """`merge` has no --db: its target's errors said "--db adir is a directory" and "pass another --db"."""
    import duckdb

    from tokview.store import Store

    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    source = tmp_path / "src.duckdb"
    with Store(source):
        pass
    folder = tmp_path / "adir"
    folder.mkdir()
    foreign = tmp_path / "foreign.duckdb"
    duckdb.connect(str(foreign)).execute("CREATE TABLE t (i INTEGER)").close()
    text = tmp_path / "text.duckdb"
    text.write_text("not a database\n")
    for target, said in [
        (folder, f"--into {folder} is a directory, not a store"),
        (foreign, "is a DuckDB database but not a tokview store (it has tables t): pass another --into"),
        (text, "is not a DuckDB database (a tokview store is one): pass another --into"),
    ]:
        assert main(["merge", str(source), "--into", str(target)]) == ExitCode.USAGE
        err = capsys.readouterr().err
        assert said in err and "--db" not in err and err.count("\n") == 1, err


def test_a_store_named_through_a_link_is_checked_where_duckdb_keeps_its_log(tmp_path, capsys, monkeypatch):
    """DuckDB keeps the log beside the file a link points to: the check looked beside the link, and a whole database
    named like the real file's log was deleted by a write through the link."""
    import duckdb

    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    real = tmp_path / "s2.duckdb"
    from tokview.store import Store

    with Store(real):
        pass
    log = tmp_path / "s2.duckdb.wal"
    duckdb.connect(str(log)).execute("CREATE TABLE kept AS SELECT 1 AS one").close()
    link = tmp_path / "L.duckdb"
    link.symlink_to(real)
    for argv in (["review", "--db", str(link), "--status", "pending", "--note", "x"], ["stats", "--db", str(link)]):
        assert main(argv) == ExitCode.USAGE
        assert "is a whole DuckDB database, where DuckDB keeps" in capsys.readouterr().err
    assert log.exists() and duckdb.connect(str(log), read_only=True).execute("SELECT * FROM kept").fetchall() == [(1,)]


def test_merge_names_a_bad_source_as_the_source_not_the_target(tmp_path, capsys, monkeypatch):
    import duckdb

    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    source = tmp_path / "src.duckdb"
    duckdb.connect(str(source)).execute("CREATE TABLE foo (i INTEGER)").close()
    (tmp_path / "src.duckdb.parts").mkdir()
    (tmp_path / "src.duckdb.parts" / "part-1-2-000007.samples.jsonl").write_text("")
    assert main(["merge", str(source), "--into", str(tmp_path / "into.duckdb")]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "--into" not in err and "--db" not in err and err.count("\n") == 1, err
