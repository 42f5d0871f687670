"""A store damaged or tampered with (a sweep of copies damaged every way): each ended in exit 70 or a loop. Now one
line and a non-zero exit, or the store read as far as it can be; nothing stored is lost."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
from builders import make_capture, put

from tokview.cli import main
from tokview.store import Store, parts


def _store(path: Path, n: int = 3) -> list[str]:
    with Store(path) as store:
        store.put_run("run1", settings={"t": 0})
        return [put(store, f"q{i}", make_capture(question=f"q{i}")) for i in range(n)]


def test_a_parts_folder_that_cannot_be_listed_is_said_not_a_traceback(tmp_path, capsys, monkeypatch):
    db = tmp_path / "s.duckdb"
    ids = _store(db)
    folder = parts.parts_dir(db)
    folder.mkdir(exist_ok=True)
    real = os.scandir

    def refused(path):
        if Path(path) == folder:
            raise PermissionError(13, "Permission denied")
        return real(path)

    monkeypatch.setattr(parts.os, "scandir", refused)
    assert main(["stats", "--db", str(db)]) == 0
    captured = capsys.readouterr()
    assert f"samples   {len(ids)}" in captured.out or str(len(ids)) in captured.out
    assert "cannot list" in captured.err and "Permission denied" in captured.err


def test_a_landed_part_that_cannot_be_removed_stays_without_a_traceback(tmp_path, monkeypatch):
    """A parts folder this user cannot write: removing a landed part raised PermissionError (exit 70). It stays (its
    samples are stored: a later landing skips their ids)."""
    part = tmp_path / "part-1-1-000001.samples.jsonl"
    part.write_text("{}\n")

    def refused(self, missing_ok=False):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "unlink", refused)
    parts.remove([part])
    assert part.exists()


def test_an_instance_a_fatal_error_invalidated_is_dropped_not_raised(tmp_path, monkeypatch):
    """A store file cut short: DuckDB's fatal error at commit was told in one line, then closing the store asked the
    instance that error had invalidated whether the file was attached, and its FatalException (exit 70) replaced
    the one line. (A cut that DuckDB finds depends on where its free blocks fell: the instance is made to fail.)"""
    from tokview.store import connection

    db = tmp_path / "t.duckdb"
    _store(db, 1)
    real = connection._attached

    def invalidated(host):
        raise duckdb.FatalException("FATAL Error: Failed: database has been invalidated")

    store = Store(db)
    store.count_samples()
    monkeypatch.setattr(connection, "_attached", invalidated)
    store.close()  # no FatalException
    monkeypatch.setattr(connection, "_attached", real)
    with Store(db) as again:  # a new instance for the file: it opens as before
        assert again.count_samples() == 1


def test_a_run_row_that_is_not_json_is_named_in_one_line(tmp_path, capsys):
    db = tmp_path / "s.duckdb"
    ids = _store(db)
    con = duckdb.connect(str(db))
    con.execute("UPDATE runs SET settings = '{truncated'")
    con.close()
    assert main(["show", ids[0], "--db", str(db)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "run run1: its stored settings is not JSON" in err[0], err


def test_a_damaged_part_that_cannot_be_set_aside_is_said_and_copied_no_more(tmp_path, capsys):
    db = tmp_path / "s.duckdb"
    _store(db)
    folder = parts.parts_dir(db)
    folder.mkdir(exist_ok=True)
    (folder / "part-01796504276817742548-99999-000001.samples.jsonl").write_bytes(b'{"sample_id": "x", "prompt_i')
    (folder / parts.DAMAGED_DIR).write_text("a file where the folder goes")
    for _ in range(2):
        main(["stats", "--db", str(db)])
        err = capsys.readouterr().err
        assert "cannot be set aside" in err and "Traceback" not in err, err
    assert len(list(folder.glob("*.samples.jsonl"))) == 1  # no copy of its lines made on each command
