"""The `--db` flag: declared once (its default is the store's one default name), checked once for every
reading command.

A folder, a missing file and a store are told apart here, in the same words everywhere: a user who
gives `--db runs/` learns it is a directory, not that the database is missing."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from tokview.commands.once import GivenOnce
from tokview.default_store import DEFAULT_DB
from tokview.errors import UserError
from tokview.store_log import database_as_log, log_refusal


def store_path(text: str) -> str:
    """An argparse type for a store's path: an empty one is refused (DuckDB opens "" as a throwaway in-memory
    database, so a run "into" it reported success and kept nothing)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path: give the store's .duckdb file")
    if text.endswith(("/", os.sep)):  # DuckDB made a file named like the folder ("runs/" -> runs)
        raise argparse.ArgumentTypeError(
            f"{text} names a folder: give the store's .duckdb file (e.g. {text}{DEFAULT_DB})"
        )
    if text.endswith(".wal"):  # DuckDB's write-ahead log of the store named without it: written over, then deleted
        raise argparse.ArgumentTypeError(
            f"{text} is named as DuckDB names a store's write-ahead log (it deletes {text} once it writes "
            f"{text.removesuffix('.wal') or 'that store'}): give the store a name that does not end in .wal"
        )
    folder = os.path.realpath(os.path.dirname(os.path.abspath(os.path.expanduser(text))))
    if folder.endswith(".parts") and _is_store(folder.removesuffix(".parts")):  # another store's parts folder
        raise argparse.ArgumentTypeError(f"{text} is inside a store's parts folder: put the store elsewhere")
    return text


def add_db_argument(parser: argparse.ArgumentParser, what: str = "DuckDB store") -> None:
    """`--db PATH`, defaulting to the store's default name (`what` starts its help line)."""
    parser.add_argument(
        "--db", default=DEFAULT_DB, type=store_path, action=GivenOnce, help=f"{what} (default: ./{DEFAULT_DB})"
    )


def existing_store(db: str | Path) -> Path:
    """`db` as a Path when it is a file; a one-line UserError when it is a folder or absent."""
    path = Path(db)
    creatable_store(db)  # a folder: named so, not "not found"
    if not path.is_file():
        raise UserError(f"database not found: {db} (pass --db PATH)")
    return path


def creatable_store(db: str | Path, flag: str = "--db") -> None:
    """For a command that creates the store when it is missing: a one-line UserError when `db` is a folder (DuckDB
    said "IO Error: Could not read from file …: Is a directory"). `flag`: the option that named it."""
    if Path(db).expanduser().is_dir():
        raise UserError(f"{flag} {db} is a directory, not a store: name its .duckdb file")
    log = database_as_log(db)  # before anything is made beside it (a run's parts, a new store)
    if log is not None:
        raise UserError(log_refusal(db, log))


def run_name(text: str) -> str:
    """An argparse type for `--run NAME`: an empty (or blank) name is refused (a batch stored its samples under the
    run "", and an export of it read as no --run at all)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty run name: give the run's name (tokview stats --by run lists them)")
    return text


def _is_store(path: str) -> bool:
    """Whether `path` is a DuckDB file (a store whose parts folder is beside it)."""
    from tokview.store.connection import is_duckdb_file

    return os.path.isfile(path) and is_duckdb_file(Path(path))
