"""A virtualised list of samples: Line API, pages fetched from the store in a thread as they scroll in.

Why not a DataTable: loading 100,000 rows into one takes seconds; here the list knows only the row
count and renders rows it has. Pages are loaded the way toolong loads lines: once per frame
(`render_lines`) the list names the 200-row pages around what is visible that it lacks; one reader
thread at a time loads them, nearest first, and posts each back; they land in an LRU of `MAX_PAGES`
pages, so a million-row store never sits in memory. A page loaded for an older filter is dropped (a
generation number travels with every request); a page scrolled past before its turn is never read.
"""

from __future__ import annotations

import re
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual import events, work
from textual.cache import LRUCache
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import var
from textual.scroll_view import ScrollView
from textual.strip import Strip

from tokview.core.findings import default_severity
from tokview.ui.bindings import bindings
from tokview.ui.display import capped, first_cells, last_cells, pad_cells, shown
from tokview.ui.selection import Marks
from tokview.ui.widgets.scrollbar import OnePassScrolling
from tokview.ui.widgets.token_view import readable_on
from tokview.ui.worker_errors import ForwardsWorkerErrors

if TYPE_CHECKING:
    from tokview.store import SampleRow, Store

PAGE = 200
_RANK = {"error": 0, "warn": 1, "info": 2}


def side_segments(row: SampleRow, base: Style) -> list[Segment]:
    """`acc 2.33` / `nll 0.41` when the sample has spec-decode metrics / a target score (else nothing)."""
    out = []
    if row.acceptance_length is not None:
        out.append(Segment(f"acc {row.acceptance_length:4.2f} ", base))
    if row.mean_nll is not None:
        out.append(Segment(f"nll {row.mean_nll:4.2f} ", base))
    return out


def badge_order(codes: Sequence[str]) -> list[str]:
    """Errors first, then warnings, then info: the badges that matter stay visible in a narrow column."""
    return sorted(codes, key=lambda c: (_RANK.get(default_severity(c), 3), c))


Fetch = Callable[[int, int], Sequence["SampleRow"]]
FetchIds = Callable[[int, int], Sequence[str]]
FindRow = Callable[[str], int | None]
"""The row a sample is on in the list now (None: not in it)."""
MAX_PAGES = 16
"""Pages the list keeps (3,200 rows); the least recently shown goes first."""


