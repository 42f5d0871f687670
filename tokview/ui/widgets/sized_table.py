"""`SizedTable`: a DataTable that draws its rows again once its columns are sized.

Why: on a busy machine the stats screen kept its run ids cut to the width of their header ("run" for "run-a")
until something else changed the table (its snapshot test failed 3 times in 15 under a CPU hog, 0 in 15 with this
class). Textual sizes auto-width columns on the table's idle after rows are added, and its row render cache is
keyed without column widths and cleared there only for rows of automatic height: rows drawn at the old widths
in between can outlive the sizing. A small unit test did not reproduce it (a table drawn before its first idle
has no rows to cache), so that reading of Textual's code is the likely cause, not a proven one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeAlias

from rich.text import Text
from textual.widgets import DataTable
from textual.widgets.data_table import RowKey

Cell: TypeAlias = "str | Text"
"""A table cell: our own words as text, stored or sent text as a Text (`ui.display.cell`: never read as markup)."""


class SizedTable(DataTable[Cell]):
    def _update_dimensions(self, new_rows: Iterable[RowKey]) -> None:
        widths = [column.content_width for column in self.columns.values()]
        super()._update_dimensions(new_rows)
        if widths != [column.content_width for column in self.columns.values()]:
            self._clear_caches()  # rows drawn at the old widths are drawn again
            self.refresh()
