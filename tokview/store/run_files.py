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
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokview.store.errors import StoreFull, StoreHeld
from tokview.store.parts import DAMAGED_DIR

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


def land_run_files(store: Store, say: Callable[[str], None]) -> None:
    """Record each kept run that has no row yet, then remove its file (a run already recorded keeps its row). A file
    that cannot be recorded (not one this tokview wrote, a field it does not take) is set aside in `damaged/` and
    said: it kept every writable open of the store from landing its parts, or from opening at all."""
    try:
        kept = sorted(p for p in store.parts_dir.iterdir() if p.name.startswith(PREFIX) and p.name.endswith(SUFFIX))
    except OSError:  # no parts folder
        return
    for path in kept:
        if not path.is_file():  # a FIFO under that name would block the read
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            run_id, fields = str(data["run_id"]), dict(data["fields"])
            if not store.query("SELECT 1 FROM runs WHERE run_id = ?", [run_id]):
                store.put_run(run_id, **fields)
        except (StoreHeld, StoreFull):  # the store's own trouble: the landing says it, the file waits
            raise
        except Exception as exc:  # any other: this file's, never the store's parts'
            aside = path.parent / DAMAGED_DIR / path.name
            aside.parent.mkdir(exist_ok=True)
            os.replace(path, aside)
            say(
                f"{path.name} in {path.parent} could not be recorded ({type(exc).__name__}: {exc}): set aside in {aside}"
            )
            continue
        path.unlink(missing_ok=True)
