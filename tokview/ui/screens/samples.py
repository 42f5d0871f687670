"""The samples screen: every stored sample, filtered and sorted, read page by page from the store.

Filters (status, finding code, run, tag, text) and the order become one `ListFilter` + `order_by`
for `Store.samples_page`; the count runs in a worker, pages load as they scroll into view. The screen
owns the marks (`Marks`): the samples a bulk verdict, tag or note applies to.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Input, Static

from tokview.store import STATUSES, SampleFilter
from tokview.store.queries import ListFilter
from tokview.ui.bindings import bindings
from tokview.ui.display import plain
from tokview.ui.search_terms import parse_search
from tokview.ui.selection import Marks
from tokview.ui.store_files import StoreFilesWatch
from tokview.ui.widgets.footer import KeysFooter
from tokview.ui.widgets.sample_list import SampleList
from tokview.ui.widgets.select import Select
from tokview.ui.worker_errors import ForwardsWorkerErrors
from tokview.untrusted_text import clipped, printable_line

if TYPE_CHECKING:
    from tokview.store import SampleRow, Store
    from tokview.ui.session import Session


class FilterChanges(TypedDict, total=False):
    """The `ListFilter` fields a filter box changes (typed, so mypy checks each against the filter)."""

    status: str | None
    code: str | None
    run_id: str | None
    text: str | None
    valid: bool | None
    max_acceptance: float | None
    max_nll: float | None
    tag: str | None


ORDERS = (
    "created_at",
    "-output_len",
    "output_len",
    "-n_errors",
    "status",
    "sample_id",
    "finish_reason",
    "acceptance_length",
    "-mean_nll",
)


class SamplesScreen(ForwardsWorkerErrors, Screen[None]):
    """The list with its filter bar; Enter opens the inspect screen (handled by the app)."""

    BINDINGS = bindings("samples")
    DEFAULT_CSS = """
    /* a narrow filter cuts its label with an ellipsis instead of wrapping it under the frame */
    SamplesScreen #filter-bar SelectCurrent Static#label { text-wrap: nowrap; text-overflow: ellipsis; }
    """

    class Counted(Message):
        def __init__(
            self, generation: int, count: int, total: int, reviews: tuple[Any, ...], failures: dict[str, Any]
        ) -> None:
            super().__init__()
            self.generation, self.count, self.total, self.reviews = generation, count, total, reviews
            self.failures = failures
            """A store without samples: its failed requests (`stats()["failures"]`), what the empty list says."""

    class Grown(Message):
        """The store's whole count and reviews version, read by the poll while the list was read as of
        `generation`."""

        def __init__(self, generation: int, total: int, reviews: tuple[Any, ...]) -> None:
            super().__init__()
            self.generation, self.total, self.reviews = generation, total, reviews

    poll_s = 2.0
    """How often the store's files are looked at (`os.stat`, no DuckDB): a batch or proxy writing into the store
    meanwhile left the list and its title at the count of the last read, without a word. Only when the file, its
    log or its parts folder changed is the store's count read (in a worker): a poll that opened the store every
    tick had other programs' connections refused while the app sat idle."""

    class Choices(Message):
        def __init__(self, codes: list[str], runs: list[str], tags: list[tuple[str, int]]) -> None:
            super().__init__()
            self.codes, self.runs, self.tags = codes, runs, tags

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session
        self.order = ORDERS[0]
        self.filters: ListFilter = ListFilter()
        self.marks = Marks()
        self._generation = 0
        self._count_shown = 0
        self._total_read = 0
        """The store's whole count when the list was last read."""
        self._total_now = 0
        self._reviews: tuple[Any, ...] = ()
        """The store's reviews version the rows were read at (`QueryRepository.reviews_version`)."""
        self._polling = False
        self._files = StoreFilesWatch(session.store)

    def compose(self) -> ComposeResult:
        yield Static("", id="samples-title")
        with Horizontal(id="filter-bar"):
            yield Input(placeholder="/ search", id="search")  # whole at 80 columns ("search tex" was cut)
            yield Select([(s, s) for s in STATUSES] + [("invalid", "invalid")], prompt="status", id="status")
            yield Select([], prompt="finding", id="code")
            yield Select([], prompt="run", id="run")
            yield Select([], prompt="tag", id="tag")
        yield SampleList(id="samples", marks=self.marks)
        yield KeysFooter()

    def on_mount(self) -> None:
        self.query_one(SampleList).focus()
        self.reload()
        self._load_choices()
        self.set_interval(self.poll_s, self._poll_unless_polling)

    @property
    def sample_list(self) -> SampleList:
        return self.query_one(SampleList)

    # -- loading -----------------------------------------------------------------------------
    def reload(self) -> None:
        self._generation += 1
        self._count(self._generation, self.filters)

    @work(thread=True, exclusive=True, group="samples-count", exit_on_error=False)
    def _count(self, generation: int, filters: SampleFilter) -> None:
        from tokview.store import StoreError

        store = self.session.store
        before = self._files.signature()  # taken first: a change during the read is polled for afterwards
        try:
            reviews = store.reads.reviews_version()  # first: a verdict made during the read is read again
            total = store.count_samples()  # first: a sample landing between the reads is counted as new, not lost
            count = store.count_samples(filters)
            failures = store.stats()["failures"] if not total else {}  # an empty store: only its failures tell why
        except StoreError:  # held: read again later even if no file changes (ctrl+r during a hold waited forever)
            self._files.read_failed()
            raise
        self._files.read_done(before)
        self.post_message(self.Counted(generation, count, total, reviews, failures))

    def _poll_unless_polling(self) -> None:
        """One poll at a time, and only once the store's files changed since the last one."""
        if self._polling or not self._files.changed():
            return
        self._polling = True
        self._poll(self._generation)

    @work(thread=True, group="samples-poll", exit_on_error=False)
    def _poll(self, generation: int) -> None:
        from tokview.store import StoreError

        try:
            reviews = self.session.store.reads.reviews_version()
            total = self.session.store.count_samples()
        except StoreError:  # held, moved or replaced: the keys that need the store say so, not a poll every tick
            self._files.read_failed()  # tried again on a change, or in 30 s: every tick kept a thread on the holder
            return
        finally:  # plain assignment from the worker: a bool, read on the UI thread at the next tick
            self._polling = False
        self.post_message(self.Grown(generation, total, reviews))

    @on(Grown)
    def _grown(self, event: Grown) -> None:
        if event.generation != self._generation:  # read before the list was read again: its count is older
            return
        if event.reviews != self._reviews:  # reviewed elsewhere (`tokview review`, another app): the rows again
            self._reviews = event.reviews
            self._reread_rows(self._generation, self.sample_list.loaded_ids())
        if event.total != self._total_now:
            self._total_now = event.total
            self._update_title()

    class Reread(Message):
        """The loaded rows as stored now, read by id after the store's reviews changed."""

        def __init__(self, generation: int, rows: dict[str, SampleRow]) -> None:
            super().__init__()
            self.generation, self.rows = generation, rows

    @work(thread=True, exclusive=True, group="samples-reread", exit_on_error=False)
    def _reread_rows(self, generation: int, sample_ids: list[str]) -> None:
        from tokview.store import StoreError

        try:
            rows = self.session.store.reads.rows_by_ids(sample_ids)
        except StoreError:  # held: the next change of the store's files reads them
            self._reviews = ()
            return
        self.post_message(self.Reread(generation, rows))

    @on(Reread)
    def _reread(self, event: Reread) -> None:
        if event.generation == self._generation:  # else the list was read again meanwhile: its rows are newer
            self.sample_list.replace_rows(event.rows)

    @work(thread=True, group="samples-choices", exit_on_error=False)
    def _load_choices(self) -> None:
        store = self.session.store
        self.post_message(self.Choices(store.finding_codes(), store.run_ids(), store.tag_counts()))

    @on(Counted)
    def _counted(self, event: Counted) -> None:
        if event.generation != self._generation:
            return
        store, filters, order = self.session.store, self.filters, self.order
        self.sample_list.reset(
            event.count,
            lambda offset, limit: store.samples_page(filters, order, offset, limit),
            self.empty_text(event.failures),
            ids=lambda offset, limit: store.reads.sample_ids_page(filters, order, offset, limit),
            find=lambda sample_id: store.reads.row_of(filters, order, sample_id),
        )
        self._total_read = self._total_now = event.total
        self._reviews = event.reviews
        self._update_title(event.count)

    @on(Choices)
    def _choices(self, event: Choices) -> None:
        tags = [(plain(f"{t} ({n})"), t) for t, n in event.tags]  # the SQL lowers both sides: any case finds it
        for select, options in (
            (self.query_one("#code", Select), [(plain(v), v) for v in event.codes]),
            (self.query_one("#run", Select), [(plain(v), v) for v in event.runs]),
            (self.query_one("#tag", Select), tags),
        ):
            keep = select.value  # new options reset a Select: a reload (ctrl+r, a running generate) kept no filter
            if keep is not Select.NULL and keep in [v for _label, v in options]:
                with select.prevent(Select.Changed):
                    select.set_options(options)
                    select.value = keep
            else:
                select.set_options(options)

    def empty_text(self, failures: dict[str, Any] | None = None) -> str:
        """What to do when the list is empty: clear the filter, or make samples (press g, run the demo); a store
        that holds only failed requests says how many and why (it read as a new store: "no samples yet")."""
        f = self.filters
        active = [
            name
            for name, v in (
                ("search", f.text),
                ("status", f.status),
                ("finding", f.code),
                ("run", f.run_id),
                ("tag", f.tag),
                ("invalid only", f.valid is False),
            )
            if v
        ]
        if active:
            return (
                f"No sample matches this {' + '.join(active)}.\n"
                "Clear the search box (/ then delete the text) or set the filters above back to blank."
            )
        if failures and failures.get("total"):
            reasons = sorted(failures.get("by_reason", {}).items(), key=lambda kv: -kv[1])
            said = "; ".join(f"{n} × {printable_line(clipped(reason, 120))}" for reason, n in reasons[:3])
            return (
                f"This store holds no samples: {failures['total']:,} requests failed ({said}).\n"
                "`tokview stats` lists them; fix the server or its settings, then press g (D checks the server first)."
            )
        return (
            "This store holds no samples yet.\n"
            "Press g to generate some from a server (D checks the server first),\n"
            "or quit and run `tokview demo` for a store filled from the built-in simulator."
        )

    def _update_title(self, count: int | None = None) -> None:
        if count is None:
            count = self._count_shown
        self._count_shown = count
        f = self.filters
        parts = [f"{count:,} samples"] + ([f"{len(self.marks):,} marked"] if len(self.marks) else [])
        if self._total_now != self._total_read:  # first: a narrow title is cut at its end
            parts.insert(1, f"{self._total_now - self._total_read:+,} in the store since: ctrl+r")
        parts.append(f"order {self.order}")
        parts += [
            f"{k}={v}"
            for k, v in (
                ("status", f.status),
                ("code", f.code),
                ("run", f.run_id),
                ("tag", f.tag),
                ("text", f.text),
                ("acc<", f.max_acceptance),
                ("nll<", f.max_nll),
            )
            if v is not None and v != ""
        ]
        if f.valid is False:
            parts.append("invalid only")
        self.query_one("#samples-title", Static).update(
            plain(f"{Path(self.session.store.path).name} · " + " · ".join(parts))
        )

    # -- filters -----------------------------------------------------------------------------
    def set_filters(self, **changes: Unpack[FilterChanges]) -> None:
        self.filters = replace(self.filters, **changes)
        self.reload()

    @on(Input.Changed, "#search")
    def _search(self, event: Input.Changed) -> None:
        text, max_acceptance, max_nll = parse_search(event.value.strip())  # `acc<=2.5`, `nll<=1.5` terms
        self.set_filters(text=text, max_acceptance=max_acceptance, max_nll=max_nll)

    @on(Input.Submitted, "#search")
    def _search_done(self) -> None:
        self.sample_list.focus()

    @on(Select.Changed, "#status")
    def _status(self, event: Select.Changed) -> None:
        value = None if event.value is Select.NULL else str(event.value)
        if value == "invalid":
            self.set_filters(status=None, valid=False)
        else:
            self.set_filters(status=value, valid=None)

    @on(Select.Changed, "#code")
    def _code(self, event: Select.Changed) -> None:
        self.set_filters(code=None if event.value is Select.NULL else str(event.value))

    @on(Select.Changed, "#run")
    def _run(self, event: Select.Changed) -> None:
        self.set_filters(run_id=None if event.value is Select.NULL else str(event.value))

    @on(Select.Changed, "#tag")
    def _tag(self, event: Select.Changed) -> None:
        self.set_filters(tag=None if event.value is Select.NULL else str(event.value))

    # -- marks -------------------------------------------------------------------------------
    @on(SampleList.MarksChanged)
    def _marks_changed(self) -> None:
        self._update_title()

    @on(SampleList.MarkAllAsked)
    def _mark_all(self) -> None:
        """`*`: everything the filter shows (read from the store: rows not loaded count too), or, with marks
        set, none."""
        from tokview.store import StoreError, bulk_review

        if len(self.marks):
            self.marks.clear()
        else:
            try:
                self.marks.add(bulk_review.select(self.session.store, self.filters))
            except StoreError as exc:  # held, deleted or replaced by another process: a notification, not a crash
                self.notify(str(exc), title="store", severity="error", timeout=8)
                return
        self.sample_list.marks_changed()
        self._update_title()

    def clear_marks(self) -> None:
        self.marks.clear()
        self.sample_list.marks_changed()
        self._update_title()

    # -- actions -----------------------------------------------------------------------------
    def action_focus_search(self) -> None:
        self.query_one("#search", Input).focus()

    def action_focus_list(self) -> None:
        self.sample_list.focus()

    def action_cycle_order(self) -> None:
        self.order = ORDERS[(ORDERS.index(self.order) + 1) % len(ORDERS)]
        self.reload()

    def action_reload(self) -> None:
        self.reload()
        self._load_choices()

    def current_sample_id(self) -> str | None:
        row = self.sample_list.row(self.sample_list.cursor)
        return row.sample_id if row is not None else None

    def follows_status(self) -> bool:
        """Whether a verdict can move a sample in this list or out of it (filtered or sorted by status)."""
        return bool(self.filters.status) or "status" in self.order

    def pending_search(self) -> PendingSearch:
        """What `]` searches (UI thread): read here, handed to a worker as plain values."""
        return PendingSearch(self.session.store, self.filters, self.order, self.sample_list.count)


@dataclass(frozen=True)
class PendingSearch:
    """The list as it is when `]` is pressed: the store, filter, order and row count to search through.

    Why a value and not a screen method: the search runs in a worker thread, and a worker must not
    read widgets (the row count lives on the list widget); the screen reads them once, on the UI thread.
    """

    store: Store
    filters: SampleFilter
    order: str
    count: int

    def after(self, index: int, anchor: str | None = None) -> tuple[int, str] | None:
        """(index, sample_id) of the first pending sample after row `index`, in list order (worker thread);
        `anchor`: the sample on row `index` before its verdict (`queries.first_pending_after`)."""
        found = self.store.reads.first_pending_after(self.filters, self.order, index, anchor)
        return found if found is not None and found[0] < self.count else None

    def row(self, sample_id: str) -> int | None:
        """The sample's row in the list (worker thread); None when the list does not show it."""
        return self.store.reads.row_of(self.filters, self.order, sample_id)
