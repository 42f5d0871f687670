"""The store's errors, apart from DuckDB and from any one writer.

Why a module of their own: a `--workers` child and a Ray task raise and catch them without opening the store
(and without importing DuckDB, see `part_sink.py`), the store's connection, repositories and facade raise them,
and callers import them from `tokview.store`. They lived in `part_sink.py`, which named the wrong thing.
"""

from __future__ import annotations

import errno

from tokview.errors import TokviewError, UserError


class StoreError(TokviewError):
    """The database cannot be opened, read or written (locked, not DuckDB, disk full, unwritable COPY target…)."""

    title = "store"


class StoreHeld(StoreError):
    """Another program held the store past the wait. What was written to parts is safe: a landing that met this
    tries again later (`batch.workers.Lander`), and any later command on the store lands it."""


class StoreFull(StoreError):
    """The disk under the store is full: stop taking work (what is stored or in parts is kept)."""

    title = "disk full"


class CannotUndo(UserError):
    """The action asked for cannot be taken back (unknown, an undo itself, already undone): raised where the
    store finds out, worded for the review command and the app's undo list alike."""

    title = "undo"

    def __init__(self, message: str) -> None:
        super().__init__(f"{message} (`tokview review --history` or the app's undo list shows the actions)")


def is_disk_full(exc: BaseException) -> bool:
    """Whether an OS or DuckDB error says the disk (or the user's quota, or the file size limit) has no more room.
    A file size limit (`ulimit -f`: "File too large") stopped a batch with DuckDB's raw error and no summary, where
    a full disk stops it early and says how to land what is kept."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc).lower()
    return "no space left on device" in text or "disk quota exceeded" in text or _too_large(exc)


def no_room_said(exc: BaseException) -> str:
    """How the error is said: `no space left on device`, or the file size limit it hit."""
    return "file too large (a file size limit, `ulimit -f`)" if _too_large(exc) else "no space left on device"


def _too_large(exc: BaseException) -> bool:
    """The file size limit, as the OS says it (EFBIG) or as DuckDB words it."""
    return (isinstance(exc, OSError) and exc.errno == errno.EFBIG) or "file too large" in str(exc).lower()
