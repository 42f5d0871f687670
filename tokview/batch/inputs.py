"""Prompt files in, prompt rows out: JSONL or Parquet, every shape `tokview.core.prompts` reads.

A row that is not valid JSON or not a known shape is reported with its line number (Parquet: its
row number) and either skipped or made fatal (`--on-bad-row skip|stop`), so one bad line in a
million never silently shifts what was generated.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from tokview.core.prompts import PromptError, PromptRow, iter_jsonl, parse_row

PARQUET_SUFFIXES = (".parquet", ".pq")


class InputError(ValueError):
    """The prompts file cannot be read, or a bad row with `--on-bad-row stop`."""


def is_parquet(path: Path) -> bool:
    return path.suffix.lower() in PARQUET_SUFFIXES


def iter_rows(path: str | Path) -> Iterator[tuple[int, Any]]:
    """(line or row number, parsed row) of a JSONL or Parquet file, chosen by its suffix.

    The one reader for every command that takes a dataset (batch prompts, audit): a JSONL line that
    is not JSON comes back as a `PromptError` in place of the row, so callers report it and go on.
    """
    path = Path(path)
    return iter_parquet(path) if is_parquet(path) else iter_jsonl(path)


def iter_parquet(path: Path) -> Iterator[tuple[int, Any]]:
    """Rows of a Parquet file as dicts, numbered from 1; a JSON-string `messages` column is parsed."""
    import duckdb  # DuckDB's own Parquet reader: no pyarrow needed

    con = duckdb.connect()
    try:
        cur = con.execute("SELECT * FROM read_parquet(?)", [str(path)])
    except duckdb.Error as exc:
        raise InputError(f"cannot read {path} as Parquet: {str(exc).splitlines()[0]}") from None
    names = [d[0] for d in cur.description]
    n = 0
    while batch := cur.fetchmany(1000):
        for values in batch:
            n += 1
            row = dict(zip(names, values))
            for key in ("messages", "conversations"):  # a JSON string column holding the turns
                if isinstance(row.get(key), str) and row[key].lstrip().startswith("["):
                    try:
                        row[key] = json.loads(row[key])
                    except json.JSONDecodeError:
                        pass
            yield n, row
    con.close()


def read_prompts(path: str | Path, *, on_bad_row: str = "skip", limit: int | None = None
                 ) -> tuple[list[PromptRow], list[str]]:
    """(good rows, one message per bad row). With on_bad_row="stop" the first bad row raises."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"prompts file not found: {path}")
    rows: list[PromptRow] = []
    bad: list[str] = []
    source = iter_rows(path)
    label = "row" if is_parquet(path) else "line"
    try:
        for n, obj in source:
            if limit is not None and len(rows) + len(bad) >= limit:
                break
            try:
                if isinstance(obj, PromptError):
                    raise obj
                rows.append(parse_row(obj, line=n))
            except PromptError as exc:
                message = str(exc)
                if not message.startswith(("line ", "row ")):
                    message = f"{label} {n}: {message}"
                elif label == "row":
                    message = message.replace("line ", "row ", 1)
                if on_bad_row == "stop":
                    raise InputError(f"{path}: {message} (use --on-bad-row skip to skip bad rows)") from None
                bad.append(message)
    except UnicodeDecodeError:
        raise InputError(f"{path} is not UTF-8 text (JSONL expected; Parquet files need a .parquet name)") from None
    return rows, bad
