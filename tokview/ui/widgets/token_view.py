"""The token view: a Line-API `ScrollView` that shows tens of thousands of coloured tokens.

Why the Line API: a `Static(Text)` re-wraps and re-renders every token on any change (seconds at
30,000 tokens); here tokens are flat arrays, the wrap is computed once per width and view mode, only
visible rows are turned into Strips (LRU-cached), and moving the cursor or recolouring one token
repaints only the row(s) that token is on. Colours come from component classes, so themes restyle it.
"""

from __future__ import annotations

from bisect import bisect_right

from rich.cells import cell_len
from rich.color import Color
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.cache import LRUCache
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import var
from textual.scroll_view import ScrollView
from textual.strip import Strip

from tokview.ui import gc_pause
from tokview.ui.bindings import bindings
from tokview.ui.display import STYLE_CLASSES, VIEW_MODES, CellWidths, TokenSeq, cell_texts, row_of
from tokview.ui.widgets.scrollbar import OnePassScrolling


def readable_on(background: Color | None) -> Color | None:
    """Black or white, whichever contrasts more with `background` (WCAG luminance)."""
    if background is None:
        return None
    r, g, b = (c / 255 for c in background.get_truecolor())
    lum = sum(
        w * (c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4)
        for w, c in ((0.2126, r), (0.7152, g), (0.0722, b))
    )
    return Color.parse("#000000") if (lum + 0.05) / 0.05 >= 1.05 / (lum + 0.05) else Color.parse("#ffffff")


class SharedCursor:
    """The one cursor position of a pane, or of panes that mirror each other.

    Why an object and not a reactive per pane: two panes that each keep a cursor and echo each other's
    moves through messages fall behind when keys arrive in a burst (each stale echo moves the other pane
    back, forever). Here there is one index; setting it repaints every pane that shares it, synchronously.
    """

    def __init__(self) -> None:
        self.index = 0
        self.views: list[TokenView] = []


