"""A new store's spare is a copy of a kept blank store (`tokview/store/blank_store.py`), never a wrong one.

What must hold: the first spare made by DuckDB is kept as the blank and later spares are its bytes with an
identifier of their own, so DuckDB refuses one store's write-ahead log for another; a blank whose bytes do not
match its name, or made for another schema or DuckDB, or that is no regular file, is never copied (DuckDB makes
the spare, as without one); a copy is never linked where a write-ahead log was left; a copy's `schema_version`
rows carry its own time; the cache keeps a few blanks, not one per store made at once. Real DuckDB files, a real
landing child.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
from mounts import tmpfs
from run_records import record

from tokview.batch.early_landing import spare_path
from tokview.batch.landing_process import LandingChild, make_spare, take_spare
from tokview.batch.store_opener import StoreOpener
from tokview.store import Store
from tokview.store.blank_store import FOLDER, HEADER, IDENTIFIER, KEPT, blank_key, keep_blank
from tokview.store.schema import migrate


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A cache folder of this test's own: the suite's shared one must never hold a marked blank."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("TOKVIEW_CACHE", str(folder))
    return folder


def blanks(cache: Path) -> list[Path]:
    return sorted((cache / FOLDER).glob("*.duckdb")) if (cache / FOLDER).is_dir() else []


def marked_blank(where: Path, applied: str = "2001-01-01") -> Path:
    """A valid store file with a table no real store has, and an old `applied_at`: a copy of it is recognisable."""
    with duckdb.connect(str(where)) as conn:
        migrate(conn)
        conn.execute("CREATE TABLE blank_marker (x INTEGER)")
        conn.execute(f"UPDATE schema_version SET applied_at = TIMESTAMP '{applied} 00:00:00'")
        conn.execute("CHECKPOINT")
    return where


def killed_mid_write(db: Path, run_id: str) -> None:
    """A process that wrote a run row into `db` and was killed before a checkpoint: its log is left beside it."""
    writer = (
        "import duckdb, os, sys\n"
        "c = duckdb.connect(sys.argv[1])\n"
        "c.execute('INSERT INTO runs (run_id) VALUES (?)', [sys.argv[2]])\n"
        "os.kill(os.getpid(), 9)\n"
    )
    subprocess.run([sys.executable, "-c", writer, str(db), run_id], check=False)
    assert db.with_name(db.name + ".wal").exists()


def tables(db: Path) -> set[str]:
    with duckdb.connect(str(db), read_only=True) as conn:
        return {name for (name,) in conn.execute("SELECT table_name FROM duckdb_tables()").fetchall()}


def test_the_first_spare_is_kept_as_the_blank_and_later_ones_are_its_bytes(tmp_path, cache):
    first = make_spare(str(tmp_path / "a.duckdb"))
    assert first is not None
    [blank] = blanks(cache)
    assert blank.name.startswith(blank_key() + "-")
    assert blank.read_bytes() == first.read_bytes()
    second = make_spare(str(tmp_path / "b.duckdb"))
    third = make_spare(str(tmp_path / "c.duckdb"))
    assert second is not None and third is not None
    kept, copies = blank.read_bytes(), [second.read_bytes(), third.read_bytes()]
    for copy in copies:
        assert copy[HEADER:] == kept[HEADER:]
        assert {i for i in range(HEADER) if copy[i] != kept[i]} - set(range(8)) <= set(IDENTIFIER)
    assert copies[0][124:140] != copies[1][124:140] != kept[124:140]  # an identifier of its own, as DuckDB gives
    assert blanks(cache) == [blank]  # kept once
    take_spare(third, str(tmp_path / "c.duckdb"))
    assert take_spare(second, str(tmp_path / "b.duckdb"))
    with Store(tmp_path / "b.duckdb") as store:
        assert store.query("SELECT count(*) FROM runs") == [(0,)]


def test_a_blank_whose_bytes_do_not_match_its_name_or_key_is_never_copied(tmp_path, cache):
    made = marked_blank(tmp_path / "marked.duckdb")
    keep_blank(made)
    [blank] = blanks(cache)
    spare = make_spare(str(tmp_path / "a.duckdb"))
    assert spare is not None and "blank_marker" in tables(spare)  # a valid blank is copied as it is
    take_spare(spare, str(tmp_path / "a.duckdb"))

    data = bytearray(blank.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a flipped byte: the name's sha256 no longer matches
    blank.write_bytes(bytes(data))
    spare = make_spare(str(tmp_path / "b.duckdb"))
    assert spare is not None and "blank_marker" not in tables(spare)  # made by DuckDB instead
    take_spare(spare, str(tmp_path / "b.duckdb"))

    for kept in blanks(cache):
        kept.unlink()
    keep_blank(marked_blank(tmp_path / "other.duckdb"))
    [good] = blanks(cache)
    good.rename(good.with_name("0" * 24 + "-" + good.name.split("-", 1)[1]))  # its bytes, another schema's key
    spare = make_spare(str(tmp_path / "c.duckdb"))
    assert spare is not None and "blank_marker" not in tables(spare)


def test_a_copy_is_never_linked_where_a_write_ahead_log_was_left(tmp_path, cache):
    """Every copy of a blank shares its DuckDB identifier, the one DuckDB checks a log against: a store deleted
    without its log (killed mid-write, then `rm x.duckdb`) had that log replayed into the next store made there."""
    db = tmp_path / "s.duckdb"
    keep_blank(marked_blank(tmp_path / "marked.duckdb"))
    first = make_spare(str(db))
    assert first is not None and take_spare(first, str(db))
    killed_mid_write(db, "from-the-deleted-store")
    db.unlink()  # the log stays
    spare = make_spare(str(db))
    assert spare is not None and "blank_marker" in tables(spare)  # a copy
    assert not take_spare(spare, str(db))
    assert not db.exists() and not spare.exists()  # the run makes the store itself (DuckDB ignores the log then)
    with Store(db) as store:
        assert store.query("SELECT run_id FROM runs") == []


def test_a_run_into_a_copy_dates_its_schema_rows_now(tmp_path, cache):
    keep_blank(marked_blank(tmp_path / "marked.duckdb"))
    db = tmp_path / "r.duckdb"
    started = datetime.datetime.now() - datetime.timedelta(minutes=1)
    child = LandingChild.for_new_store(StoreOpener(db))
    assert child is not None and child._proc is not None
    deadline = time.monotonic() + 30
    while not spare_path(str(db), child._proc.pid).exists():
        assert time.monotonic() < deadline, "the child made no spare"
        time.sleep(0.01)
    child.begin_run(record("r1", {}))
    child.ingest()
    child.close()
    assert "blank_marker" in tables(db)
    with duckdb.connect(str(db), read_only=True) as conn:
        dates = [row[0] for row in conn.execute("SELECT applied_at FROM schema_version").fetchall()]
    assert dates and all(d >= started for d in dates), dates


def test_a_cache_that_cannot_be_written_still_makes_every_spare(tmp_path, monkeypatch):
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("x")
    monkeypatch.setenv("TOKVIEW_CACHE", str(blocked))
    for name in ("a", "b"):
        spare = make_spare(str(tmp_path / f"{name}.duckdb"))
        assert spare is not None
        assert take_spare(spare, str(tmp_path / f"{name}.duckdb"))
    assert blocked.read_text() == "x"


def test_one_copys_write_ahead_log_is_refused_by_another_put_in_its_place(tmp_path, cache):
    """Copies that shared the blank's identifier took each other's logs: `rm a.duckdb; mv b.duckdb a.duckdb` with
    `a.duckdb.wal` left replayed a's last writes into b, silently. DuckDB refuses that for files it made itself."""
    made = make_spare(str(tmp_path / "first.duckdb"))  # keeps the blank
    assert made is not None and blanks(cache)
    a, b = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    for db in (a, b):
        spare = make_spare(str(db))
        assert spare is not None and take_spare(spare, str(db))
    killed_mid_write(a, "written-to-a")
    a.unlink()
    b.rename(a)
    with pytest.raises(duckdb.Error, match="WAL does not match"):
        duckdb.connect(str(a)).close()
    a.with_name("a.duckdb.wal").unlink()
    with duckdb.connect(str(a), read_only=True) as conn:
        assert conn.execute("SELECT count(*) FROM runs").fetchall() == [(0,)]


