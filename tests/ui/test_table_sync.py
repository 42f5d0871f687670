"""A live list brought to its new rows changes only what changed (`ui/widgets/table_sync.py`): cleared and filled
again, the sessions screen's 5,000 rows held the app about a second on every reload while a proxy recorded."""

from __future__ import annotations

from typing import Any

from textual.app import App, ComposeResult
from textual.widgets import DataTable

from tokview.ui.widgets.table_sync import sync_rows


class _Table(App[None]):
    def compose(self) -> ComposeResult:
        table: DataTable[str] = DataTable()
        table.add_columns("name", "turns", "last")
        yield table


def _shown(table: DataTable[str]) -> list[tuple[str | None, list[str]]]:
    return [(row.key.value, [str(v) for v in table.get_row(row.key)]) for row in table.ordered_rows]


async def test_a_new_list_is_shown_exactly_and_only_its_changes_are_made() -> None:
    app = _Table()
    async with app.run_test() as pilot:
        table = app.query_one(DataTable)
        shown: dict[str, tuple[str, ...]] = {}
        first = [(f"k{i}", (f"s{i}", str(i), f"t{i}")) for i in range(300)]
        sync_rows(table, shown, first, order_column=0)
        assert _shown(table) == [(k, list(c)) for k, c in first]

        added: list[str | None] = []
        real_add = table.add_row

        def counted_add(*cells: Any, key: str | None = None, **kw: Any) -> Any:
            added.append(key)
            return real_add(*cells, key=key, **kw)

        table.add_row = counted_add  # type: ignore[method-assign]
        # session 7 got a turn and moves to the top, 3 ended out of the list, a new one came in
        second = [("k7", ("s7", "8", "later")), ("new", ("s-new", "1", "now"))]
        second += [(k, c) for k, c in first if k not in ("k7", "k3")]
        sync_rows(table, shown, second, order_column=0)
        await pilot.pause()
        assert _shown(table) == [(k, list(c)) for k, c in second]
        assert added == ["new"]  # the 298 rows still there were not added again
        assert shown == dict(second)

        twins = [("a", ("same", "1", "x")), ("b", ("same", "2", "y"))]  # no text to sort by: filled anew
        sync_rows(table, shown, twins, order_column=0)
        assert _shown(table) == [(k, list(c)) for k, c in twins]
