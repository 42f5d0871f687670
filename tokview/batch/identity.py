"""The tokenizer's vocabulary fingerprint, remembered by the hash of its files.

Sample ids include the vocabulary fingerprint (see `served_identity`), and computing it sorts and
hashes the whole id → token table: ~0.6 s for Kimi's 163,840 entries, paid before the first
request of every run. The files' own hash (`fingerprint()`, a few ms) decides whether a stored
answer still holds, so an edited tokenizer folder is fingerprinted again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def cache_file() -> Path:
    base = Path(os.environ.get("TOKVIEW_CACHE") or Path.home() / ".cache" / "tokview")
    return base / "vocab-fingerprints.json"


def vocab_fingerprint(tokenizer: Any) -> str:
    """`tokenizer.vocab_fingerprint()`, read from the cache when the tokenizer files are unchanged."""
    if getattr(tokenizer, "source", None) is None:
        return tokenizer.vocab_fingerprint()
    key = tokenizer.fingerprint()
    path = cache_file()
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if isinstance(known, dict) and isinstance(known.get(key), str):
        return known[key]
    value = tokenizer.vocab_fingerprint()
    try:
        known = known if isinstance(known, dict) else {}
        known[key] = value
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: compute it each time
    return value
