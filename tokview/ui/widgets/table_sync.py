"""Bring a DataTable to a new list of rows by changing only what changed.

A live list (the sessions a proxy records) is read again every time the store changes. Cleared and filled again, a
table of 5,000 rows held the event loop about a second on every reload (each `add_row` measures its cells): with a
proxy landing every second, keys waited that long. Rows that left are removed, new ones added, changed cells updated,
and the order set by one sort; only the first fill adds every row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    from textual.widgets import DataTable

Row = tuple[str, tuple[Any, ...]]
"""(row key, its cells)."""


def sync_rows(table: DataTable[Any], shown: dict[str, tuple[Any, ...]], rows: Sequence[Row], order_column: int) -> None:
    """Make `table` show `rows` in their order, given `shown` (key → cells, what it shows now, updated here).
    `order_column`: a column whose text tells the rows apart, which the sort goes by; when it does not (two rows
    with one text), or nothing is shown yet, the table is filled anew."""
    wanted = dict(rows)
    position = {str(cells[order_column]): k for k, (_, cells) in enumerate(rows)}
    if not shown or len(position) != len(rows) or len(wanted) != len(rows):
        _refill(table, shown, rows)
        return
    for key in [k for k in shown if k not in wanted]:
        table.remove_row(key)
        del shown[key]
    columns = [column.key for column in table.ordered_columns]
    for key, cells in rows:
        old = shown.get(key)
        if old is None:
            table.add_row(*cells, key=key)
        elif old != cells:
            for k, (was, now) in enumerate(zip(old, cells)):
                if was != now:
                    table.update_cell(key, columns[k], now, update_width=True)
        shown[key] = cells
    now_order = [row.key.value for row in table.ordered_rows]
    if now_order != [key for key, _ in rows]:
        table.sort(columns[order_column], key=lambda text: position[str(text)])


def _refill(table: DataTable[Any], shown: dict[str, tuple[Any, ...]], rows: Sequence[Row]) -> None:
    table.clear()
    shown.clear()
    for key, cells in rows:
        table.add_row(*cells, key=key)
        shown[key] = cells
