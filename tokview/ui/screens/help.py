"""Help generated from the bindings registry (`ui/bindings.py`): every binding, modals included, with its id,
so the help cannot drift from the keys, and a remapped key (config `[keymap]`) shows as remapped."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label

from tokview.ui.bindings import bindings, help_rows


class HelpScreen(ModalScreen[None]):
    """All keys in one table; Escape or ? closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [*bindings("help")]

    def __init__(self, keymap: dict[str, str] | None = None) -> None:
        super().__init__()
        self.keymap = dict(keymap or {})

    def compose(self) -> ComposeResult:
        with Vertical(id="help"):
            yield Label(
                "tokview keys · remap any of them by id in ~/.config/tokview/config.toml [keymap]",
                classes="modal-title",
            )
            table: DataTable[str] = DataTable(id="help-table", cursor_type="row", zebra_stripes=True)
            # keys and id first: at 80 columns the long description is what gets cut, never the id
            table.add_columns("keys", "id", "where", "what it does")
            for where, keys, what, binding_id in help_rows(self.keymap):
                table.add_row(keys, binding_id, where, what)
            yield table

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(None)
