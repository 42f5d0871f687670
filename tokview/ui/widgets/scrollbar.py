"""Scroll views that a resize costs one layout pass, and whose scroll bar repaints only when it changed.

Why, twice over (both Textual behaviours, seen by counting the passes and frames of a resize):
- After a layout, Textual hands each scroll bar its parent's container size as its "virtual size", and a
  widget whose virtual size changes asks the screen for another layout. So every change of width ran the
  screen's layout a second time, one frame later, only for the scroll bar, which paints from its window
  sizes and position and never reads that virtual size. `PaintOnlyScrollBar` takes the new size without
  asking for that pass (Textual's own path while scrolling); the layout that resized it placed it already.
- A scroll view sets its own virtual size, so Textual's check "did the layout change my virtual size"
  always says yes, and every layout pass (a resize runs three) re-sized the scroll bar and repainted it
  a frame later. `OnePassScrolling._size_updated` stops a pass that brings nothing new.

(Textual is pinned exactly: `_size_updated` and `_vertical_scrollbar` are its private layout hook and
scroll-bar slot, as the token view's re-wrap also relies on.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.scrollbar import ScrollBar

# A mixin placed before ScrollView in the bases; typed as one so its attribute use is checked.
if TYPE_CHECKING:
    _Base = ScrollView
else:
    _Base = object


class PaintOnlyScrollBar(ScrollBar):
    def _size_updated(self, size: Size, virtual_size: Size, container_size: Size, layout: bool = True) -> bool:
        return super()._size_updated(size, virtual_size, container_size, layout=False)


class OnePassScrolling(_Base):
    """For a scroll view that only ever scrolls vertically (overflow-x: hidden) and sets its own virtual size."""

    _seen_by_layout: tuple[object, ...] | None = None

    @property
    def vertical_scrollbar(self) -> ScrollBar:
        if self._vertical_scrollbar is None:
            bar: ScrollBar = PaintOnlyScrollBar(vertical=True, name="vertical", thickness=self.scrollbar_size_vertical)
            bar.display = False
            self._vertical_scrollbar = bar
            self.app._start_widget(self, bar)
        return self._vertical_scrollbar

    def _size_updated(self, size: Size, virtual_size: Size, container_size: Size, layout: bool = True) -> bool:
        styles = self.styles
        seen = (
            size,
            container_size,
            self.virtual_size,
            styles.overflow_y,
            styles.scrollbar_size_vertical,
            styles.scrollbar_gutter,
        )
        if seen == self._seen_by_layout:
            return False  # what Textual returns when nothing changed: no Resize event
        self._seen_by_layout = seen
        return super()._size_updated(size, virtual_size, container_size, layout)
