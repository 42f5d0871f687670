"""Crash-safe parts: how many writers feed one store without holding its DuckDB file.

DuckDB lets one process at a time open a file for writing. If a batch kept it open for hours,
nobody could review the run while it fills and no second batch could feed the store. So writers
never write samples into the database directly: each group of finished samples (and failures)
becomes one part file beside the store (`STORE.parts/`), and any tokview process that opens the
store ingests the complete parts in one short transaction (the batch does it every second or so).

A part is JSON lines, written under a temporary name and renamed when complete: a kill at any
moment leaves either a whole part or a `.tmp` file that is ignored (and removed once stale). The
ingest is idempotent (a sample id already stored is skipped), so a part that was ingested but not
yet deleted when a process died is harmless. JSON lines because DuckDB parses them in C++
(`read_json`): binding 4,000-id lists through Python parameters costs ~1.5 ms a sample; this ~0.1 ms.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson

SAMPLES_SUFFIX = ".samples.jsonl"
FAILURES_SUFFIX = ".failures.jsonl"
STALE_TMP_S = 3600.0
"""A `.tmp` part older than this belongs to a dead writer: removed at the next ingest."""
_counter = itertools.count()


def parts_dir(db_path: str | Path) -> Path:
    return Path(str(db_path) + ".parts")


def _default(value: Any) -> Any:
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def dumps_lines(records: Iterable[dict[str, Any]]) -> bytes:
    return b"".join(
        orjson.dumps(r, default=_default, option=orjson.OPT_NAIVE_UTC | orjson.OPT_SERIALIZE_NUMPY) + b"\n"
        for r in records
    )


def write_part(
    directory: Path, suffix: str, records: Sequence[dict[str, Any] | bytes], *, durable: bool = False
) -> Path | None:
    """Write one complete part atomically; None when there is nothing to write.

    Raises OSError (ENOSPC on a full disk) with nothing left behind but a `.tmp` file."""
    if not records:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    name = f"part-{time.time_ns():020d}-{os.getpid()}-{next(_counter):06d}{suffix}"
    tmp = directory / (name + ".tmp")
    data = b"".join(r if isinstance(r, bytes) else dumps_lines([r]) for r in records)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, directory / name)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    return directory / name


def complete_parts(directory: Path) -> tuple[list[Path], list[Path]]:
    """(sample parts, failure parts), oldest first; stale temporary files are removed on the way."""
    if not directory.is_dir():
        return [], []
    samples, failures = [], []
    now = time.time()
    for entry in os.scandir(directory):
        name = entry.name
        if name.endswith(".tmp"):
            try:
                if now - entry.stat().st_mtime > STALE_TMP_S:
                    os.unlink(entry.path)
            except OSError:
                pass
        elif name.endswith(SAMPLES_SUFFIX):
            samples.append(Path(entry.path))
        elif name.endswith(FAILURES_SUFFIX):
            failures.append(Path(entry.path))
    return sorted(samples), sorted(failures)


DAMAGED_DIR = "damaged"
"""Where a part that is not whole JSON lines is moved (beside the others, never landed or deleted)."""


def salvage(paths: Iterable[Path]) -> tuple[int, int]:
    """Set aside every part that is not whole JSON lines, keeping its whole lines as a new part.

    A part is renamed only when complete, but without an fsync (a run's parts would cost one each),
    so after a power loss a file system may leave one cut short or full of NULs; DuckDB then refuses
    every landing, and the store could not be opened by anyone. Returns (parts set aside, lines kept
    from them); the originals go to `<parts>/damaged/` for a person to look at."""
    damaged = kept = 0
    for path in paths:
        try:
            lines = path.read_bytes().splitlines()
        except FileNotFoundError:
            continue
        good: list[bytes] = []
        for line in lines:
            try:
                if isinstance(orjson.loads(line), dict):
                    good.append(line + b"\n")
            except orjson.JSONDecodeError:
                pass
        if len(good) == len(lines):
            continue
        suffix = SAMPLES_SUFFIX if path.name.endswith(SAMPLES_SUFFIX) else FAILURES_SUFFIX
        write_part(path.parent, suffix, good, durable=True)
        aside = path.parent / DAMAGED_DIR
        aside.mkdir(exist_ok=True)
        try:
            os.replace(path, aside / path.name)
        except FileNotFoundError:  # another process landed or set it aside meanwhile
            continue
        damaged += 1
        kept += len(good)
    return damaged, kept


def remove(paths: Iterable[Path]) -> None:
    for path in paths:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def sql_list(paths: list[Path]) -> str:
    """The paths as a DuckDB list literal (table functions take no bound parameters)."""
    return "[" + ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths) + "]"
