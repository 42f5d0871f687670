"""Small JSON-object cache files in the tokview cache folder, shared by processes that may run at once.

Each is read whole and replaced whole (`os.replace`), so a reader never sees half a file; two writers at
once may lose one entry, which only means it is computed again. A home that cannot be written leaves the
cache alone: the value is then computed each time.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def cache_folder() -> Path:
    """tokview's cache folder: `$TOKVIEW_CACHE`, else ~/.cache/tokview."""
    return Path(os.environ.get("TOKVIEW_CACHE") or Path.home() / ".cache" / "tokview").expanduser()


def read_json_cache(path: Path) -> dict[str, Any]:
    """A JSON object cache file; {} when it is missing, unreadable or not an object."""
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def write_json_cache(path: Path, known: dict[str, Any]) -> None:
    """Replace the cache file whole; a home that cannot be written is left alone."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known))
        os.replace(tmp, path)
    except OSError:
        pass
