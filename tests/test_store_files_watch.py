"""`StoreFilesWatch`: a live screen's "did the store change?" without opening it (`os.stat` of the store file, its
log and its parts folder)."""

from __future__ import annotations

import time
from pathlib import Path

from tokview.store import Store
from tokview.ui.store_files import StoreFilesWatch


def test_a_change_is_seen_once_and_an_unchanged_store_never(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "s.duckdb"))
    store.close()
    watch = StoreFilesWatch(store)
    assert watch.changed()  # the first look: the screen reads once
    assert not watch.changed()
    store.parts_dir.mkdir(parents=True, exist_ok=True)  # a batch or the proxy wrote its first part
    assert watch.changed()
    assert not watch.changed()
    (tmp_path / "s.duckdb").rename(tmp_path / "moved.duckdb")  # gone: a change (the read then says so)
    assert watch.changed()
    assert not watch.changed()


def test_a_failed_read_is_tried_again_after_the_retry_time_even_with_no_change(tmp_path: Path) -> None:
    """A program holding the store only to read it changes no file: without a retry the screen waited for the
    next write to show what landed while the store was held."""
    store = Store(str(tmp_path / "s.duckdb"))
    store.close()
    watch = StoreFilesWatch(store, retry_s=0.5)
    assert watch.changed()
    watch.read_failed()
    assert not watch.changed()  # not every tick: each read waits on the holder
    time.sleep(0.6)
    assert watch.changed()
    assert not watch.changed()  # once


def test_an_in_memory_store_is_read_at_every_look() -> None:
    """No file and no other program: the app's own writes (a turn reviewed) are all there is to see."""
    watch = StoreFilesWatch(Store(":memory:"))
    assert watch.changed() and watch.changed()


def test_a_whole_read_marks_the_files_seen_only_once_it_succeeded(tmp_path: Path) -> None:
    """The samples list under an open sessions screen read the store at its first tick after it had loaded (one
    other program's connect in ten refused); and a reload that failed on a held store marked the files seen, so the
    change it was to show waited for the next write."""
    store = Store(str(tmp_path / "s.duckdb"))
    store.close()
    watch = StoreFilesWatch(store, retry_s=0.0)
    before = watch.signature()
    watch.read_done(before)
    assert not watch.changed()  # the first tick after a load reads nothing
    watch.read_failed()  # a reload met a held store
    assert watch.changed()  # its retry is due (retry_s 0): read again though no file changed
    store.parts_dir.mkdir(parents=True, exist_ok=True)
    watch.read_done(before)  # a read that began before the change: the change is still to be read
    assert watch.changed()


def test_a_symlinked_stores_log_is_looked_at_beside_its_target(tmp_path: Path) -> None:
    """DuckDB writes the log beside the file the link points to: the watch looked at `link.duckdb.wal`, which never
    exists, and a change held only in the log was not seen."""
    real = tmp_path / "real.duckdb"
    Store(str(real)).close()
    link = tmp_path / "link.duckdb"
    link.symlink_to(real)
    watch = StoreFilesWatch(Store(str(link)))
    assert watch.changed()
    (tmp_path / "real.duckdb.wal").write_bytes(b"x")
    assert watch.changed()
