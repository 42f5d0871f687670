"""The footer: every footer key of the registry in a grid that wraps onto a second row when narrow.

Why not the stock Footer as is: it is one row that scrolls, so at 80 columns it cut off the keys after
`u`, Help among them. Here the keys wrap into cells of equal width (labels are short for it, see
`bindings.Key.label`), Help first, so every key on the screen stays visible down to 80 columns.

The number of columns is set inside the layout that gives the footer its width (its height and its keys'
places are computed there), not on the Resize event that follows: that came after the frame, so a
resize painted the footer with the old column count first and then laid the whole screen out again.
Each key is one row high by rule, so a layout does not render every key to learn its height.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.geometry import Size
from textual.widgets import Footer, Input, TextArea
from textual.widgets._footer import FooterKey

if TYPE_CHECKING:
    from textual.layout import DockArrangeResult
    from textual.screen import Screen

CELL = 10
"""Columns per key cell: the longest footer entry ("a Approve", "^r Reload") fits with a space after it."""


ESSENTIAL_ACTIONS = frozenset({"help", "quit", "close", "dismiss", "cancel", "decline"})
"""Keys a short screen's one-row footer keeps (class -essential; styles/app.tcss `.-short KeysFooter`, a screen
breakpoint: DEFAULT_CSS here is scoped to the footer and cannot see the screen's class): help, back, leave."""


class KeysFooter(Footer):
    DEFAULT_CSS = """
    KeysFooter { layout: grid; grid-columns: 1fr; height: auto; max-height: 4; }
    KeysFooter FooterKey, KeysFooter.-compact FooterKey { width: 1fr; height: 1; margin: 0; }
    /* the light theme's key colour (#0178D4 on #D0D0D0) measured 2.9:1, 2.3:1 in 256 colours: a cube colour */
    KeysFooter:light FooterKey > .footer-key--key { color: #00005f; }
    """

    def __init__(self) -> None:
        super().__init__(compact=True, show_command_palette=False)
        self._composed: tuple[object, ...] | None = None
        """What the keys on show were made from (`_shown_keys`)."""

    def _typing(self) -> bool:
        """Whether a key pressed now goes into a text box (a form's server URL, a prompt): a one-character key is text
        there, not its binding. The footer showed `? Help` while the generate panel's URL box took `?DSET` as typed."""
        return isinstance(self.screen.focused, (Input, TextArea))

    def _shown_keys(self) -> tuple[object, ...]:
        app = self.app
        return (self._typing(),) + tuple(
            (b.key, app.get_key_display(b), b.description, b.action, enabled, tooltip, b.group)
            for _node, b, enabled, tooltip in self.screen.active_bindings.values()
            if b.show
        )

    async def recompose(self) -> None:
        """Skipped when the keys on show are the ones shown: every focus change (`s`, `f` in inspect) recomposed the
        footer twice, ~0.1 s each, for the same keys."""
        if self._bindings_ready and self.is_attached and self._shown_keys() == self._composed:
            return
        await super().recompose()

    def compose(self) -> ComposeResult:
        self._composed = self._shown_keys() if self._bindings_ready else None
        typing = self._typing()
        for widget in super().compose():
            if isinstance(widget, FooterKey):
                if typing and len(widget.key_display) == 1:  # typed into the box, not a key here (`_typing`)
                    continue
                if widget.action in ESSENTIAL_ACTIONS:
                    widget.add_class("-essential")
            yield widget
        self._fit_columns(self.size.width or self.app.size.width)

    def on_mount(self) -> None:
        self.app.screen_change_signal.subscribe(self, self._screen_changed)

    def _screen_changed(self, active: Screen[object]) -> None:
        """Under a dialog that shows its own keys, this footer (the screen's keys, which are not live there)
        is hidden: it showed through around the dialog's footer. Hidden, not removed: nothing is laid out again."""
        covered = active is not self.screen and bool(active.query(KeysFooter))
        self.styles.visibility = "hidden" if covered else "visible"

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        self._fit_columns(width)  # the height (one or two rows of keys) follows from the columns
        return super().get_content_height(container, viewport, width)

    def arrange(self, size: Size, optimal: bool = False) -> DockArrangeResult:
        self._fit_columns(size.width)
        return super().arrange(size, optimal)

    def _fit_columns(self, width: int) -> None:
        """Columns for `width`, set without asking for a layout: the one running uses them."""
        if width:
            self.styles.set_rule("grid_size_columns", max(1, width // CELL))
