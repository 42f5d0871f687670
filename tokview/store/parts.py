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
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson

from tokview.store.errors import StoreError
from tokview.untrusted_text import storable

SAMPLES_SUFFIX = ".samples.jsonl"
FAILURES_SUFFIX = ".failures.jsonl"
STALE_TMP_S = 3600.0
"""A `.tmp` part older than this belongs to a dead writer: removed at the next ingest."""
_counter = itertools.count()


def parts_dir(db_path: str | Path) -> Path:
    return Path(str(db_path) + ".parts")


def make_store_folder(db_path: str | Path) -> None:
    """Make the folder a store file goes in (and its parts beside it); StoreError naming what is in the way.

    Called by the store before DuckDB opens the file, and by a batch whose new store a child process creates
    (`batch.landing_process`) before it writes its first part, so both say the same thing."""
    from tokview.errors import describe_error
    from tokview.store.errors import StoreError

    try:
        Path(db_path).expanduser().parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # the user's --db names a folder that cannot be made
        raise StoreError(describe_error(exc)) from None


def _default(value: object) -> object:
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


_OPTIONS = orjson.OPT_NAIVE_UTC | orjson.OPT_SERIALIZE_NUMPY


def dumps_lines(records: Iterable[dict[str, Any]]) -> bytes:
    """Records as JSON lines; never fails on text a server sent.

    A lone UTF-16 surrogate (a server's JSON escape `\\ud800`, parsed into a str) cannot be UTF-8, so
    orjson refuses the record, and that exception once killed a batch's writer thread. Such a record is
    written with each lone surrogate as the six characters of its escape (`\\ud800`): what the server's
    body said, readable by a person debugging the server, and never mistaken for real text (a real
    U+FFFD would hide which code unit it was; `untrusted_text.storable`, as for reasons). Everything else
    in the record is kept as it was."""
    out = []
    for r in records:
        try:
            out.append(orjson.dumps(r, default=_default, option=_OPTIONS))
        except orjson.JSONEncodeError:
            out.append(orjson.dumps(_escape_surrogates(r), default=_default, option=_OPTIONS))
        out.append(b"\n")
    return b"".join(out)


