"""The Parquet export's data file: written by DuckDB's own Parquet writer from the exported samples' ids,
not row by row (the columns and their SQL live in `store/export_rows.py`)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from tokview.export.output import Plan, open_stream
from tokview.store import Store, export_rows

if TYPE_CHECKING:
    from tokview.export.registry import ProfileOf


def write_parquet(
    store: Store, exported: list[tuple[str, str]], plan: Plan, _profile_of: ProfileOf | None = None
) -> None:
    """The speculators columns plus tokview's review columns, for (sample_id, row id) in export order.

    The `id` column is the same `{prompt}[#turn]_gen{gen_index}` as the JSONL rows'. A stream target
    (-, FIFO) gets the file's bytes once DuckDB has written it to a temp file.
    """
    tmp = plan.data.temp if plan.data else None
    spill = None
    if tmp is None:
        fd, name = tempfile.mkstemp(prefix=".tokview-export.", suffix=".parquet.partial")
        os.close(fd)
        spill = tmp = Path(name)
    try:
        export_rows.write_parquet(store, [e[0] for e in exported], [e[1] for e in exported], tmp)
        if spill is not None:
            with open(spill, "rb") as src, open_stream(plan) as dst:
                shutil.copyfileobj(src, dst)
    finally:
        if spill is not None:
            spill.unlink(missing_ok=True)
