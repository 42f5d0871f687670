"""The inspect screen's findings: an OptionList whose options re-wrap inside the layout that resizes it.

Why: Textual's OptionList re-wraps its options only when its Resize event arrives, after the frame at
the new size was painted, and the new line count then asks for another layout. So every resize of the
inspect screen painted the findings wrapped to the old width first (a frame showing text cut wrong and
a stale scroll bar), then laid the screen out again and painted twice more before it was right. Here
the options are wrapped for the new width while the layout runs, as the token view does with its rows,
so the first frame at a new size shows them right; the Resize event then has nothing left to do.
(Textual is pinned exactly: `_size_updated`, `_clear_caches` and `_update_lines` are OptionList's
private layout hook and line cache.)
"""

from __future__ import annotations

from textual import events
from textual.geometry import Size
from textual.widgets import OptionList


class FindingsList(OptionList):
    _wrapped_for: int | None = None
    """The content width the cached option lines were wrapped for."""

    def _wrap_width(self) -> int:
        return self.scrollable_content_region.width - self._get_left_gutter_width()

    def _size_updated(self, size: Size, virtual_size: Size, container_size: Size, layout: bool = True) -> bool:
        resized = super()._size_updated(size, virtual_size, container_size, layout)
        width = self._wrap_width()
        if size.width and size.height and width != self._wrapped_for:
            self._wrapped_for = width
            self._clear_caches()
            self._update_lines()
        return resized

    def _on_resize(self, event: events.Resize) -> None:  # type: ignore[override]  # Textual passes the event if asked
        if self._wrap_width() == self._wrapped_for:
            event.prevent_default()  # OptionList's own handler would throw the fresh lines away and re-wrap
