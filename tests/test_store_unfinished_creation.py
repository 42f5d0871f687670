"""A store whose creation never finished is completed; anything holding data, or not ours, is left alone.

The kill matrix (a merge SIGKILLed the moment its new target's WAL appears) and the disk-full matrix (DuckDB
could not write the new file's header) are the end-to-end checks; these build the two leftovers directly: a
file holding only an empty `schema_version` (what a kill between its creation and the first migration left)
and a 0-byte file (what a full disk left).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from tokview.store import Store
from tokview.store.part_sink import StoreError
from tokview.store.schema import LATEST_VERSION, SchemaError
from tokview.store.store import UNFINISHED_AFTER_S


def _version(db: Path) -> int:
    with Store(db) as store:
        return int(store.query("SELECT max(version) FROM schema_version")[0][0])


def test_a_file_holding_only_an_empty_schema_version_is_completed_as_a_new_store(tmp_path):
    db = tmp_path / "killed.duckdb"
    conn = duckdb.connect(str(db))
    conn.execute("CREATE TABLE schema_version (version INTEGER, name VARCHAR, applied_at TIMESTAMP)")
    conn.close()
    assert _version(db) == LATEST_VERSION


def test_an_empty_schema_version_beside_other_tables_is_somebody_elses_file_and_untouched(tmp_path):
    db = tmp_path / "theirs.duckdb"
    conn = duckdb.connect(str(db))
    conn.execute("CREATE TABLE schema_version (version INTEGER, name VARCHAR, applied_at TIMESTAMP)")
    conn.execute("CREATE TABLE notes AS SELECT 'keep me' AS text")
    conn.close()
    with pytest.raises(SchemaError, match="not a tokview store"):
        Store(db)
    conn = duckdb.connect(str(db), read_only=True)
    assert conn.execute("SELECT name FROM (SHOW TABLES) ORDER BY name").fetchall() == [("notes",), ("schema_version",)]
    conn.close()


def test_a_schema_version_with_rows_and_nothing_else_is_not_taken_for_an_unfinished_store(tmp_path):
    db = tmp_path / "odd.duckdb"
    conn = duckdb.connect(str(db))
    conn.execute("CREATE TABLE schema_version (version INTEGER, name VARCHAR, applied_at TIMESTAMP)")
    conn.execute("INSERT INTO schema_version VALUES (1, 'theirs', now())")
    conn.close()
    with pytest.raises(SchemaError, match="not a tokview store"):
        Store(db)


def _left_a_while_ago(path: Path) -> None:
    """As a failed creation left it: older than any creation still under way."""
    old = time.time() - UNFINISHED_AFTER_S - 5
    os.utime(path, (old, old))


def test_a_zero_byte_file_is_created_as_a_new_store(tmp_path):
    db = tmp_path / "empty.duckdb"
    db.touch()
    _left_a_while_ago(db)
    assert _version(db) == LATEST_VERSION


def test_a_zero_byte_file_made_this_instant_may_be_a_store_being_created_and_is_waited_for(tmp_path, monkeypatch):
    monkeypatch.setattr("tokview.store.connection.UNFINISHED_AFTER_S", 120.0)  # however slow this machine is
    db = tmp_path / "new.duckdb"
    db.touch()
    inode = db.stat().st_ino
    with pytest.raises(StoreError, match="gave up"):
        Store(db, lock_timeout=0.3, on_wait=lambda message: None)
    assert db.stat().st_ino == inode
    assert db.stat().st_size == 0


def test_a_zero_byte_file_dated_ahead_of_the_clock_is_no_creation_under_way(tmp_path):
    """Copied with its times from a box whose clock was ahead, or left before the clock stepped back: its age was
    negative, so "younger than half a second" for ever: every command waited 120 s, then blamed another process."""
    db = tmp_path / "ahead.duckdb"
    db.touch()
    ahead = time.time() + 3600
    os.utime(db, (ahead, ahead))
    assert _version(db) == LATEST_VERSION


def test_a_zero_byte_file_beside_a_write_ahead_log_is_left_alone(tmp_path):
    """A WAL holds changes DuckDB has not applied: not provably nothing, so not ours to replace."""
    db = tmp_path / "odd.duckdb"
    db.touch()
    _left_a_while_ago(db)
    Path(f"{db}.wal").write_bytes(b"some log")
    with pytest.raises(StoreError, match="not a valid DuckDB database file"):
        Store(db)
    assert db.stat().st_size == 0
    assert Path(f"{db}.wal").read_bytes() == b"some log"


def test_a_zero_byte_file_another_process_holds_locked_is_not_replaced(tmp_path):
    """Another process creating it right now holds its lock: wait for it (here: give up), never delete it."""
    db = tmp_path / "creating.duckdb"
    db.touch()
    _left_a_while_ago(db)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); fcntl.lockf(fd, fcntl.LOCK_EX); "
            "print('locked', flush=True); sys.stdin.read()",
            str(db),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "locked\n"
        inode = db.stat().st_ino
        with pytest.raises(StoreError, match="in use"):
            Store(db, lock_timeout=0.3, on_wait=lambda message: None)
        assert db.stat().st_ino == inode
        assert db.stat().st_size == 0
    finally:
        holder.communicate("")
