"""A store file is ATTACHed to an in-memory DuckDB instance of its own in the process for each operation and
DETACHed after (`store.connection._attach`), instead of `duckdb.connect(path)` starting an instance every time.
What that must not change: a failed checkpoint at the close, another store's long query, where memory spills, two
merges at once, and the process's exit (each found by a review of the change, each failing before its fix)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

from builders import kimi as kimi_tokenizer
from builders import make_capture, profile

from tokview.core.analysis import analyze
from tokview.store import SampleIdentity, Store
from tokview.store.connection import _OPEN_HERE


def _records(store: Store, prefix: str, n: int) -> list[dict]:
    capture = make_capture("q")
    analysis = analyze(capture, profile(), kimi_tokenizer())
    return [
        store.sample_record(SampleIdentity(f"{prefix}{i}", "p1", "run1", gen_index=0), capture, analysis)
        for i in range(n)
    ]


def test_a_checkpoint_that_fails_at_the_close_on_a_full_disk_keeps_the_commit_and_raises_nothing(small_disk):
    """DuckDB detaches a file whose closing checkpoint failed and keeps the commit in the WAL (as a close did); the
    retry then raised "database not found" from every store call, and the command said "internal error"."""
    db = small_disk / "s.duckdb"
    Store(db, linger=0).close()
    store = Store(db, linger=0)
    with store.hold():
        store.write(
            [("INSERT INTO runs (run_id, settings) VALUES (?, ?)", [f"r{i}", "x" * 20_000]) for i in range(100)]
        )
        with open(small_disk / "ballast", "wb") as f:  # the disk fills before the close's checkpoint
            try:
                while True:
                    f.write(b"\0" * 65536)
            except OSError:
                pass
    (small_disk / "ballast").unlink()
    assert len(store.query("SELECT * FROM runs")) == 100
    store.close()


def test_a_store_closed_while_another_stores_long_query_runs_is_free_at_once(tmp_path):
    """A statement that reads the catalog refers to every database of its instance, and DuckDB puts off the DETACH
    of one it refers to: with one instance for every store, another store's long query kept a closed store locked
    (another process could not open it) and its next open failed with "Unique file handle conflict"."""
    a, b = Store(tmp_path / "a.duckdb", linger=0), Store(tmp_path / "b.duckdb", linger=0)
    started = threading.Event()

    def long_catalog_read() -> None:
        with a.hold():
            started.set()
            a.query("SELECT count(*) FROM duckdb_tables(), range(300000000)")

    reading = threading.Thread(target=long_catalog_read)
    try:
        with b.hold():
            b.write([("INSERT INTO runs (run_id) VALUES (?)", ["r1"])])
            reading.start()
            started.wait(30)
            time.sleep(0.2)
        other = subprocess.run(
            [
                sys.executable,
                "-c",
                "import duckdb, sys; duckdb.connect(sys.argv[1]).close()",
                str(tmp_path / "b.duckdb"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert other.returncode == 0, "closed, yet another process cannot open it: " + other.stderr[-300:]
        assert b.count_samples() == 0
    finally:
        reading.join(120)
        a.close()
        b.close()


def test_what_does_not_fit_in_memory_spills_beside_the_store_not_into_the_working_directory(tmp_path, monkeypatch):
    """`duckdb.connect(path)` spilled into `PATH.tmp`; an in-memory instance's default is `./.tmp`, which follows the
    working directory (read-only, or another disk)."""
    db = tmp_path / "s.duckdb"
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    with Store(db, linger=0) as store:
        (temp,) = store.query("SELECT current_setting('temp_directory')")[0]
    assert Path(temp).resolve() == Path(f"{db}.tmp").resolve(), temp


def test_two_merges_in_two_threads_both_land(tmp_path):
    """A merge attaches its source as `src`: two at once in one instance collided ("database with name src already
    exists"). Each target has its own instance, and merges in a process take turns."""
    for name in ("a", "b"):
        with Store(tmp_path / f"{name}.duckdb", linger=0) as source:
            source.write_part(_records(source, name, 200))
            source.ingest()
    errors: list[str] = []

    def merging(name: str) -> None:
        for i in range(3):
            try:
                with Store(tmp_path / f"t{name}{i}.duckdb", linger=0) as target:
                    assert target.merge(tmp_path / f"{name}.duckdb")["samples"] == 200
            except Exception as exc:  # collected: an exception in a thread would pass unseen
                errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=merging, args=(name,)) for name in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert _OPEN_HERE == {}


def test_exiting_while_a_thread_queries_a_store_prints_nothing_from_the_exit_hooks(tmp_path):
    """Closing the host instances at exit raised "connection is busy" while a daemon thread was inside a statement."""
    code = (
        "import threading, time\n"
        "from tokview.store import Store\n"
        f"s = Store({str(tmp_path / 'e.duckdb')!r}, linger=0)\n"
        "threading.Thread(target=lambda: s.query('SELECT count(*) FROM range(3000000000) t(i) WHERE i % 7 = 3'),"
        " daemon=True).start()\n"
        "time.sleep(0.5)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "Exception ignored in atexit callback" not in done.stderr, done.stderr[-400:]
