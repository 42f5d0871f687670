"""`SizedTable`: a DataTable that draws its rows again once its columns are sized.

Why: Textual sizes a table's auto-width columns on its next idle after rows are added, but keeps the rows it
drew before that in its render cache, whose key holds no column widths (it is cleared there only for rows of
automatic height). On a busy machine a frame drawn in between showed the stats screen's run ids cut to the
width of their header ("run" for "run-a") and the screen kept them so until something else changed the table.
"""

from __future__ import annotations

from collections.abc import Iterable

from textual.widgets import DataTable
from textual.widgets.data_table import RowKey


class SizedTable(DataTable[str]):
    def _update_dimensions(self, new_rows: Iterable[RowKey]) -> None:
        widths = [column.content_width for column in self.columns.values()]
        super()._update_dimensions(new_rows)
        if widths != [column.content_width for column in self.columns.values()]:
            self._clear_caches()  # rows drawn at the old widths are drawn again
            self.refresh()
