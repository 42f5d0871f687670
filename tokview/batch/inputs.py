"""Prompt files in, prompt rows out: JSONL or Parquet, every shape `tokview.core.prompts` reads.

A row that is not valid JSON, not a known shape, or holds something a server or the store would
choke on later (a number or an object as message content, a lone UTF-16 surrogate, a control
character in its id, an id already used by a different conversation) is reported with its line
number (Parquet: its row number) and either skipped or made fatal (`--on-bad-row skip|stop`), so one
bad line in a million never silently shifts what was generated, nor turns into a puzzling error
deep inside the chat template.
"""

from __future__ import annotations

import json
import os
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tokview.core.prompts import REASONING_KEYS, PromptError, PromptRow, iter_jsonl, parse_row
from tokview.core.record import canonical_hash
from tokview.errors import TokviewError, first_line

PARQUET_SUFFIXES = (".parquet", ".pq")


class InputError(TokviewError):
    """The prompts file cannot be read, or a bad row with `--on-bad-row stop`."""

    title = "input"


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
        raise InputError(f"cannot read {path} as Parquet: {first_line(exc)}") from None
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


def check_row(raw: dict[str, Any], where: str) -> None:
    """What `parse_row` lets through but a template, a tokenizer or `tokview show` cannot take.

    Raised here, with the line number, instead of as `'int' object is not iterable` from the chat
    template, a `TextEncodeInput` TypeError from the tokenizer, or an empty prompt stored as a good
    sample (an object as content renders as nothing).
    """
    rid = raw.get("id")
    if rid is not None:
        if isinstance(rid, bool) or not isinstance(rid, (str, int)):
            raise PromptError(f"{where}: `id` must be a string or a whole number, not {_kind(rid)}")
        bad = next((c for c in str(rid) if unicodedata.category(c) in ("Cc", "Cs")), None)
        if bad is not None:
            raise PromptError(
                f"{where}: `id` holds the control character U+{ord(bad):04X}: "
                f"a sample id must be printable to be addressed by `tokview show`"
            )
    turns = raw.get("messages") if isinstance(raw.get("messages"), list) else raw.get("conversations")
    for k, turn in enumerate(turns if isinstance(turns, list) else []):
        if not isinstance(turn, dict):
            continue  # parse_row says so
        here = f"{where}: turn {k + 1}"
        key = "value" if ("from" in turn or "value" in turn) else "content"
        _check_content(turn.get(key), f"{here} `{key}`")
        for rkey in REASONING_KEYS:
            value = turn.get(rkey)
            if value is not None and not isinstance(value, str):
                raise PromptError(f"{here} `{rkey}` must be a string, not {_kind(value)}")
    for key in ("id", "messages", "conversations", "prompt", "system"):  # what becomes the prompt or its id
        _check_text(raw.get(key), where)


def _check_content(content: Any, here: str) -> None:
    if content is None or isinstance(content, str):
        return
    if isinstance(content, list):  # OpenAI content parts: text parts only
        for j, part in enumerate(content, start=1):
            if not isinstance(part, dict):
                raise PromptError(
                    f'{here}: part {j} is {_kind(part)}, expected an object like {{"type": "text", "text": "..."}}'
                )
            if not isinstance(part.get("text"), str):
                kind = part.get("type", "untyped")
                raise PromptError(
                    f"{here}: part {j} ({kind}) has no text string: only text parts are "
                    f"supported, and dropping the others would change the prompt"
                )
        return
    raise PromptError(f"{here} must be a string or a list of text parts, not {_kind(content)}")


def _check_text(value: Any, where: str) -> None:
    """Every string must encode as UTF-8: a lone surrogate (`\\ud800` in JSON) cannot be tokenized."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise PromptError(
                f"{where}: a lone UTF-16 surrogate U+{ord(value[exc.start]):04X} "
                f"(an unpaired \\u escape) cannot be tokenized"
            ) from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_text(k, where)
            _check_text(v, where)
    elif isinstance(value, list):
        for v in value:
            _check_text(v, where)


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", bool: "true/false", int: "a number", float: "a number"}
    return names.get(type(value), type(value).__name__)


def parse_checked(obj: Any, n: int, label: str = "line") -> PromptRow:
    """`parse_row` plus `check_row`: the prompt row, or a PromptError that names the line."""
    if isinstance(obj, PromptError):
        raise obj
    if isinstance(obj, dict):
        check_row(obj, f"line {n}")
    return parse_row(obj, line=n)


def read_prompts(
    path: str | Path, *, on_bad_row: str = "skip", limit: int | None = None
) -> tuple[list[PromptRow], list[str]]:
    """(good rows, one message per bad row). With on_bad_row="stop" the first bad row raises.

    A row whose id an earlier row already used for a *different* conversation is a bad row (a
    conflict: which one is meant?); the same id with the same conversation stays a plain duplicate,
    which the planner counts and skips. An empty or blank-only file is an error, not a run of 0.
    """
    path = Path(path)
    if path.is_dir():
        raise InputError(f"prompts file is a directory: {path}")
    if not path.is_file():
        raise InputError(f"prompts file not found: {path}")
    if not os.access(path, os.R_OK):  # read lazily, deep in the run: say it here, in one line
        raise InputError(f"cannot read the prompts file {path}: permission denied")
    rows: list[PromptRow] = []
    bad: list[str] = []
    first_seen: dict[str, tuple[int, str]] = {}  # prompt id -> (line, hash of its conversation)
    label = "row" if is_parquet(path) else "line"
    try:
        for n, obj in iter_rows(path):
            if limit is not None and len(rows) + len(bad) >= limit:
                break
            try:
                row = parse_checked(obj, n)
                digest = canonical_hash(row.messages)
                seen = first_seen.setdefault(row.prompt_id, (n, digest))
                if seen[1] != digest:
                    raise PromptError(
                        f"line {n}: id {row.prompt_id!r} conflicts with {label} {seen[0]}: "
                        f"same id, different conversation (give one of them another id)"
                    )
                rows.append(row)
            except PromptError as exc:
                message = str(exc)
                if not message.startswith(("line ", "row ")):
                    message = f"{label} {n}: {message}"
                elif label == "row":
                    message = message.replace("line ", "row ", 1)
                if on_bad_row == "stop":
                    raise InputError(f"{located(path, message)} (use --on-bad-row skip to skip bad rows)") from None
                bad.append(message)
            del obj
    except UnicodeDecodeError:
        raise InputError(f"{path} is not UTF-8 text (JSONL expected; Parquet files need a .parquet name)") from None
    if not rows and not bad:
        raise InputError(f"{path} holds no prompt rows (the file is empty or has only blank lines)")
    return rows, bad


def located(path: str | Path, message: str) -> str:
    """`line 3: …` as `FILE:3: …`, the form editors and terminals jump to."""
    head, sep, rest = message.partition(": ")
    word, _, number = head.partition(" ")
    if sep and word in ("line", "row") and number.isdigit():
        return f"{path}:{number}: {rest}" if word == "line" else f"{path} row {number}: {rest}"
    return f"{path}: {message}"