def _escape_surrogates(value: object) -> object:
    """`value` with every str (dict keys too) that holds a lone surrogate replaced by its escaped form."""
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, dict):
        return {_escape_surrogates(k): _escape_surrogates(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_escape_surrogates(v) for v in value]
    return value


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


def complete_parts(
    directory: Path, said: Callable[[str], None] | None = None, *, landing: bool = False
) -> tuple[list[Path], list[Path]]:
    """(sample parts, failure parts), oldest first; stale temporary files are removed on the way. `landing`: the
    caller holds the store for writing, so no other process is landing and any other process's landing copy is
    left from a kill (`_of_another_lander`).

    Only regular files this process can read are parts: anything else named like one (a directory, a socket, a
    file of mode 000) is moved to `damaged/` where a person can look at it (left where it is when the folder cannot
    be written), and never listed, so no landing tries to read it: one unreadable part failed every landing, the
    good parts' too. `said` is told each one moved (it went silently)."""
    if not directory.is_dir():
        return [], []
    samples, failures = [], []
    now = time.time()
    try:
        entries = list(os.scandir(directory))
    except OSError as exc:  # a folder this user cannot list (mode 000): its parts are not read, and it is said
        if said is not None:
            said(f"cannot list {directory} ({exc.strerror}): the samples its parts hold are not landed or shown")
        return [], []
    for entry in entries:
        name = entry.name
        if name.endswith(".tmp"):
            try:
                if now - entry.stat().st_mtime > STALE_TMP_S or (landing and _of_another_lander(name)):
                    os.unlink(entry.path)
            except OSError:
                pass
        elif name.endswith((SAMPLES_SUFFIX, FAILURES_SUFFIX)):
            if not _is_regular(entry) or not os.access(entry.path, os.R_OK):  # unreadable: no landing could read it
                what = "is not a file" if not _is_regular(entry) else "cannot be read"
                if _move_aside(Path(entry.path)) and said is not None:
                    said(f"{name} in {directory} {what}: set aside in {directory / DAMAGED_DIR}")
            elif name.endswith(SAMPLES_SUFFIX):
                samples.append(Path(entry.path))
            else:
                failures.append(Path(entry.path))
    return sorted(samples), sorted(failures)


LANDER_COPIES = (".landing-", ".trial-")
"""`.tmp` copies a landing makes of parts (`landing.one_file`, trial landings), named `<prefix><pid>-…`."""


def _of_another_lander(name: str) -> bool:
    """A landing's copy made by another process: read while the store is held for writing, its landing is over (a
    landing holds the store from its copy to its end), so the copy is left from a kill and is removed at once, not
    after `STALE_TMP_S`; the parts it copied are still there. Never by asking whether its pid lives: a process in
    another container sharing the folder has a pid this one cannot see."""
    prefix = next((p for p in LANDER_COPIES if name.startswith(p)), None)
    if prefix is None:
        return False
    pid = name[len(prefix) :].partition("-")[0]
    return pid.isdigit() and int(pid) != os.getpid()


def _is_regular(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file()
    except OSError:
        return False


DAMAGED_DIR = "damaged"
"""Where a part that cannot land is moved (beside the others, never landed or deleted)."""


def _move_aside(path: Path) -> bool:
    """Move `path` into `damaged/` beside it; False when it is gone already or cannot be moved."""
    aside = path.parent / DAMAGED_DIR
    try:
        aside.mkdir(exist_ok=True)
        os.replace(path, aside / path.name)
    except OSError:  # landed or set aside by another process meanwhile, or a read-only folder
        return False
    return True


Lands = Callable[[Path, "list[bytes] | None"], bool]
"""`lands(part, lines)`: whether these lines of the part (None: the file as it is) would land."""


def salvage(paths: Iterable[Path], lands: Lands) -> tuple[int, int]:
    """Set aside every part that cannot land whole, keeping the lines that can as a new part.

    A part is renamed only when complete, but without an fsync (a run's parts would cost one each),
    so after a power loss a file system may leave one cut short or full of NULs; and a line can be
    whole JSON whose values do not fit the table (`"prompt_ids": "oops"`). DuckDB refuses the whole
    landing for one such line, so no part would ever land and no batch could start. `lands` (the
    store's trial landing, rolled back) decides; the lines that land are found by halving, a few
    trials for one bad line among hundreds. Returns (parts set aside, lines kept from them); the
    originals go to `<parts>/damaged/` for a person to look at."""
    damaged = kept = 0
    for path in paths:
        try:
            lines = [line for line in path.read_bytes().splitlines() if line.strip()]
        except OSError:  # landed by another process meanwhile, or unreadable: left for a person
            continue
        candidates = [line for line in lines if _is_object(line)]
        if len(candidates) == len(lines) and lands(path, None):
            continue
        if unwritable(path.parent):
            raise StoreError(
                f"{path.name} in {path.parent} cannot land, and the folder cannot be written to set it aside"
            )
        good = _landing_lines(path, candidates, lands)
        # Set aside first, then keep its good lines: kept first, a part that could not be set aside (`damaged`
        # a file) stayed to block every landing, and each command wrote one more copy of its lines.
        if not _move_aside(path):
            if path.exists():
                raise StoreError(
                    f"{path.name} in {path.parent} cannot land and cannot be set aside into {path.parent / DAMAGED_DIR} "
                    "(is it a folder?): move the part out by hand"
                )
            continue  # landed or set aside by another process meanwhile
        suffix = SAMPLES_SUFFIX if path.name.endswith(SAMPLES_SUFFIX) else FAILURES_SUFFIX
        write_part(path.parent, suffix, [line + b"\n" for line in good], durable=True)
        damaged += 1
        kept += len(good)
    return damaged, kept


def _is_object(line: bytes) -> bool:
    try:
        return isinstance(orjson.loads(line), dict)
    except orjson.JSONDecodeError:
        return False


def _landing_lines(path: Path, lines: list[bytes], lands: Lands) -> list[bytes]:
    """The lines that land, in order: all of them, or those of each half that do."""
    if not lines or lands(path, lines):
        return lines
    if len(lines) == 1:
        return []
    half = len(lines) // 2
    return _landing_lines(path, lines[:half], lands) + _landing_lines(path, lines[half:], lands)


def unwritable(directory: Path) -> str | None:
    """Why parts cannot be landed from `directory` by this user (a landed part is removed, a damaged one moved
    aside), else None."""
    return None if os.access(directory, os.W_OK | os.X_OK) else f"{directory} cannot be written"


def remove(paths: Iterable[Path]) -> None:
    """Remove landed parts. One that cannot be removed (a folder this user cannot write) stays: listed again, its
    samples are stored already (a landing skips their ids) and its failures are in `landed_failure_parts`."""
    for path in paths:
        try:
            path.unlink()
        except OSError:
            pass


def sql_list(paths: list[Path]) -> str:
    """The paths as a DuckDB list literal (table functions take no bound parameters)."""
    return "[" + ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths) + "]"
