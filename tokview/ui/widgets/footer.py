"""The footer: every footer key of the registry in a grid that wraps onto a second row when narrow.

Why not the stock Footer as is: it is one row that scrolls, so at 80 columns it cut off the keys after
`u`, Help among them. Here the keys wrap into cells of equal width (labels are short for it, see
`bindings.Key.label`), Help first, so every key on the screen stays visible down to 80 columns.
"""

from __future__ import annotations

from textual import events
from textual.app import ComposeResult
from textual.widgets import Footer

CELL = 10
"""Columns per key cell: the longest footer entry ("a Approve", "^r Reload") fits with a space after it."""


class KeysFooter(Footer):
    DEFAULT_CSS = """
    KeysFooter { layout: grid; grid-columns: 1fr; height: auto; max-height: 4; }
    KeysFooter FooterKey, KeysFooter.-compact FooterKey { width: 1fr; margin: 0; }
    """

    def __init__(self) -> None:
        super().__init__(compact=True, show_command_palette=False)

    def compose(self) -> ComposeResult:
        yield from super().compose()
        self._set_columns()

    def on_resize(self, event: events.Resize) -> None:
        self._set_columns()

    def _set_columns(self) -> None:
        width = self.size.width or self.app.size.width
        self.styles.grid_size_columns = max(1, width // CELL)
