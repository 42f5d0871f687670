"""A store's write-ahead log, checked without DuckDB.

DuckDB keeps database PATH's write-ahead log in `PATH.wal`: opening PATH replays that file into PATH and deletes
it, and writing PATH deletes it. A whole database under that name (a store someone named `runs.duckdb.wal`, another
program's file) would be lost, so tokview opens no PATH beside one, and names no store so. A leaf module (DuckDB's
import costs a command's start-up ~50 ms): every command checks its --db with it before anything is made.
"""

from __future__ import annotations

import os
from pathlib import Path

DUCKDB_MAGIC = b"DUCK"
"""Bytes 8-12 of a DuckDB database file."""


def database_as_log(path: str | Path) -> Path | None:
    """`PATH.wal` when it is a whole DuckDB database (which opening PATH would delete), else None. PATH through its
    links, as the store attaches it: DuckDB keeps the log beside the file a link points to."""
    log = Path(os.path.realpath(os.path.expanduser(str(path))) + ".wal")
    try:
        with open(log, "rb") as f:
            head = f.read(12)
    except OSError:
        return None  # none (the common case), or unreadable: DuckDB's own error says why
    return log if head[8:12] == DUCKDB_MAGIC else None


def log_refusal(path: str | Path, log: Path) -> str:
    """Why PATH is not opened: the words every command says."""
    return (
        f"{log} is a whole DuckDB database, where DuckDB keeps {path}'s write-ahead log: opening {path} would delete "
        "it. Move or rename it first"
    )
