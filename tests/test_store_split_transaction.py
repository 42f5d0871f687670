"""The one transaction context manager (`tokview.store.connection.transaction`) on real DuckDB stores: a block
that raises leaves nothing, a trial (`commit=False`) leaves nothing either way, and the connection is usable
afterwards; `Store.write` and the repositories go through it."""

from __future__ import annotations

import duckdb
import pytest

from tokview.store.connection import transaction
from tokview.store.store import Store, StoreError


def _table(tmp_path):
    conn = duckdb.connect(str(tmp_path / "t.duckdb"))
    conn.execute("CREATE TABLE t (x INTEGER PRIMARY KEY)")
    return conn


def _rows(conn) -> list[int]:
    return [r[0] for r in conn.execute("SELECT x FROM t ORDER BY x").fetchall()]


def test_a_block_that_ends_normally_is_committed(tmp_path):
    conn = _table(tmp_path)
    with transaction(conn):
        conn.execute("INSERT INTO t VALUES (1), (2)")
    assert _rows(conn) == [1, 2]


def test_a_block_that_raises_is_rolled_back_and_the_error_is_the_blocks(tmp_path):
    conn = _table(tmp_path)
    with pytest.raises(duckdb.ConstraintException), transaction(conn):
        conn.execute("INSERT INTO t VALUES (1)")
        conn.execute("INSERT INTO t VALUES (1)")
    assert _rows(conn) == []
    with transaction(conn):  # no transaction left open: a new one begins
        conn.execute("INSERT INTO t VALUES (3)")
    assert _rows(conn) == [3]


def test_a_trial_is_rolled_back_when_it_succeeds(tmp_path):
    conn = _table(tmp_path)
    with transaction(conn, commit=False):
        conn.execute("INSERT INTO t VALUES (1)")
        assert _rows(conn) == [1]
    assert _rows(conn) == []


def test_store_write_lands_all_statements_or_none(tmp_path):
    with Store(tmp_path / "s.duckdb", linger=0) as store:
        run = "INSERT INTO runs (run_id, started) VALUES (?, now())"
        with pytest.raises(StoreError, match="cannot write to"):
            store.write([(run, ["a"]), (run, ["a"])])
        assert store.query("SELECT run_id FROM runs") == []
        store.write([(run, ["a"]), (run, ["b"])])
        assert store.query("SELECT run_id FROM runs ORDER BY 1") == [("a",), ("b",)]


def test_a_verdict_on_an_unknown_sample_writes_no_action(tmp_path):
    from tokview.store import UnknownSample

    with Store(tmp_path / "s.duckdb", linger=0) as store:
        with pytest.raises(UnknownSample):
            store.record_verdict("nope", "approved", who="ann")
        assert store.actions() == []