class PageRequests:
    """The pages the list wants, shared by the UI thread and the one reader thread.

    Why replace the whole wish list each frame rather than queue every request: a page scrolled past
    before the reader reached it is simply no longer wanted, so fast scrolling never builds a backlog.
    The wish carries the fetch function of its generation (a reader that outlives a filter change
    reads the new pages with the new filter). Pages being read are remembered, so a page is never read
    twice at once; whether a reader must be started is decided under the lock, so there is never a second.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wanted: list[tuple[int, int]] = []
        self._fetch: Fetch | None = None
        self._reading: set[tuple[int, int]] = set()
        self._idle = True
        self._failed: int | None = None
        """A generation whose read failed: not read again until the list is reset (ctrl+r, a new filter)."""

    def want(self, generation: int, pages: Sequence[int], fetch: Fetch | None = None) -> bool:
        """The pages to read now, most wanted first, with `fetch` (UI thread); True when a reader must start."""
        with self._lock:
            failed = generation == self._failed  # every frame would fail again, and say so again
            self._wanted = [] if failed else [(generation, p) for p in pages if (generation, p) not in self._reading]
            self._fetch = fetch
            start = bool(self._wanted) and fetch is not None and self._idle
            if start:
                self._idle = False
            return start

    def take(self) -> tuple[int, int, Fetch] | None:
        """The next (generation, page, fetch) to read (reader thread); None, and the reader stops, when none is left."""
        with self._lock:
            if not self._wanted or self._fetch is None:
                self._idle = True
                return None
            item = self._wanted.pop(0)
            self._reading.add(item)
            return (*item, self._fetch)

    def done(self, item: tuple[int, int]) -> None:
        """The page landed in the list (UI thread): from now on the list has it, or may want it again."""
        with self._lock:
            self._reading.discard(item)

    def stopped(self, generation: int) -> None:
        """The reader ended on an error reading for `generation`: the next generation may start another."""
        with self._lock:
            self._reading.clear()
            self._failed = generation
            self._idle = True


STATUS_GLYPH = {"approved": "✓", "rejected": "✗", "pending": "·"}
FINISH_SHORT = {"tool_calls": "tools", "content_filter": "filter"}
"""Finish reasons longer than their 6 cells, said whole in fewer: every tool-calling turn read `tool_…`."""
MARK_GLYPH = "●"


def column_widths(width: int) -> dict[str, int]:
    """Column -> cells for a list `width` cells wide. As it narrows, the low-value columns go first (the
    prompt length, then the finish reason; verdict and validity become their glyphs), so the sample id, the
    run and the findings keep their room: at 80 columns an id still shows the part that tells rows apart."""
    if width >= 100:
        cols = {"mark": 2, "verdict": 11, "valid": 6, "finish": 7, "prompt": 7, "output": 7}
    elif width >= 88:
        cols = {"mark": 2, "verdict": 11, "valid": 6, "finish": 7, "output": 7}
    else:
        cols = {"mark": 2, "verdict": 2, "valid": 3, "output": 7}
    rest = max(0, width - sum(cols.values()))
    run_w = max(6, min(16, rest // 5)) if rest >= 40 else 0
    tags_w = max(5, min(16, rest // 6)) if rest - run_w >= 36 else 0
    id_w = max(12, min(48, (rest - run_w - tags_w) * 3 // 5))
    return cols | {"run": run_w, "sample": id_w, "tags": tags_w, "findings": max(0, rest - run_w - tags_w - id_w)}


def shared_affixes(values: Sequence[str]) -> tuple[int, int]:
    """(common prefix, common suffix) lengths of `values` (0, 0 for fewer than two distinct ones): what every
    row shares says nothing about a row, so a narrow column gives it up first."""
    distinct = set(values)
    if len(distinct) < 2:
        return 0, 0
    prefix = _common_prefix(distinct)
    suffix = _common_prefix({v[::-1] for v in distinct})
    shortest = min(len(v) for v in distinct)
    return prefix, max(0, min(suffix, shortest - prefix))


def _common_prefix(values: set[str]) -> int:
    """How many leading characters all `values` share (the smallest and the largest share the fewest)."""
    first, last = min(values), max(values)
    n = 0
    while n < len(first) and first[n] == last[n]:
        n += 1
    return n


def fit_distinct(text: str, width: int, prefix: int, suffix: int) -> str:
    """Fit `text` in `width` keeping what differs from its neighbours (the middle between the shared prefix
    and suffix), then the end of the prefix and the start of the suffix as room allows; `…` marks a cut. Widths are
    terminal cells (`prefix` and `suffix` are characters): a CJK id measured by len() pushed its row's columns."""
    if cell_len(text) <= width:
        return pad_cells(text, width)
    core = text[prefix : len(text) - suffix]
    room = width - cell_len(core) - (prefix > 0) - (suffix > 0)
    if room < 0 or not core:  # the part that differs does not fit: what rows share goes first, the run hash too
        return fit_middle(_without_run_hash(core if core else text[prefix:] if prefix else text), width)
    before, after = text[:prefix], text[len(text) - suffix :]
    pre = min(cell_len(before), room // 2)
    post = min(cell_len(after), room - pre)
    pre = min(cell_len(before), room - post)
    head, tail = last_cells(before, pre), first_cells(after, post)
    head = ("…" if head != before else "") + head
    tail += "…" if tail != after else ""
    return pad_cells(first_cells(head + core + tail, width), width)


def _fit(text: str, width: int) -> str:
    """`text` cut (`capped`) and padded to exactly `width` terminal cells."""
    return pad_cells(capped(text, width), width)


_RUN_HASH = re.compile(r"@[0-9a-f]{8,}(?=_gen\d+$|$)")


def _without_run_hash(text: str) -> str:
    """A sample id with its settings hash cut (`task#turn1@4b8746eb17e0_gen0` → `task#turn1@…_gen0`): rows of one run
    share it, and kept at the end of a cut id it was all a narrow column showed of turns of one prompt."""
    return _RUN_HASH.sub("@…", text)


def fit_middle(text: str, width: int) -> str:
    """Cut in the middle to `width` terminal cells, keeping more of the end: ids differ in their suffix (`typed-…@run_gen2`)."""
    if cell_len(text) <= width:
        return pad_cells(text, width)
    if width < 4:
        return pad_cells(first_cells(text, width), width)
    head = (width - 1) // 3
    return pad_cells(first_cells(text, head) + "…" + last_cells(text, width - 1 - head), width)


class SampleList(ForwardsWorkerErrors, OnePassScrolling, ScrollView, can_focus=True):
    """Rows of `SampleRow`s with a cursor; Enter opens one."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "sample-list--header",
        "sample-list--cursor",
        "sample-list--approved",
        "sample-list--rejected",
        "sample-list--invalid",
        "sample-list--badge-error",
        "sample-list--badge-warn",
        "sample-list--badge-info",
        "sample-list--loading",
        "sample-list--empty",
        "sample-list--mark",
        "sample-list--tags",
    }
    DEFAULT_CSS = """
    SampleList { overflow-x: hidden; background: $surface; }
    SampleList > .sample-list--header { background: $panel; text-style: bold; }
    SampleList > .sample-list--cursor { background: $primary 50%; }
    SampleList:focus > .sample-list--cursor { background: $primary; color: $text; }
    SampleList > .sample-list--approved { color: $text-success; }
    SampleList > .sample-list--rejected { color: $text-error; }
    SampleList > .sample-list--invalid { color: $text-warning; }
    SampleList > .sample-list--badge-error { color: $text-error; text-style: bold; }
    SampleList > .sample-list--badge-warn { color: $text-warning; }
    SampleList > .sample-list--badge-info { color: $text-muted; }
    SampleList > .sample-list--loading { color: $text-muted; }
    SampleList > .sample-list--empty { color: $text; text-style: italic; }
    SampleList > .sample-list--mark { color: $accent; text-style: bold; }
    SampleList > .sample-list--tags { color: $text-accent; }
    SampleList:light > .sample-list--tags { color: #3b2a7a; }
    /* light themes: the stock warning/error/success colours are too light on a light surface */
    SampleList:light > .sample-list--approved { color: #1d5e20; }
    SampleList:light > .sample-list--rejected { color: #a11212; }
    SampleList:light > .sample-list--badge-error { color: #a11212; }
    /* warnings: #6b3500 is painted #5f5f00 in 256 colours (4.4:1); #5f0000 is a cube colour, a dark brown */
    SampleList:light > .sample-list--invalid { color: #5f0000; }
    SampleList:light > .sample-list--badge-warn { color: #5f0000; }
    SampleList:light > .sample-list--badge-info { color: #4a4a4a; }
    SampleList:light > .sample-list--loading { color: #4a4a4a; }
    """
    BINDINGS = bindings("sample list")

    cursor: var[int] = var(0, init=False)

    class Opened(Message):
        def __init__(self, sample_id: str) -> None:
            super().__init__()
            self.sample_id = sample_id

    class MarksChanged(Message):
        """The marks changed (the screen's title counts them)."""

    class MarkAllAsked(Message):
        """`*`: mark everything the filter shows, or clear the marks (the screen knows the filter)."""

    class PageLoaded(Message):
        def __init__(self, generation: int, page: int, rows: list[SampleRow]) -> None:
            super().__init__()
            self.generation, self.page, self.rows = generation, page, rows

    def __init__(self, *, id: str | None = None, max_pages: int = MAX_PAGES, marks: Marks | None = None) -> None:
        super().__init__(id=id)
        self.marks = marks if marks is not None else Marks()
        self._affixes: dict[str, tuple[int, int]] = {}
        """column -> (shared prefix, shared suffix) over the loaded rows' ids and runs."""
        self.count = 0
        self.max_pages = max_pages
        self.page_loads: Counter[int] = Counter()
        """How many times each page was read from the store since the last `reset` (tests, benchmarks)."""
        self._fetch: Fetch | None = None
        self._fetch_ids: FetchIds | None = None
        self._find_row: FindRow | None = None
        self._generation = 0
        self._pages: OrderedDict[int, list[SampleRow]] = OrderedDict()
        self._requests = PageRequests()
        self._cache: LRUCache[tuple[int, int, bool, bool], Strip] = LRUCache(512)
        self.empty_text = ""
        """What to say when there are no rows (set by the screen: an empty store and a filter with no hits
        need different advice)."""

    # -- data ---------------------------------------------------------------------------------
    def reset(
        self, count: int, fetch: Fetch, empty_text: str = "", ids: FetchIds | None = None, find: FindRow | None = None
    ) -> None:
        """A new filter or order: forget every page; rows load again as they become visible. `ids`: the ids of a
        range of rows alone (what `M` marks), else read through `fetch`. `find`: where a sample is in the list now
        (the last mark's sample, when a new filter or order took it off its row)."""
        self.empty_text = empty_text
        self._generation += 1
        self.count, self._fetch, self._fetch_ids, self._find_row = count, fetch, ids, find
        self._pages.clear()
        self._affixes.clear()
        self._requests.want(self._generation, [])
        self.page_loads.clear()
        self._cache.clear()
        self.set_reactive(SampleList.cursor, min(self.cursor, max(0, count - 1)))
        self.virtual_size = Size(self.size.width, count + 1)
        self.refresh()

    def loaded_ids(self) -> list[str]:
        """The sample ids of the rows held now (what `replace_rows` can update)."""
        return [r.sample_id for page in self._pages.values() for r in page]

    def replace_rows(self, rows: dict[str, SampleRow]) -> int:
        """Put these rows (read again by id: a verdict, note or tag made elsewhere) where their samples are, each
        changed one repainted; rows stay where they are, as after the app's own verdicts. How many changed."""
        changed = 0
        for number, page in self._pages.items():
            for at, old in enumerate(page):
                new = rows.get(old.sample_id)
                if new is not None and new != old:
                    page[at] = new
                    self.repaint_row(number * PAGE + at)
                    changed += 1
        return changed

    @property
    def loaded_pages(self) -> int:
        """Pages held in memory now (never more than `max_pages`)."""
        return len(self._pages)

    def row(self, index: int) -> SampleRow | None:
        page = self._pages.get(index // PAGE)
        return page[index % PAGE] if page is not None and index % PAGE < len(page) else None

    def update_row(self, index: int, row: SampleRow) -> None:
        """Replace one loaded row (a verdict changed its status) and repaint that line only."""
        page = self._pages.get(index // PAGE)
        if page is not None and index % PAGE < len(page):
            page[index % PAGE] = row
            self.repaint_row(index)

    def repaint_row(self, index: int) -> None:
        """Forget one row's cached line (its status or mark changed) and repaint it."""
        width = self.scrollable_content_region.width  # the width lines are cached under (see render_line)
        for cur in (True, False):
            for marked in (True, False):
                self._cache.discard((index, width, cur, marked))
        self.refresh_lines(index + 1, 1)

    def _want_visible_pages(self) -> None:
        """Once per frame: ask for the missing pages from half a page above to half a page below the view,
        the ones on screen first; mark the ones on screen as recently used."""
        if self._fetch is None or not self.count:
            return
        top = int(self.scroll_offset.y)
        bottom = min(self.count - 1, top + max(1, self.size.height))
        shown = range(top // PAGE, bottom // PAGE + 1)
        near = range(max(0, top - PAGE // 2) // PAGE, min(self.count - 1, bottom + PAGE // 2) // PAGE + 1)
        for page in shown:
            if page in self._pages:
                self._pages.move_to_end(page)
        missing = [p for p in (*shown, *near) if p not in self._pages]
        if self._requests.want(self._generation, list(dict.fromkeys(missing)), self._fetch):
            self._read_pages(self._requests)

    @work(thread=True, exclusive=True, group="sample-pages", exit_on_error=False)
    def _read_pages(self, requests: PageRequests) -> None:
        """The one reader: reads what the list still wants, page by page, until nothing is left.

        Touches no widget: it takes the wishes (with the fetch function the screen built) from
        `requests`, and every page goes back to the UI thread as a message."""
        generation = -1
        try:
            while (wish := requests.take()) is not None:
                generation, page, fetch = wish
                rows = list(fetch(page * PAGE, PAGE))
                self.post_message(self.PageLoaded(generation, page, rows))  # `done` when it lands
        except BaseException:
            requests.stopped(generation)  # the error goes on to the worker's handler; a reset reads again
            raise

    def on_sample_list_page_loaded(self, event: PageLoaded) -> None:
        self._requests.done((event.generation, event.page))
        if event.generation != self._generation:
            return
        self._pages[event.page] = event.rows
        self._pages.move_to_end(event.page)
        self.page_loads[event.page] += 1
        while len(self._pages) > self.max_pages:
            self._pages.popitem(last=False)
        self._update_affixes()
        self.refresh()

    def _update_affixes(self) -> None:
        rows = [r for page in self._pages.values() for r in page]
        affixes = {
            "sample": shared_affixes([r.sample_id for r in rows]),
            "run": shared_affixes([str(r.run_id or "—") for r in rows]),
        }
        if affixes != self._affixes:
            self._affixes = affixes
            self._cache.clear()

    # -- rendering ------------------------------------------------------------------------------
    def render_lines(self, crop: Region) -> list[Strip]:
        self._want_visible_pages()
        return super().render_lines(crop)

    HEADERS: ClassVar[dict[str, tuple[str, str]]] = {
        "mark": ("", ""),
        "verdict": ("verdict", "v"),
        "valid": ("valid", "ok"),
        "finish": ("finish", "finish"),
        "prompt": ("prompt", "prompt"),
        "output": ("output", "output"),
        "run": ("run", "run"),
        "sample": ("sample", "sample"),
        "tags": ("tags", "tags"),
        "findings": ("findings", "findings"),
    }

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        if y == 0:
            text = "".join(
                _fit(self.HEADERS[name][0] if cell_len(self.HEADERS[name][0]) < w else self.HEADERS[name][1], w)
                for name, w in column_widths(width).items()
                if w
            )
            return Strip(
                [
                    Segment(
                        _fit(text, width),
                        self.rich_style + self.get_component_rich_style("sample-list--header", partial=True),
                    )
                ]
            )
        index = y - 1 + int(self.scroll_offset.y)
        if self.count == 0 and self.empty_text:
            lines = self.empty_text.splitlines()
            text = "  " + lines[y - 2] if 0 <= y - 2 < len(lines) else ""
            return Strip(
                [
                    Segment(
                        _fit(text, width),
                        self.rich_style + self.get_component_rich_style("sample-list--empty", partial=True),
                    )
                ]
            )
        if index >= self.count:
            return Strip.blank(width, self.rich_style)
        row = self.row(index)
        is_cursor = index == self.cursor
        key = (index, width, is_cursor, row is not None and row.sample_id in self.marks)
        cached = self._cache.get(key)
        if cached is not None and row is not None:
            return cached
        base = self.rich_style
        if is_cursor:
            base = base + self.get_component_rich_style("sample-list--cursor", partial=True)
        if row is None:
            return Strip(
                [
                    Segment(
                        _fit("  …", width), base + self.get_component_rich_style("sample-list--loading", partial=True)
                    )
                ]
            )
        segments = self._row_segments(row, width, base)
        if is_cursor:  # on the cursor's background only black or white reads: the colours give way
            fg = Style(color=readable_on(base.bgcolor))
            segments = [Segment(seg.text, (seg.style or Style()) + fg) for seg in segments]
        strip = Strip(segments).crop_extend(0, width, base)
        self._cache.set(key, strip)
        return strip

    def _row_segments(self, row: SampleRow, width: int, base: Style) -> list[Segment]:
        cols = column_widths(width)
        compact = cols["verdict"] < 10
        status_style = (
            base + self.get_component_rich_style(f"sample-list--{row.status}", partial=True)
            if row.status in ("approved", "rejected")
            else base
        )
        valid_style = base if row.valid else base + self.get_component_rich_style("sample-list--invalid", partial=True)
        marked = row.sample_id in self.marks
        mark_style = base + self.get_component_rich_style("sample-list--mark", partial=True)
        glyph = STATUS_GLYPH.get(row.status, "?")
        segments = [
            Segment(f"{MARK_GLYPH} " if marked else "  ", mark_style),
            Segment(f"{glyph} " if compact else _fit(f"{glyph} {row.status}", 10) + " ", status_style),
            Segment(("✓  " if row.valid else "✗  ") if compact else ("✓ yes " if row.valid else "✗ no  "), valid_style),
        ]
        if "finish" in cols:
            finish = row.finish_reason or "—"
            segments.append(Segment(_fit(shown(FINISH_SHORT.get(finish, finish)), 6) + " ", base))
        if "prompt" in cols:
            segments.append(Segment(f"{row.prompt_len:>6} ", base))
        segments.append(Segment(f"{row.output_len:>6} ", base))
        if not compact:
            segments += side_segments(row, base)
        if cols["run"]:
            run = fit_distinct(shown(row.run_id or "—"), cols["run"] - 1, *self._affixes.get("run", (0, 0)))
            segments.append(Segment(run + " ", base))
        sample = fit_distinct(shown(row.sample_id), cols["sample"] - 1, *self._affixes.get("sample", (0, 0)))
        segments.append(Segment(sample + " ", status_style))
        if cols["tags"]:
            tags = ",".join(map(shown, getattr(row, "tags", ())))
            tag_style = base + self.get_component_rich_style("sample-list--tags", partial=True)
            segments.append(Segment(_fit(tags, cols["tags"] - 1) + " ", tag_style))
        return segments + self._badges(row.codes, cols["findings"], base)

    def _badges(self, codes: Sequence[str], width: int, base: Style) -> list[Segment]:
        """Finding codes, most severe first, each coloured by its severity, cut to the column width."""
        segments: list[Segment] = []
        used = 0
        for code in badge_order(codes):
            text = (" " if segments else "") + code
            if used + cell_len(text) > width:
                segments.append(Segment(_fit(text, width - used) if width - used > 1 else "…"[: width - used], base))
                used = width
                break
            severity = default_severity(code)
            segments.append(
                Segment(text, base + self.get_component_rich_style(f"sample-list--badge-{severity}", partial=True))
            )
            used += cell_len(text)
        segments.append(Segment(" " * (width - used), base))
        return segments

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._cache.clear()

    # -- cursor ---------------------------------------------------------------------------------
    def validate_cursor(self, value: int) -> int:
        return max(0, min(value, self.count - 1)) if self.count else 0

    def watch_cursor(self, old: int, new: int) -> None:
        self.refresh_lines(old + 1, 1)
        self.refresh_lines(new + 1, 1)
        visible = self.scrollable_content_region.height - 1
        if new < self.scroll_offset.y:
            self.scroll_to(y=new, animate=False)
        elif new >= self.scroll_offset.y + visible:
            self.scroll_to(y=new - visible + 1, animate=False)

    def action_move(self, delta: int) -> None:
        self.cursor += delta

    def action_page(self, delta: int) -> None:
        self.cursor += delta * max(1, self.scrollable_content_region.height - 2)

    def action_first(self) -> None:
        self.cursor = 0

    def action_last(self) -> None:
        self.cursor = self.count - 1

    def action_toggle_mark(self) -> None:
        row = self.row(self.cursor)
        if row is None:
            self.app.bell()
            return
        self.marks.toggle(row.sample_id, self.cursor)
        self.repaint_row(self.cursor)
        self.post_message(self.MarksChanged())
        self.cursor += 1

    def action_mark_range(self) -> None:
        """Mark every row from the last one marked (else the cursor's) to the cursor. Rows not loaded are read from
        the store: their ids alone, in one query (a range of 169,000 rows read page by page, rows and tags, held
        the UI for 54 s)."""
        if self._fetch is None or not self.count:
            return
        from tokview.store import StoreError

        ids: list[str] = []
        try:
            anchor = self._anchor_row()
            low, high = sorted((anchor, self.cursor))
            loaded = range(low // PAGE, high // PAGE + 1)
            if self._fetch_ids is not None and not all(page in self._pages for page in loaded):
                ids = list(self._fetch_ids(low, high - low + 1))
            else:
                for page in loaded:
                    rows = self._pages.get(page) or list(self._fetch(page * PAGE, PAGE))
                    ids += [r.sample_id for i, r in enumerate(rows, page * PAGE) if low <= i <= high]
        except StoreError as exc:  # held, deleted or replaced by another process: a notification, not a crash
            self.notify(str(exc), title="store", severity="error", timeout=8)
            return
        self.marks.add(ids)
        here = self.row(self.cursor)
        at = self.cursor - low  # the cursor's own id in the range read (either end of it)
        self.marks.set_anchor(
            self.cursor, here.sample_id if here is not None else (ids[at] if 0 <= at < len(ids) else None)
        )
        self._cache.clear()
        self.refresh()
        self.post_message(self.MarksChanged())

    def _anchor_row(self) -> int:
        """The row the last mark's sample is on now, else the cursor's: a new filter or order moves it, and a range
        from its old row number marked samples nobody chose (the sample itself not in the list any more)."""
        index, sample_id = self.marks.anchor, self.marks.anchor_id
        if index is None or sample_id is None:
            return self.cursor
        if index < self.count:
            row = self.row(index)
            held = [row.sample_id] if row is not None else (self._fetch_ids(index, 1) if self._fetch_ids else [])
            if list(held) == [sample_id]:
                return index
        found = self._find_row(sample_id) if self._find_row is not None else None
        return found if found is not None and found < self.count else self.cursor

    def action_mark_all(self) -> None:
        self.post_message(self.MarkAllAsked())

    def marks_changed(self) -> None:
        """Repaint after the marks changed from outside (marked all, cleared after an action)."""
        self._cache.clear()
        self.refresh()

    def action_open(self) -> None:
        row = self.row(self.cursor)
        if row is not None:
            self.post_message(self.Opened(row.sample_id))

    def action_copy_id(self) -> None:
        row = self.row(self.cursor)
        if row is None:
            self.app.bell()
            return
        self.app.copy_to_clipboard(row.sample_id)
        self.notify(f"copied the sample id {row.sample_id}", timeout=2)

    def action_compare(self) -> None:
        """Two marked samples are compared with each other; otherwise the cursor's sample with its prompt's
        first sibling (another run's first, as inspect's d), looked up in a thread (a store query)."""
        session = getattr(self.app, "session", None)
        if session is None:
            return
        if len(self.marks) == 2:
            self._open_compare(*self.marks.ids())
            return
        row = self.row(self.cursor)
        if row is None:
            self.app.bell()
            return
        self._find_sibling(session.store, row.sample_id)

    @work(thread=True, exclusive=True, group="list-compare", exit_on_error=False)
    def _find_sibling(self, store: Store, sample_id: str) -> None:
        from tokview.store.run_stats import siblings

        self.post_message(self.SiblingFound(sample_id, siblings(store, sample_id)))

    class SiblingFound(Message):
        def __init__(self, sample_id: str, found: list[tuple[str, str | None]]) -> None:
            super().__init__()
            self.sample_id, self.found = sample_id, found

    def on_sample_list_sibling_found(self, event: SiblingFound) -> None:
        if not event.found:
            self.notify(
                f"no other sample of {event.sample_id}'s prompt to compare with (mark two samples to compare them)",
                timeout=3,
            )
            return
        other, run = event.found[0]
        self.notify(f"comparing with {other} from {run or 'no run'}", timeout=2)
        self._open_compare(event.sample_id, other)

    def _open_compare(self, left: str, right: str) -> None:
        from tokview.ui.screens.compare import CompareScreen

        self.app.push_screen(CompareScreen(self.app.session, left, right))  # type: ignore[attr-defined]

    def on_click(self, event: events.Click) -> None:
        if event.y >= 1:
            self.cursor = event.y - 1 + int(self.scroll_offset.y)
            if event.chain >= 2:
                self.action_open()
