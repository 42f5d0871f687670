"""A sample's tool calls as plain text in their own column (`tool_calls_text`), so the search box finds them.

Why a column: the server's `tool_calls` live only in the stored raw body, and a streamed answer's chunks (the
proxy's usual traffic) are stored packed (`packed_chunks.py`), which no SQL reads. An agent-trace reviewer
searching `run_tests` or a path in the arguments found nothing. The column holds one line per call,
`name arguments` as the server sent them, masked as the raw body is; '' when the answer called nothing, NULL
only for rows not filled yet (stores written before schema version 12, filled by the migration, and rows a merge
brings from such a store, filled after it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tokview.core.tool_calls import tool_calls_of_response
from tokview.store.packed_chunks import unpack

if TYPE_CHECKING:  # a batch process writes rows (sample_rows imports this) without loading DuckDB
    from duckdb import DuckDBPyConnection

FILL_BATCH = 500
"""Rows read and written back per round of a fill (bounded memory on a store of a million rows)."""


def tool_calls_text(calls: Sequence[dict[str, Any]] | None) -> str:
    """One line per call, `name arguments` (either may be missing); '' for none."""
    lines = [" ".join(v for v in (call.get("name"), call.get("arguments")) if v) for call in calls or ()]
    return "\n".join(lines)


def body_tool_calls_text(endpoint: str | None, raw_response: str | None, parsed_raw_response: str | None) -> str:
    """`tool_calls_text` of a stored row's chat body (a dual capture's is its parsed path, as `capture_from_row`
    reads it); '' when the body is not JSON."""
    text = parsed_raw_response if endpoint == "dual" else raw_response
    try:
        body = json.loads(text) if text else None
    except ValueError:
        return ""
    return tool_calls_text(tool_calls_of_response(unpack(body)))


def fill_tool_calls_text(conn: DuckDBPyConnection) -> int:
    """Fill `tool_calls_text` of every row that has none yet (NULL), from its stored body; returns the rows filled.
    Runs inside the caller's transaction (the migration's, the merge's)."""
    filled = 0
    while True:
        rows = conn.execute(
            "SELECT sample_id, endpoint, raw_response, parsed_raw_response FROM samples "
            f"WHERE tool_calls_text IS NULL LIMIT {FILL_BATCH}"
        ).fetchall()
        if not rows:
            return filled
        values = [(sid, body_tool_calls_text(endpoint, raw, parsed)) for sid, endpoint, raw, parsed in rows]
        conn.execute("CREATE OR REPLACE TEMP TABLE _tool_text (sample_id VARCHAR, t VARCHAR)")
        # one statement for the whole round: executemany costs a prepared execution per row
        conn.execute(
            "INSERT INTO _tool_text VALUES " + ", ".join(["(?, ?)"] * len(values)), [v for r in values for v in r]
        )
        conn.execute(
            "UPDATE samples SET tool_calls_text = _tool_text.t FROM _tool_text "
            "WHERE samples.sample_id = _tool_text.sample_id"
        )
        conn.execute("DROP TABLE _tool_text")
        filled += len(rows)
