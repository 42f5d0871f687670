"""Help generated from the bindings registry (`ui/bindings.py`): every binding, modals included, with its id,
so the help cannot drift from the keys, and a remapped key (config `[keymap]`) shows as remapped. Textual's own
keys (the palette, focus, enter in a dialog) are listed too, without an id: they cannot be remapped. The title
names the config file in use (or the one that would be read), so a remap that "does nothing" is traced fast."""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label

from tokview.ui.bindings import bindings, help_rows
from tokview.ui.config import config_path
from tokview.ui.display import plain
from tokview.ui.widgets.footer import KeysFooter

TEXTUAL_KEYS: tuple[tuple[str, str], ...] = (
    ("^p", "command palette (every command of the screen, by name)"),
    ("tab / shift+tab", "next / previous field or pane"),
    ("⏎", "in a dialog: keep what was typed, or the reason picked"),
    ("^q", "quit"),
)
"""Keys Textual handles itself: listed under the table (they have no id and cannot be remapped), so help names
every key."""


def config_in_use(app: object) -> str:
    """Which config file the app read; with none there, where it would be read from (named by the variable
    or the default path, not a temporary path, so the help reads the same on every machine)."""
    config = getattr(app, "config", None)
    path: Path = getattr(config, "path", None) or config_path()
    if path.is_file():
        return f"config {path}"
    where = "$TOKVIEW_CONFIG" if os.environ.get("TOKVIEW_CONFIG") else "~/.config/tokview/config.toml"
    return f"no config file ({where} is not there: defaults)"


class HelpScreen(ModalScreen[None]):
    """All keys in one table; Escape or ? closes it; Home/End go to its first and last rows."""

    BINDINGS: ClassVar[list[BindingType]] = [*bindings("help")]

    def __init__(self, keymap: dict[str, str] | None = None) -> None:
        super().__init__()
        self.keymap = dict(keymap or {})

    def compose(self) -> ComposeResult:
        with Vertical(id="help"):
            yield Label(
                plain(f"tokview keys · remap any of them by id in [keymap] · {config_in_use(self.app)}"),
                classes="modal-title",
                id="help-title",
            )
            table: DataTable[str] = DataTable(id="help-table", cursor_type="row", zebra_stripes=True)
            # keys and id first: at 80 columns the long description is what gets cut, never the id
            table.add_columns("keys", "id", "where", "what it does")
            for where, keys, what, binding_id in help_rows(self.keymap):
                table.add_row(keys, binding_id, where, what)
            yield table
            yield Label(
                "Textual's own keys (no id, not remappable): " + " · ".join(f"{k} {what}" for k, what in TEXTUAL_KEYS),
                id="help-textual",
            )
        yield KeysFooter()

    def action_first_row(self) -> None:
        self.query_one(DataTable).move_cursor(row=0, animate=False)

    def action_last_row(self) -> None:
        table = self.query_one(DataTable)
        table.move_cursor(row=table.row_count - 1, animate=False)

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(None)
