"""`Select`, whose drop-down list survives a page key before it was ever laid out.

Why: on a tiny terminal (20x8) the export dialog's format list opened with no room to lay out its lines, and
pagedown then crashed the app inside Textual's `OptionList._move_page` (`KeyError: 0`: the highlighted option has
no line yet). A page key with no lines to page through does nothing here.
"""

from __future__ import annotations

from typing import Any

from textual import _widget_navigation
from textual.app import ComposeResult
from textual.widgets import Select as TextualSelect
from textual.widgets._select import SelectCurrent, SelectOverlay


class _Overlay(SelectOverlay):
    def _move_page(self, direction: _widget_navigation.Direction) -> None:
        if (self.highlighted or 0) not in self._index_to_line:  # not laid out yet: nothing to page through
            return
        super()._move_page(direction)


class Select(TextualSelect[Any]):
    """Textual's `Select` with `_Overlay` as its list."""

    def compose(self) -> ComposeResult:
        yield SelectCurrent(self.prompt)
        yield _Overlay(type_to_search=self._type_to_search).data_bind(compact=TextualSelect.compact)