class TokenView(OnePassScrolling, ScrollView, can_focus=True):
    """Tokens flowing into rows; a cursor token; pieces / ids / both (piece over id)."""

    COMPONENT_CLASSES = {f"token-view--{c}" for c in STYLE_CLASSES} | {
        "token-view--cursor",
        "token-view--alt",
        "token-view--mark",
    }

    DEFAULT_CSS = """
    TokenView { overflow-x: hidden; overflow-y: auto; background: $surface; }
    TokenView > .token-view--prompt { color: $text-muted; }
    TokenView > .token-view--prompt-special { color: $text-muted; text-style: italic bold; }
    TokenView > .token-view--delimiter { color: $text-warning; text-style: bold; }
    TokenView > .token-view--reasoning { color: $text-accent; }
    TokenView > .token-view--answer { color: $text; }
    TokenView > .token-view--stop { color: $text-error; text-style: bold; }
    TokenView > .token-view--special { color: $text; text-style: bold italic; }
    TokenView > .token-view--gap { color: $text-error; }
    TokenView > .token-view--partial { color: $text-warning; text-style: underline; }
    TokenView > .token-view--drift { color: $text-error; text-style: bold underline; }
    TokenView > .token-view--empty { color: $text-disabled; }
    /* light themes: warning and accent are light oranges, unreadable on a light surface; darkened to colours of
       the xterm 256-colour cube, so a 256-colour terminal paints them as they are (a brown rounded to #875f00
       and measured 3.0:1 there) */
    TokenView:light > .token-view--delimiter { color: #5f0000; }
    TokenView:light > .token-view--partial { color: #5f0000; }
    TokenView:light > .token-view--reasoning { color: #5f005f; }
    TokenView:light > .token-view--prompt { color: $foreground-darken-1; }
    TokenView:light > .token-view--prompt-special { color: $foreground-darken-1; }
    /* tool calls and Harmony (issue 23): 256-colour cube colours, so a 256-colour terminal paints them as is */
    TokenView > .token-view--tool-marker { color: #87afff; text-style: bold; }
    TokenView > .token-view--tool-id { color: #5fd7ff; text-style: bold; }
    TokenView > .token-view--tool-args { color: #d7af87; }
    TokenView > .token-view--commentary { color: #afd787; }
    TokenView > .token-view--header { color: $text-warning; text-style: italic; }
    TokenView:light > .token-view--tool-marker { color: #5f0087; }
    TokenView:light > .token-view--tool-id { color: #00005f; }
    TokenView:light > .token-view--tool-args { color: #005f00; }
    TokenView:light > .token-view--commentary { color: #870087; }
    TokenView:light > .token-view--header { color: #5f0000; }
    TokenView > .token-view--alt { background: $primary 8%; }
    TokenView:light > .token-view--alt { background: $primary 5%; }
    TokenView > .token-view--heat-0 { color: #3fb950; }
    TokenView > .token-view--heat-1 { color: #9be9a8; }
    TokenView > .token-view--heat-2 { color: #e3b341; }
    TokenView > .token-view--heat-3 { color: #f0883e; text-style: bold; }
    TokenView > .token-view--heat-4 { color: #f85149; text-style: bold reverse; }
    TokenView:light > .token-view--heat-0 { color: #005f00; }
    TokenView:light > .token-view--heat-1 { color: #00005f; }
    TokenView:light > .token-view--heat-2 { color: #5f005f; }
    TokenView:light > .token-view--heat-3 { color: #870000; }
    TokenView:light > .token-view--heat-4 { color: #9a0d23; }
    TokenView > .token-view--mark { text-style: underline; }
    TokenView > .token-view--cursor { background: $primary 40%; text-style: bold; }
    TokenView:focus > .token-view--cursor { background: $primary; }
    """

    BINDINGS = bindings("token panes")

    mode: var[str] = var("pieces", init=False)

    class CursorMoved(Message):
        """The cursor moved to token `index` (messages up: the screen updates the detail panel).

        Only the pane that was moved posts it; a newer one replaces a queued older one, so a burst of
        keys updates the detail panel once.
        """

        def __init__(self, view: TokenView, index: int) -> None:
            super().__init__()
            self.view, self.index = view, index

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, TokenView.CursorMoved) and message.view is self.view

        @property
        def control(self) -> TokenView:
            return self.view

    class Scrolled(Message):
        """The view scrolled to row `y`; a newer one replaces a queued older one."""

        def __init__(self, view: TokenView, y: int) -> None:
            super().__init__()
            self.view, self.y = view, y

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, TokenView.Scrolled) and message.view is self.view

    def __init__(
        self,
        seq: TokenSeq | None = None,
        *,
        mode: str = "pieces",
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._seq = seq or TokenSeq([], [], [], 0)
        self.set_reactive(TokenView.mode, mode)
        self._marks: set[int] = set()
        self.linked: TokenView | None = None
        """A side-by-side pane that must wrap to the same width (so rows line up one for one)."""
        self._cursor = SharedCursor()
        self._cursor.views.append(self)
        self._tops: list[str] = []
        self._bottoms: list[str] | None = None
        self._widths: list[int] = []
        self._cells = CellWidths([0], [])
        self._starts: list[int] = []
        self._wrap_key: tuple[int, str] = (-1, "")
        self._rewrapped = False
        self._laid_out_height = 0
        """The height the last layout gave (a change keeps the cursor in view)."""
        self._cache: LRUCache[tuple[int, int], Strip] = LRUCache(1024)
        self._styles: dict[tuple[int, bool, bool, bool], Style] = {}
        self._heap_screen: object | None = None
        """The screen this view was counted open on, for the long-lived heap (ui/gc_pause.py)."""
        self._prepare_cells()

    def on_mount(self) -> None:
        self.call_after_refresh(self._hold_heap)

    def _hold_heap(self) -> None:
        if self.is_attached and self._heap_screen is None:
            self._heap_screen = self.screen
            gc_pause.view_opened(self._heap_screen)

    def on_unmount(self) -> None:
        if self._heap_screen is not None:
            gc_pause.view_closed(self._heap_screen)
            self._heap_screen = None

    # -- data ---------------------------------------------------------------------------------
    @property
    def seq(self) -> TokenSeq:
        return self._seq

    @property
    def rows_per_line(self) -> int:
        return 2 if self._bottoms is not None else 1

    @property
    def row_starts(self) -> list[int]:
        return self._starts

    def set_seq(self, seq: TokenSeq) -> None:
        self._seq = seq
        self._cursor.index = 0
        self._prepare_cells()
        self._invalidate_layout()

    def _prepare_cells(self) -> None:
        self._tops, self._bottoms = cell_texts(self._seq, self.mode)
        self._widths = [cell_len(t) for t in self._tops]
        breaks = self._seq.breaks_after if self.mode == "pieces" and self._seq.breaks_after else None
        self._cells = CellWidths.of(self._widths, breaks)

    def _invalidate_layout(self) -> None:
        self._wrap_key = (-1, "")
        self._cache.clear()
        self.refresh()

    def watch_mode(self, mode: str) -> None:
        if mode not in VIEW_MODES:
            raise ValueError(f"unknown view mode {mode!r}")
        self._prepare_cells()
        self._invalidate_layout()
        self.call_after_refresh(self.scroll_to_cursor)

    def recolour(self, index: int, style_class: int) -> None:
        """Give one token another style class; only its row is repainted."""
        self._seq.classes[index] = style_class
        self._refresh_token(index)

    def set_token_classes(self, classes: list[int]) -> None:
        """Replace every token's style class at once (the heat view); the whole view repaints."""
        self._seq.classes = list(classes)
        self._cache.clear()
        self.refresh()

    def set_marks(self, indices: set[int]) -> None:
        """Underline a set of tokens (the positions a finding names); repaints only changed rows."""
        changed = self._marks ^ indices
        self._marks = set(indices)
        for i in changed:
            self._refresh_token(i)

    # -- layout -------------------------------------------------------------------------------
    def _ensure_wrap(self) -> None:
        """Wrap for the current width if the layout did not already (a mode change, new tokens)."""
        width = max(1, self.scrollable_content_region.width)
        if self.linked is not None and self.linked.size.width:
            width = max(1, min(width, self.linked.scrollable_content_region.width))
        if self._wrap(width):
            self.virtual_size = Size(width, len(self._starts) * self.rows_per_line)

    def _wrap(self, width: int) -> bool:
        """Re-wrap if the width or mode changed (True then); the strip cache goes with the old rows."""
        if self._wrap_key == (width, self.mode):
            return False
        self._starts = self._cells.wrap(width)
        self._wrap_key = (width, self.mode)
        self._rewrapped = True
        self._cache.clear()
        return True

    def _content_width(self, size: Size) -> int:
        """The width rows wrap to inside `size`: without the vertical scrollbar when the rows will need one."""
        styles = self.styles
        inner = max(1, size.width - styles.gutter.width)
        bar = styles.scrollbar_size_vertical
        if styles.overflow_y == "hidden" or not bar:
            return inner
        if styles.overflow_y == "scroll" or styles.scrollbar_gutter == "stable":
            return max(1, inner - bar)
        height = size.height - styles.gutter.height
        rpl = self.rows_per_line
        if self._cells.min_rows(inner) * rpl <= height and len(self._cells.wrap(inner)) * rpl <= height:
            return inner
        return max(1, inner - bar)

    def _size_updated(self, size: Size, virtual_size: Size, container_size: Size, layout: bool = True) -> bool:
        """Re-wrap while the layout runs, so the scrollbars and the first frame at a new size already
        have the new rows; wrapping at render time instead changes the virtual size mid-frame and costs
        the whole screen a second and third layout pass. (Textual's layout hook for scroll views: a
        private method, which is why Textual is pinned exactly.)"""
        if size.width and size.height:
            width = self._content_width(size)
            if self.linked is not None and self.linked.size.width:
                width = min(width, self.linked._content_width(self.linked.size))
            if self._wrap(width):
                self.set_reactive(TokenView.virtual_size, Size(width, len(self._starts) * self.rows_per_line))
            if self.linked is not None and self.linked.size.width and self.linked._wrap(width):
                linked = self.linked
                linked.set_reactive(TokenView.virtual_size, Size(width, len(linked._starts) * linked.rows_per_line))
                linked._scroll_update(linked.virtual_size)
                linked.refresh()
        # a new height keeps the cursor's row in view when it was in view (inspect opens at its cursor in a pane the
        # layout shrinks right after); a reader who scrolled elsewhere stays there (a note adds a review line)
        follow = size.height != self._laid_out_height and self._cursor_in_view(self._laid_out_height)
        self._laid_out_height = size.height  # (`self.size` is the new size already)
        resized = super()._size_updated(size, virtual_size, container_size, layout)
        if self._rewrapped or follow:  # rows moved: whatever row was on top means something else now
            self._rewrapped = False
            self.scroll_to_cursor()
        return resized

    def _cursor_in_view(self, height: int) -> bool:
        """Whether the cursor's row was inside a view `height` rows high (true before the first layout)."""
        if not height or not self._starts:
            return True
        top = self._rows_of_token(self.cursor) * self.rows_per_line
        return self.scroll_offset.y <= top < self.scroll_offset.y + height

    def render_lines(self, crop: Region) -> list[Strip]:
        self._ensure_wrap()
        return super().render_lines(crop)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles.clear()
        self._cache.clear()

    def cell_style(self, style_class: int, *, alt: bool = False, cursor: bool = False, mark: bool = False) -> Style:
        """The style a token cell of `style_class` is painted with (alternate shade, cursor, search mark)."""
        return self._style(style_class, alt, cursor, mark)

    def _style(self, cls: int, alt: bool, cursor: bool, mark: bool) -> Style:
        key = (cls, alt, cursor, mark)
        style = self._styles.get(key)
        if style is None:
            style = self.rich_style + self._component(f"token-view--{STYLE_CLASSES[cls]}")
            if alt and STYLE_CLASSES[cls] != "empty":
                style += self._component("token-view--alt")
            if mark:
                style += self._component("token-view--mark")
            if cursor:  # the cursor's background decides the text colour: black or white, whichever reads
                style += self._component("token-view--cursor")
                style += Style(color=readable_on(style.bgcolor))
            self._styles[key] = style
        return style

    def _component(self, name: str) -> Style:
        """A component class's own attributes, with translucent colours blended over the background."""
        partial = self.get_component_rich_style(name, partial=True)
        if partial.color is None and partial.bgcolor is None:
            return partial
        full = self.get_component_rich_style(name, partial=False)
        return partial + Style(
            color=full.color if partial.color else None, bgcolor=full.bgcolor if partial.bgcolor else None
        )

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        vy = y + self.scroll_offset.y
        rpl = self.rows_per_line
        row, sub = divmod(vy, rpl)
        if row >= len(self._starts):
            return Strip.blank(width, self.rich_style)
        start = self._starts[row]
        end = self._starts[row + 1] if row + 1 < len(self._starts) else len(self._tops)
        cursor = self.cursor if start <= self.cursor < end else -1
        key = (vy, cursor)
        strip = self._cache.get(key)
        if strip is None:
            texts = self._tops if sub == 0 else self._bottoms
            assert texts is not None
            classes, marks, alt_on = self._seq.classes, self._marks, self.mode == "pieces"
            style = self._style
            segments = [
                Segment(texts[i], style(classes[i], alt_on and i % 2 == 1, i == cursor, i in marks))
                for i in range(start, end)
            ]
            used = self._cells.prefix[end] - self._cells.prefix[start]
            if used <= width:  # the usual row: pad it, its cell length is known (no re-measuring)
                if used < width:
                    segments.append(Segment(" " * (width - used), self.rich_style))
                strip = Strip(segments, width)
            else:  # one token wider than the pane
                strip = Strip(segments, used).crop_extend(0, width, self.rich_style)
            self._cache.set(key, strip)
        return strip

    # -- cursor -------------------------------------------------------------------------------
    def _rows_of_token(self, index: int) -> int:
        return row_of(self._starts, index)

    def _refresh_token(self, index: int) -> None:
        if not self._starts or not 0 <= index < len(self._tops):
            return
        row = self._rows_of_token(index)
        rpl = self.rows_per_line
        start = self._starts[row]
        end = self._starts[row + 1] if row + 1 < len(self._starts) else len(self._tops)
        for sub in range(rpl):
            vy = row * rpl + sub
            for cursor in (-1, *range(start, end)):  # every cached variant of this row
                self._cache.discard((vy, cursor))
        self.refresh_lines(row * rpl, rpl)

    def share_cursor(self, other: TokenView) -> None:
        """Make `other` show this pane's cursor: one index for both, moved by either."""
        other._cursor = self._cursor
        self._cursor.views.append(other)

    @property
    def cursor(self) -> int:
        return self._cursor.index

    @cursor.setter
    def cursor(self, value: int) -> None:
        value = max(0, min(value, len(self._tops) - 1)) if self._tops else 0
        old = self._cursor.index
        if value == old:
            return
        self._cursor.index = value
        for view in self._cursor.views:
            view._show_cursor_move(old, value)
        self.post_message(self.CursorMoved(self, value))

    def _show_cursor_move(self, old: int, new: int) -> None:
        self._ensure_wrap()
        for index in (old, new):
            self._refresh_token(index)
        self.scroll_to_cursor()

    def scroll_to_cursor(self) -> None:
        if not self._starts:
            return
        rpl = self.rows_per_line
        top = self._rows_of_token(self.cursor) * rpl
        height = self.container_size.height - self.scrollbar_size_horizontal  # also right while the layout runs
        if top < self.scroll_offset.y or (height < rpl and top != self.scroll_offset.y):
            # a pane lower than one line of tokens (two rows a line, one row high) shows the line's first row: going
            # by its last row too, each call scrolled to the other one, and the app spun a core redrawing
            self.scroll_to(y=top, animate=False)
        elif height >= rpl and top + rpl > self.scroll_offset.y + height:
            self.scroll_to(y=top + rpl - height, animate=False)

    def _column_of(self, index: int) -> int:
        start = self._starts[self._rows_of_token(index)]
        return sum(self._widths[start:index])

    def _token_at(self, row: int, column: int) -> int:
        start = self._starts[row]
        end = self._starts[row + 1] if row + 1 < len(self._starts) else len(self._tops)
        x = 0
        for i in range(start, end):
            x += self._widths[i]
            if x > column:
                return i
        return end - 1

    def action_cursor(self, delta: int) -> None:
        self.cursor = self.cursor + delta

    def action_cursor_row(self, delta: int) -> None:
        self._ensure_wrap()
        if not self._starts:
            return
        row = self._rows_of_token(self.cursor) + delta
        if 0 <= row < len(self._starts):
            self.cursor = self._token_at(row, self._column_of(self.cursor))

    def action_cursor_page(self, delta: int) -> None:
        rows = max(1, self.scrollable_content_region.height // self.rows_per_line - 1)
        self._ensure_wrap()
        if not self._starts:
            return
        row = max(0, min(len(self._starts) - 1, self._rows_of_token(self.cursor) + delta * rows))
        self.cursor = self._token_at(row, self._column_of(self.cursor))

    def action_cursor_to_start(self) -> None:
        self.cursor = 0

    def action_cursor_to_end(self) -> None:
        self.cursor = len(self._tops) - 1

    def token_at_offset(self, x: int, y: int) -> int | None:
        """The token drawn at content offset (x, y) of the visible area, None past a row's end.

        Why from coordinates and not per-segment style meta: a meta style per token made every row's
        strip cost one `Style` addition per token, a third of a resize's repaint.
        """
        self._ensure_wrap()
        row = (y + int(self.scroll_offset.y)) // self.rows_per_line
        if not 0 <= row < len(self._starts):
            return None
        column = x + int(self.scroll_offset.x)
        start = self._starts[row]
        end = self._starts[row + 1] if row + 1 < len(self._starts) else len(self._tops)
        prefix = self._cells.prefix
        if not 0 <= column < prefix[end] - prefix[start]:
            return None
        return min(end - 1, bisect_right(prefix, prefix[start] + column) - 1)

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is not None:
            index = self.token_at_offset(offset.x, offset.y)
            if index is not None:
                self.cursor = index

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if round(old_value) != round(new_value):
            self.post_message(self.Scrolled(self, round(new_value)))
