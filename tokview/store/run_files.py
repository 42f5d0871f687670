"""A run's provenance row kept as a file beside the parts, for a writer that could not open the store to record it.

Why: `tokview proxy` started on a store another program held (`proxy/late_store.py`) records its run when a landing
first opens the store. When the store was still held as the proxy stopped, its answers stayed in parts and the next
command landed them with no `runs` row: the run's settings, profile, tokenizer and servers were gone. The row's
fields are written here at start instead (`run-<id>.json`, whole or not at all: a temporary name renamed), and any
landing records a run that has no row yet before it lands the parts (`Store.ingest`), then removes the file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokview.store.store import Store

PREFIX, SUFFIX = "run-", ".json"


def write_run_file(parts_dir: Path, run_id: str, fields: dict[str, Any]) -> Path:
    """`Store.put_run(run_id, **fields)` kept as a file in `parts_dir` (made when missing)."""
    parts_dir.mkdir(parents=True, exist_ok=True)
    path = parts_dir / f"{PREFIX}{run_id}{SUFFIX}"
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps({"run_id": run_id, "fields": fields}), encoding="utf-8")
    os.replace(temporary, path)
    return path


def land_run_files(store: Store) -> None:
    """Record each kept run that has no row yet, then remove its file (a run already recorded keeps its row)."""
    try:
        kept = sorted(p for p in store.parts_dir.iterdir() if p.name.startswith(PREFIX) and p.name.endswith(SUFFIX))
    except OSError:  # no parts folder
        return
    for path in kept:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            run_id, fields = str(data["run_id"]), dict(data["fields"])
        except (OSError, ValueError, KeyError, TypeError):  # not one this module wrote: left alone
            continue
        if store.run(run_id) is None:
            store.put_run(run_id, **fields)
        path.unlink(missing_ok=True)
