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
    watch = StoreFilesWatch(store, retry_s=0.05)
    assert watch.changed()
    watch.read_failed()
    assert not watch.changed()  # not every tick: each read waits on the holder
    time.sleep(0.06)
    assert watch.changed()
    assert not watch.changed()  # once


def test_an_in_memory_store_is_read_once() -> None:
    watch = StoreFilesWatch(Store(":memory:"))
    assert watch.changed()
    assert not watch.changed()


def test_a_screen_that_just_read_the_store_does_not_read_it_again_at_its_first_tick(tmp_path: Path) -> None:
    """The samples list under an open sessions screen read the store at its first tick after it had loaded: one
    other program's connect in ten was refused in that read's window."""
    store = Store(str(tmp_path / "s.duckdb"))
    store.close()
    watch = StoreFilesWatch(store, retry_s=0.0)
    watch.read_failed()
    watch.reading()  # a whole read (a load, ctrl+r) also ends a pending retry
    assert not watch.changed()
    store.parts_dir.mkdir(parents=True, exist_ok=True)
    assert watch.changed()
