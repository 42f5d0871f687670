"""A new store's file copied from a kept blank one, instead of made by DuckDB and the schema's DDL each time.

Why: a one-prompt `tokview batch` into a new store waited for its landing child, which made the store's file
before anything else (`batch.landing_process.make_spare`): DuckDB's connect, the ~30 migrations' DDL, a checkpoint
and a close came to ~60-90 ms of a ~0.5 s run on 2 cores. An empty store is the same schema every time, so the
first one made is kept in tokview's cache (`store-blanks/`), and later ones are a copy of its ~0.5 MB (~2 ms).

What keeps a copy exactly a new store:
- The blank is named by what decides its content: the schema's creation script and DuckDB's version. Another
  schema or another DuckDB makes (and keeps) its own; an old blank is never opened by a newer DuckDB.
- Its name also carries its bytes' sha256, checked on every copy: a damaged or edited blank is not copied (the
  store is then made by DuckDB, as without one).
- Every copy shares the blank's DuckDB database identifier, which is what DuckDB checks a write-ahead log against.
  So a copy is never put where a `.wal` is left (a store deleted without its log): DuckDB would replay that other
  store's log into it, where a store it makes itself ignores the log (`landing_process.take_spare`).
- `schema_version.applied_at` says when the blank was made; `restamp` makes it the copy's own time.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from tokview.core.json_cache import cache_path

if TYPE_CHECKING:
    from tokview.store import Store

FOLDER = "store-blanks"


def blank_key() -> str:
    """What a blank's content follows from: the schema's creation script and the DuckDB that runs it."""
    import duckdb

    from tokview.store.schema import creation_script

    named = json.dumps([duckdb.__version__, creation_script()])
    return hashlib.sha256(named.encode()).hexdigest()[:24]


def copy_blank(dest: Path) -> bool:
    """Write a kept blank's bytes to the new file `dest` (which must not exist), durable before it returns. False,
    leaving no `dest`, when there is no blank whose bytes match its name, or the copy failed."""
    folder = cache_path(FOLDER)
    if folder is None:
        return False
    key = blank_key()
    try:
        names = sorted(n for n in os.listdir(folder) if n.startswith(f"{key}-") and n.endswith(".duckdb"))
    except OSError:
        return False
    for name in names:
        try:
            data = (folder / name).read_bytes()
        except OSError:
            continue
        if name != _name(key, data):
            continue
        try:
            _write_new(dest, data)
        except OSError:
            return False
        return True
    return False


def keep_blank(made: Path) -> None:
    """Keep the store file DuckDB has just made (checkpointed and closed, no log) as the blank for later ones. A
    cache that cannot be written leaves things as they were: the next store is made by DuckDB again."""
    folder = cache_path(FOLDER)
    if folder is None:
        return
    try:
        data = made.read_bytes()
        target = folder / _name(blank_key(), data)
        if target.exists():
            return
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".blank-")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(tmp, target)  # whole or absent: a reader checks the bytes against the name anyway
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        pass


def restamp(store: Store) -> None:
    """Date a new store's schema rows now: a copy's said when its blank was made."""
    store.execute("UPDATE schema_version SET applied_at = now()")


def _name(key: str, data: bytes) -> str:
    return f"{key}-{hashlib.sha256(data).hexdigest()[:32]}.duckdb"


def _write_new(dest: Path, data: bytes) -> None:
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # as DuckDB makes its files: the umask decides
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())  # as durable as DuckDB's own checkpointed file before it is linked into place
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
