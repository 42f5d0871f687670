"""A new store's file copied from a kept blank one, instead of made by DuckDB and the schema's DDL each time.

Why: a one-prompt `tokview batch` into a new store waited for its landing child, which made the store's file
before anything else (`batch.landing_process.make_spare`): DuckDB's connect, the ~30 migrations' DDL, a checkpoint
and a close came to ~60-90 ms of a ~0.5 s run on 2 cores. An empty store is the same schema every time, so the
first one made is kept in tokview's cache (`store-blanks/`), and later ones are a copy of its ~0.5 MB (~2 ms).

What keeps a copy exactly a new store:
- The blank is named by what decides its content: the schema's creation script and DuckDB's version. Another
  schema or another DuckDB makes (and keeps) its own; an old blank is never opened by a newer DuckDB.
- Its name also carries its bytes' sha256, checked on every copy: a damaged or edited blank is not copied (the
  store is then made by DuckDB, as without one). Only a regular file of a sane size is read (a FIFO put there hung
  the batch).
- Each copy gets a database identifier of its own, as each file DuckDB makes does. DuckDB checks a write-ahead log
  against it: copies sharing the blank's had one store's log replayed silently into another put in its place
  (`rm a.duckdb; mv b.duckdb a.duckdb` with `a.duckdb.wal` left), where DuckDB refuses a log that is not the
  file's. The identifier is 16 random bytes of the file's main header, which a checksum covers; a blank is kept
  only once this DuckDB's own files show that layout (`_copies_work`: a second, empty file made beside it differs
  from it in exactly the checksum and those bytes, both checksums are as computed here, and a copy so made is
  written, checkpointed and read back), else nothing is kept and every store is made by DuckDB.
- `schema_version.applied_at` says when the blank was made; `restamp` makes it the copy's own time.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import struct
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tokview.core.json_cache import cache_path

if TYPE_CHECKING:
    from tokview.store import Store

FOLDER = "store-blanks"
KEPT = 4
"""Blanks kept at most (other schemas or DuckDB versions, several tokview installs sharing a cache): the oldest go."""
MAX_BYTES = 64 * 1024 * 1024
HEADER = 4096
"""DuckDB's main header block: an 8-byte checksum of the rest of the block, then the header."""
IDENTIFIER = range(124, 140)
"""Where the main header holds the database identifier (DuckDB 1.4-2.x), checked per DuckDB by `_copies_work`."""


def blank_key() -> str:
    """What a blank's content follows from: the schema's creation script and the DuckDB that runs it."""
    import duckdb

    from tokview.store.schema import creation_script

    named = json.dumps([duckdb.__version__, creation_script()])
    return hashlib.sha256(named.encode()).hexdigest()[:24]


def copy_blank(dest: Path) -> bool:
    """Write a kept blank's bytes, with an identifier of its own, to the new file `dest` (which must not exist),
    durable before it returns. False, leaving no `dest`, when there is no blank whose bytes match its name, or the
    copy failed."""
    folder = cache_path(FOLDER)
    data = None if folder is None else _valid_blank(folder, blank_key())
    if data is None:
        return False
    try:
        _write_new(dest, _with_new_identifier(data))
    except OSError:
        return False
    return True


def keep_blank(made: Path) -> None:
    """Keep the store file DuckDB has just made (checkpointed and closed, no log) as the blank for later ones,
    unless a valid one is kept already. A cache that cannot be written, or any other failure, leaves things as they
    were (keeping a blank is only a speed-up, never the run's error): the next store is made by DuckDB again."""
    folder = cache_path(FOLDER)
    if folder is None or folder.is_symlink():  # pruning it would remove files in whatever folder it names
        return
    try:
        key = blank_key()
        if folder.is_dir() and _valid_blank(folder, key) is not None:
            return
        data = made.read_bytes()
        folder.mkdir(parents=True, exist_ok=True)
        if not _copies_work(data, folder):
            return
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".blank-")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(tmp, folder / _name(key, data))  # whole or absent: a reader checks the bytes against the name
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _prune(folder)
    except Exception:  # DuckDB's own errors (a full or unlockable cache) are no OSError
        pass


