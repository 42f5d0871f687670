"""Small JSON-object cache files in the tokview cache folder, shared by processes that may run at once.

Each is read whole and replaced whole (`os.replace` of a uniquely named temporary file), so a reader never sees
half a file; two writers at once may lose one entry, which only means it is computed again. A home that cannot
be written, or none at all (a user id with no passwd entry, as in some containers), leaves the cache alone: the
value is then computed each time. What must live on disk (the built Kimi and GLM layouts) asks `cache_folder`,
which says in one line how to name a folder when there is no home.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from tokview.errors import UserError


class NoCacheFolder(UserError):
    """Neither `$TOKVIEW_CACHE` nor a home folder: nowhere to build or keep tokview's cached files."""


def home_expanded(value: str, variable: str, error: type[UserError] = UserError) -> Path:
    """A path an environment variable names, `~` and `~user` expanded; a user with no home is `error`, one line
    naming the variable (Python's RuntimeError ended the command as tokview's own bug)."""
    try:
        return Path(value).expanduser()
    except RuntimeError:
        raise error(f"{variable}={value!r}: that user has no home folder") from None


def build_folder(out_dir: Path, prefix: str) -> Path:
    """A new temporary folder beside `out_dir` (its parents made) to build a cached tokenizer layout in, renamed into
    place once whole. A cache that cannot be written (a read-only home, a file named as the folder) is one line
    naming TOKVIEW_CACHE: it ended every command that needs a built-in tokenizer as tokview's own bug."""
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=prefix, dir=out_dir.parent))
    except OSError as exc:
        raise NoCacheFolder(
            f"cannot write tokview's cache at {out_dir.parent}: {exc.strerror or exc}; set TOKVIEW_CACHE to a "
            "writable folder"
        ) from None


def cache_folder() -> Path:
    """tokview's cache folder: `$TOKVIEW_CACHE`, else ~/.cache/tokview. Raises NoCacheFolder without either."""
    named = os.environ.get("TOKVIEW_CACHE")
    if named:
        return home_expanded(named, "TOKVIEW_CACHE", NoCacheFolder)  # an optional cache then goes without
    try:
        home = Path.home()
    except RuntimeError:  # no HOME and no passwd entry for this user id
        raise NoCacheFolder(
            "no home folder to keep tokview's cache in (~/.cache/tokview): set TOKVIEW_CACHE to a writable folder"
        ) from None
    return home / ".cache" / "tokview"


def cache_path(name: str) -> Path | None:
    """A cache file's path in the cache folder; None when there is no cache folder (nothing is cached)."""
    try:
        return cache_folder() / name
    except NoCacheFolder:
        return None


def read_json_cache(path: Path | None) -> dict[str, Any]:
    """A JSON object cache file; {} when there is none, or it is unreadable, malformed or not an object."""
    if path is None:
        return {}
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):  # RecursionError: a file of nested brackets
        return {}
    return known if isinstance(known, dict) else {}


def cache_writable(path: Path | None) -> bool:
    """Whether `write_json_cache` can keep `path` (its folder exists or can be made, and may be written)."""
    if path is None:
        return False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(path.parent, os.W_OK | os.X_OK) and (not path.exists() or os.access(path, os.W_OK))


def write_json_cache(path: Path | None, known: dict[str, Any]) -> None:
    """Replace the cache file whole; a home that cannot be written is left alone (no temporary file left)."""
    if path is not None:
        write_cache_file(path, json.dumps(known).encode())


def write_cache_file(path: Path, data: bytes) -> bool:
    """Replace a cache file whole with `data`; False (and no temporary file left) when it cannot be written."""
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        tmp = None
        return True
    except OSError:
        return False
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
