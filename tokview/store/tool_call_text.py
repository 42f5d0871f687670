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
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tokview.core.tool_calls import tool_calls_of_response
from tokview.store.packed_chunks import unpack

if TYPE_CHECKING:  # a batch process writes rows (sample_rows imports this) without loading DuckDB
    from duckdb import DuckDBPyConnection

NO_CALLS_SQL = """
UPDATE samples SET tool_calls_text = '' WHERE tool_calls_text IS NULL
    AND NOT contains(coalesce(raw_response, '') || coalesce(parsed_raw_response, ''), 'tool_calls')
    AND NOT contains(coalesce(raw_response, '') || coalesce(parsed_raw_response, ''), 'chunks_zlib64')
"""
"""The rows whose bodies cannot hold a call, filled '' in one statement: a JSON body with calls names `tool_calls`,
and packed chunks (which may hold them) are read in Python. Read row by row in batches, a 100,000-row store of
answers without calls took 40 s at its first open after the upgrade."""
FILL_BATCH = 500
"""Rows read and written back per round of a fill (bounded memory on a store of a million rows)."""


def tool_calls_text(calls: Sequence[dict[str, Any]] | None) -> str:
    """One line per call, `name arguments` (either may be missing); '' for none. A lone surrogate (a `\\ud83d` escape
    a server sent in the arguments) is kept as its escape: DuckDB refuses to store it, and a store whose upgrade
    met one could not be opened at all."""
    lines = [" ".join(v for v in (call.get("name"), call.get("arguments")) if v) for call in calls or ()]
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", "\n".join(lines))


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def body_tool_calls_text(endpoint: str | None, raw_response: str | None, parsed_raw_response: str | None) -> str:
    """`tool_calls_text` of a stored row's chat body (a dual capture's is its parsed path, as `capture_from_row`
    reads it); '' when the body is not JSON."""
    text = parsed_raw_response if endpoint == "dual" else raw_response
    try:
        body = json.loads(text) if text else None
    except (ValueError, RecursionError):  # not JSON, or nested deeper than Python reads: no calls to show
        return ""
    return tool_calls_text(tool_calls_of_response(unpack(body)))


def fill_tool_calls_text(conn: DuckDBPyConnection, *, commit_each: bool = False) -> int:
    """Fill `tool_calls_text` of every row that has none yet (NULL), from its stored body, FILL_BATCH rows at a time
    in rowid order; returns the rows filled. Inside the caller's transaction (a merge's, a landing's), or with
    `commit_each` one transaction per batch (an upgrade: a store of a million agent rows held every filled value
    in memory until one commit, gigabytes; a kill now keeps the batches done, and the next open goes on)."""
    from tokview.store.connection import transaction

    if commit_each:
        with transaction(conn):
            conn.execute(NO_CALLS_SQL)
    else:
        conn.execute(NO_CALLS_SQL)
    filled, after = 0, -1
    while True:
        rows = conn.execute(
            "SELECT rowid, sample_id, endpoint, raw_response, parsed_raw_response FROM samples "
            f"WHERE rowid > ? AND tool_calls_text IS NULL ORDER BY rowid LIMIT {FILL_BATCH}",
            [after],
        ).fetchall()
        if not rows:
            return filled
        after = rows[-1][0]
        values = [(sid, body_tool_calls_text(endpoint, raw, parsed)) for _, sid, endpoint, raw, parsed in rows]
        if commit_each:
            with transaction(conn):
                _write(conn, values)
        else:
            _write(conn, values)
        filled += len(rows)


def _write(conn: DuckDBPyConnection, values: list[tuple[str, str]]) -> None:
    conn.execute("CREATE OR REPLACE TEMP TABLE _tool_text (sample_id VARCHAR, t VARCHAR)")
    # one statement for the whole batch: executemany costs a prepared execution per row
    conn.execute("INSERT INTO _tool_text VALUES " + ", ".join(["(?, ?)"] * len(values)), [v for r in values for v in r])
    conn.execute(
        "UPDATE samples SET tool_calls_text = _tool_text.t FROM _tool_text WHERE samples.sample_id = _tool_text.sample_id"
    )
    conn.execute("DROP TABLE _tool_text")