def restamp(store: Store) -> None:
    """Date a new store's schema rows now: a copy's said when its blank was made."""
    store.execute("UPDATE schema_version SET applied_at = now()")


def _valid_blank(folder: Path, key: str) -> bytes | None:
    """The bytes of a blank of this key that match their name; a damaged one met on the way is removed (kept, it
    would stop a good one from being kept)."""
    try:
        names = sorted(n for n in os.listdir(folder) if n.startswith(f"{key}-") and n.endswith(".duckdb"))
    except OSError:
        return None
    for name in names:
        data = _read_regular(folder / name)
        if data is not None and name == _name(key, data) and _checksum_holds(data):
            return data
        if not (folder / name).is_dir():
            (folder / name).unlink(missing_ok=True)
    return None


def _name(key: str, data: bytes) -> str:
    return f"{key}-{hashlib.sha256(data).hexdigest()[:32]}.duckdb"


def _read_regular(path: Path) -> bytes | None:
    """The file's bytes when it is a regular file no larger than MAX_BYTES; None otherwise or on any error."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once instead of waiting for a writer
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_BYTES:
            return None
        with os.fdopen(os.dup(fd), "rb") as src:
            return src.read(MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)


def _checksum(header: bytes) -> int:
    """DuckDB's checksum of a main header block: 5381, xor-ed with each 8-byte word times a constant (mod 2**64)."""
    result = 5381
    for (word,) in struct.iter_unpack("<Q", header[8:HEADER]):
        result ^= (word * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    return result


def _checksum_holds(data: bytes) -> bool:
    return len(data) >= HEADER and data[8:12] == b"DUCK" and int.from_bytes(data[:8], "little") == _checksum(data)


def _copies_work(data: bytes, folder: Path) -> bool:
    """Whether this DuckDB's files hold the identifier where `_with_new_identifier` writes it (an empty file made
    now differs from `data` in its main header exactly in the checksum and some of those 16 bytes), and a copy so
    made opens, is written, checkpointed and opened again."""
    import duckdb

    with tempfile.TemporaryDirectory(dir=folder, prefix=".layout-") as scratch:
        other = Path(scratch) / "empty.duckdb"
        duckdb.connect(str(other)).close()
        fresh = other.read_bytes()
        if not (_checksum_holds(data) and _checksum_holds(fresh)):
            return False
        differ = {i for i in range(8, HEADER) if data[i] != fresh[i]}
        if not differ or not differ <= set(IDENTIFIER):
            return False
        copy = Path(scratch) / "copy.duckdb"
        _write_new(copy, _with_new_identifier(data))
        with duckdb.connect(str(copy)) as conn:
            conn.execute("CREATE TABLE probe AS SELECT 1 AS x")
            conn.execute("CHECKPOINT")
        with duckdb.connect(str(copy), read_only=True) as conn:
            return conn.execute("SELECT count(*) FROM probe").fetchall() == [(1,)]


def _with_new_identifier(data: bytes) -> bytes:
    """`data` with a random database identifier and the main header's checksum made again."""
    header = bytearray(data[:HEADER])
    header[IDENTIFIER.start : IDENTIFIER.stop] = os.urandom(len(IDENTIFIER))
    header[:8] = _checksum(bytes(header)).to_bytes(8, "little")
    return bytes(header) + data[HEADER:]


def _prune(folder: Path) -> None:
    """Keep the newest blank of each key (batches starting at once each keep one), of the KEPT newest keys; remove
    what a killed writer left (older than an hour)."""
    try:
        entries = [(e.stat(follow_symlinks=False).st_mtime, e.name) for e in os.scandir(folder)]
    except OSError:
        return
    newest: dict[str, tuple[float, str]] = {}
    for mtime, name in sorted(entries):
        if name.endswith(".duckdb") and not name.startswith("."):
            newest[name.split("-", 1)[0]] = (mtime, name)
    kept = {name for _, name in sorted(newest.values())[-KEPT:]}
    gone = [n for _, n in entries if n.endswith(".duckdb") and not n.startswith(".") and n not in kept]
    stale = [n for m, n in entries if n.startswith((".blank-", ".layout-")) and m < time.time() - 3600]
    for name in gone + stale:
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


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