def test_a_blank_that_is_no_regular_file_is_never_read(tmp_path, cache):
    """A FIFO under a blank's name blocked the read for ever, and the batch waited for its child."""
    folder = cache / FOLDER
    folder.mkdir(parents=True)
    os.mkfifo(folder / f"{blank_key()}-0.duckdb")
    (folder / f"{blank_key()}-1.duckdb").mkdir()
    probe = (
        "import sys\nfrom tokview.batch.landing_process import make_spare\nprint(make_spare(sys.argv[1]) is not None)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path / "s.duckdb")], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "True", done.stderr


def test_the_cache_keeps_a_few_blanks_not_one_per_store_made_at_once(tmp_path, cache):
    folder = cache / FOLDER
    folder.mkdir(parents=True)
    for k in range(KEPT + 3):  # blanks of other schemas or DuckDB versions, oldest first
        old = folder / f"{k:024d}-{k:032d}.duckdb"
        old.write_bytes(b"x")
        os.utime(old, (1_000_000 + k, 1_000_000 + k))
    left = folder / ".blank-killed"
    left.write_bytes(b"x")
    os.utime(left, (1_000_000, 1_000_000))
    for name in ("a", "b", "c"):  # one keeps the blank; the others find it kept
        assert make_spare(str(tmp_path / f"{name}.duckdb")) is not None
    names = sorted(p.name for p in folder.iterdir())
    assert len(names) == KEPT and any(n.startswith(blank_key()) for n in names), names
    assert f"{KEPT + 2:024d}-{KEPT + 2:032d}.duckdb" in names  # the newest others stay


def test_a_damaged_blank_is_replaced_not_left_to_stop_every_later_copy(tmp_path, cache):
    assert make_spare(str(tmp_path / "a.duckdb")) is not None
    [blank] = blanks(cache)
    blank.write_bytes(blank.read_bytes()[:5000])  # cut short
    made = make_spare(str(tmp_path / "b.duckdb"))  # made by DuckDB, and kept as the blank in the damaged one's place
    copy = make_spare(str(tmp_path / "c.duckdb"))
    assert made is not None and copy is not None
    [kept] = blanks(cache)
    assert kept != blank and kept.read_bytes() == made.read_bytes()
    assert copy.read_bytes()[HEADER:] == made.read_bytes()[HEADER:]


def test_a_cache_duckdb_cannot_write_in_still_makes_every_spare(tmp_path, monkeypatch):
    """DuckDB's own error in the cache (full, unlockable) is no OSError: it reached `make_spare`'s catch-all, which
    threw the good spare away, on every run."""
    with tmpfs(tmp_path / "disk", "8k") as disk:
        monkeypatch.setenv("TOKVIEW_CACHE", str(disk))
        for name in ("a", "b"):
            spare = make_spare(str(tmp_path / f"{name}.duckdb"))
            assert spare is not None and take_spare(spare, str(tmp_path / f"{name}.duckdb"))
            with Store(tmp_path / f"{name}.duckdb") as store:
                assert store.query("SELECT count(*) FROM runs") == [(0,)]


def test_batches_that_keep_a_blank_at_once_leave_one_of_their_key_and_others_keys_alone(tmp_path):
    from tokview.store.blank_store import _prune

    names = [f"{'k' * 24}-{n:032d}.duckdb" for n in range(3)] + [f"{'o' * 24}-{0:032d}.duckdb"]
    for k, name in enumerate(names):
        (tmp_path / name).write_bytes(b"x")
        os.utime(tmp_path / name, (1_000_000 + k, 1_000_000 + k))
    _prune(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [names[2], names[3]]
