"""Help generated from the bindings themselves: every binding has an id and a description, so the
help cannot drift from the keys, and a remapped key (config `[keymap]`) shows as remapped."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label

if TYPE_CHECKING:
    from textual.app import App


def binding_groups() -> list[tuple[str, list[Binding]]]:
    """(where, bindings) for every place tokview binds keys."""
    from tokview.ui.app import TokviewApp
    from tokview.ui.screens.doctor import DoctorScreen
    from tokview.ui.screens.generate import GenerateScreen
    from tokview.ui.screens.inspect import InspectScreen
    from tokview.ui.screens.samples import SamplesScreen
    from tokview.ui.screens.stats import StatsScreen
    from tokview.ui.widgets.sample_list import SampleList
    from tokview.ui.widgets.token_view import TokenView

    return [("everywhere", TokviewApp.BINDINGS), ("samples", SamplesScreen.BINDINGS + SampleList.BINDINGS),
            ("inspect", InspectScreen.BINDINGS), ("token panes", TokenView.BINDINGS),
            ("generate", GenerateScreen.BINDINGS), ("doctor", DoctorScreen.BINDINGS),
            ("stats", StatsScreen.BINDINGS)]


def binding_ids() -> set[str]:
    return {b.id for _, group in binding_groups() for b in group if isinstance(b, Binding) and b.id}


def help_rows(keymap: dict[str, str]) -> list[tuple[str, str, str, str]]:
    """(where, keys, description, binding id), keys as remapped by the keymap."""
    rows = []
    for where, group in binding_groups():
        for b in group:
            if not isinstance(b, Binding):
                continue
            keys = keymap.get(b.id or "", b.key)
            shown = b.key_display if b.key_display and b.id not in keymap else keys
            rows.append((where, shown, b.tooltip or b.description, b.id or ""))
    return rows


class HelpScreen(ModalScreen[None]):
    """All keys in one table; Escape or ? closes it."""

    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "Close help", id="help.close")]

    def __init__(self, app: "App") -> None:
        super().__init__()
        self.keymap = dict(getattr(app, "_keymap", {}) or {})

    def compose(self) -> ComposeResult:
        with Vertical(id="help"):
            yield Label("tokview keys · remap any of them by id in ~/.config/tokview/config.toml [keymap]",
                        classes="modal-title")
            table = DataTable(id="help-table", cursor_type="row", zebra_stripes=True)
            table.add_columns("where", "keys", "what it does", "id")
            for row in help_rows(self.keymap):
                table.add_row(*row)
            yield table

    def action_dismiss(self, result: None = None) -> None:
        self.dismiss(None)
