"""The conversations `tokview proxy` recorded: a list of sessions, live, and each session as its chain of turns.

`SessionsScreen` lists every proxied session (its id, the harness's user-agent, turns, how long the context
has grown, output tokens, findings, failed requests), the most recently active first. `SessionTurnsScreen`
shows one session's turns in order; enter opens a turn in the inspect screen (escape comes back here).

Live: while a screen is open it looks at the store's files every `poll_s` (`StoreFilesWatch`: `os.stat`, no
DuckDB), and only when they changed reads `sessions_version` in a worker, reloading when the proxy landed a turn
or a failure, or a turn was reviewed. A query every tick took the store from the proxy's own landings while the
screen sat open. Reads happen in thread workers (the SQL is in `store/sessions_query.py`); handlers on the UI
thread own the tables.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual import on, work
from textual.app import ComposeResult
from textual.coordinate import Coordinate
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Static
from textual.worker import Worker

from tokview.core.finding_rules import ERROR, INFO, RULES, WARN
from tokview.core.findings import FINDING_CODES  # noqa: F401  # every check registered in RULES
from tokview.store.errors import StoreError
from tokview.store.sessions_query import (
    SessionRow,
    SessionTotals,
    TurnRow,
    list_sessions,
    session_label,
    session_totals,
    session_turns,
    sessions_version,
)
from tokview.ui.bindings import bindings
from tokview.ui.display import capped, capped_middle, cell, plain
from tokview.ui.store_files import StoreFilesWatch
from tokview.ui.widgets.footer import KeysFooter
from tokview.ui.widgets.sized_table import Cell, SizedTable
from tokview.ui.widgets.table_sync import sync_rows
from tokview.ui.worker_errors import ForwardsWorkerErrors, failure_text
from tokview.wording import plural

if TYPE_CHECKING:
    from rich.text import Text

    from tokview.ui.session import Session

POLL_S = 1.0
"""How often an open sessions screen looks at the store's files (the proxy lands within ~0.5 s)."""

SESSION_COLUMNS = ("session", "turns", "context", "output", "findings", "invalid", "failed", "harness", "last turn")
"""The numbers right after the name, the harness and the time last: at 80 columns the name and the counts show."""
TURN_COLUMNS = ("turn", "sample", "prompt", "output", "finish", "status", "findings", "latency", "answer")
FINDINGS_CELLS = 32
"""A turn's finding codes, cut with `…` (a turn with three pushed the latency and the answer off a 160-column screen)."""


def label_cells(width: int) -> int:
    """Cells for a session's name on a screen `width` wide: 48 when there is room, else what leaves the counts
    in view (at 80 columns the name took 50 cells and every count was off-screen)."""
    return 48 if width >= 140 else max(16, width - 58)


def session_cells(row: SessionRow, label_width: int = 48) -> tuple[str | Text, ...]:
    return (
        cell(capped_middle(row.label, label_width)),
        str(row.turns),
        f"{row.context:,}",
        f"{row.output_tokens:,}",
        str(row.findings),
        str(row.invalid),
        str(row.failed),
        cell(capped(row.harness or "—", 24)),
        row.last.strftime("%Y-%m-%d %H:%M:%S"),
    )


def short_ids(sample_ids: list[str]) -> dict[str, str]:
    """Each id without the part every one of them shares, up to its last `:` (`proxy:proxy-…-382f14:0000001` →
    `…:0000001`): a session's turns share their run's long prefix, which said nothing about a turn."""
    distinct = sorted(set(sample_ids))
    if len(distinct) < 2:
        return {i: i for i in distinct}
    first, last = distinct[0], distinct[-1]  # the common prefix of a sorted list is its ends'
    shared = next((k for k, (a, b) in enumerate(zip(first, last)) if a != b), min(len(first), len(last)))
    cut = first.rfind(":", 0, shared) + 1
    return {i: ("…" + i[cut - 1 :]) if cut > 1 else i for i in distinct}


def by_severity(codes: list[str]) -> list[str]:
    """Errors first, then warnings, then notes (each in stored order): cut to its column, a turn's list showed the
    two notes every Kimi turn has (`think_open_in_prompt`, `parser_hidden_ids`) and hid its error."""
    rank = {ERROR: 0, WARN: 1}
    return sorted(codes, key=lambda code: rank.get(RULES[code].severity if code in RULES else INFO, 2))


def turn_cells(row: TurnRow, shown_id: str | None = None) -> tuple[str | Text, ...]:
    words = " ".join(row.answer.split())
    answer = cell(capped(words, 61))  # 60 cells and `…`: by cells, a CJK answer cut at 60 characters took 120
    sample = cell(shown_id or row.sample_id)
    if row.failed:  # no ids, no turn: the reason where the answer goes
        return ("—", sample, "—", "—", "—", "failed", "—", "—", answer)
    return (
        str(row.turn),
        sample,
        f"{row.prompt_len:,}",
        f"{row.output_len:,}",
        cell(row.finish_reason or "—"),
        row.status if row.valid else f"{row.status} (invalid)",
        cell(capped(", ".join(by_severity(row.codes)) or "none", FINDINGS_CELLS)),
        "—" if row.latency_s is None else f"{row.latency_s:.2f} s",
        answer,
    )


class _LivePolling(ForwardsWorkerErrors, Screen[None]):
    """Loads its rows in a worker, and again whenever the store's proxied sessions change."""

    poll_s = POLL_S

    class Changed(Message):
        """The store's proxied sessions changed since the last load (posted by the poll worker)."""

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session
        self._version: tuple[object, ...] | None = None
        self._trouble = False
        """The last poll could not read the store (said once)."""
        self._files = StoreFilesWatch(session.store)
        self._polling = False
        self.loads = 0
        """Loads shown so far (what the tests wait on)."""
        self._shown: dict[str, tuple[str | Text, ...]] = {}
        """What the table shows: row key → cells (`sync_rows`)."""

    def on_mount(self) -> None:
        self.action_reload()
        self.set_interval(self.poll_s, self._poll_on_change)

    def action_reload(self) -> None:
        self._load()

    def action_close(self) -> None:
        self.app.pop_screen()

    @work(thread=True, exclusive=True, group="sessions-load", exit_on_error=False)
    def _load(self) -> None:
        before = self._files.signature()  # taken first: a change during the read is polled for afterwards
        try:
            version = sessions_version(self.session.store)  # read first: a turn landing meanwhile reloads
            loaded = self.read_rows()
        except StoreError:  # held: read again later even if no file changes (ctrl+r during a hold waited forever)
            self._files.read_failed()
            raise
        self._files.read_done(before)
        self._version = version  # only once shown: a failed load's rows are still to be read
        self.post_message(loaded)

    def read_rows(self) -> Message:
        """The screen's rows as its Loaded message (worker thread)."""
        raise NotImplementedError

    def _poll_on_change(self) -> None:
        """One poll at a time, and only once the store's files changed since the last one."""
        if self._polling or not self._files.changed():
            return
        self._polling = True
        self._poll()

    @work(thread=True, group="sessions-poll", exit_on_error=False)
    def _poll(self) -> None:
        try:
            version = sessions_version(self.session.store)
        except StoreError as exc:  # deleted, moved, replaced, held: said once, not every poll (it may be back)
            self._files.read_failed()
            if not self._trouble:
                self._trouble = True
                self.app.call_from_thread(self.app.notify, str(exc), title="store", severity="error", timeout=8)
            return
        finally:  # plain assignment from the worker: a bool, read on the UI thread at the next tick
            self._polling = False
        self._trouble = False
        if version != self._version:  # None: no load succeeded yet. Only a load sets it: its rows are what is shown
            self.post_message(self.Changed())

    @on(Changed)
    def _changed(self) -> None:
        self._load()

    def _table(self) -> DataTable[Cell]:
        return self.query_one(DataTable)

    def _keep_cursor(
        self, table: DataTable[Cell], rows: list[tuple[str, tuple[str | Text, ...]]], order_column: int
    ) -> None:
        """Bring `table` to the (key, cells) rows, changing only what changed (`sync_rows`: a refill of 5,000 rows
        held the app a second on every reload), the cursor staying on the row it was on."""
        current = None
        if table.row_count and table.cursor_row < table.row_count:
            current = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        sync_rows(table, self._shown, rows, order_column)
        keys = [key for key, _ in rows]
        if current in keys:
            table.move_cursor(row=keys.index(current))
        self.loads += 1


class SessionsScreen(_LivePolling):
    """Every conversation the proxy recorded in this store."""

    BINDINGS = bindings("sessions")
    DEFAULT_CSS = """
    SessionsScreen #sessions-summary { height: auto; padding: 0 1; }
    SessionsScreen DataTable { height: 1fr; }
    """

    class Loaded(Message):
        def __init__(self, rows: list[SessionRow], totals: SessionTotals) -> None:
            super().__init__()
            self.rows, self.totals = rows, totals

    def __init__(self, session: Session) -> None:
        super().__init__(session)
        self.rows: list[SessionRow] = []
        self._label_width = 0

    def compose(self) -> ComposeResult:
        yield Static("loading sessions…", id="sessions-summary")
        table: DataTable[Cell] = SizedTable(id="sessions-table", cursor_type="row", zebra_stripes=True)
        table.add_columns(*SESSION_COLUMNS)
        yield table
        yield KeysFooter()

    def read_rows(self) -> Message:
        return self.Loaded(list_sessions(self.session.store), session_totals(self.session.store))

    def worker_failed(self, worker: Worker[object], error: BaseException) -> None:
        self.query_one("#sessions-summary", Static).update(plain(f"cannot read sessions: {failure_text(error)}"))

    @on(Loaded)
    def _loaded(self, event: Loaded) -> None:
        self.rows = event.rows
        summary = self.query_one("#sessions-summary", Static)
        totals = event.totals  # of every session: the list holds the MAX_SESSIONS most recent
        unplaced = totals.unplaced_failures
        apart = f" · {plural(unplaced, 'failed request')} in no session (no ids to place {'it' if unplaced == 1 else 'them'} by)"
        if not self.rows:
            summary.update(
                "No proxied sessions in this store yet. Run `tokview proxy --server URL --db THIS_STORE` and point "
                "a harness at it: its conversations appear here as it runs." + (apart if unplaced else "")
            )
        else:
            shown = f" (the {len(self.rows):,} most recent listed)" if len(self.rows) < totals.sessions else ""
            summary.update(
                f"{plural(totals.sessions, 'session')}{shown} · {plural(totals.turns, 'turn')} · "
                f"{plural(totals.findings, 'finding')}{apart if unplaced else ''} · enter opens a session's turns"
            )
        self._show_rows()

    def _show_rows(self) -> None:
        width = label_cells(self.size.width)
        self._label_width = width
        self._keep_cursor(self._table(), [(r.key, session_cells(r, width)) for r in self.rows], order_column=0)

    def on_resize(self) -> None:
        if self.rows and label_cells(self.size.width) != self._label_width:
            self._show_rows()

    @on(DataTable.RowSelected)
    def _selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_open()

    def action_open(self) -> None:
        table = self._table()
        if not self.rows or table.cursor_row >= table.row_count:
            return
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        row = next((r for r in self.rows if r.key == key), None)
        if row is not None:
            self.app.push_screen(SessionTurnsScreen(self.session, row.session_id, row.part))


class SessionTurnsScreen(_LivePolling):
    """One conversation as its chain of turns, in order; enter inspects a turn."""

    BINDINGS = bindings("session turns")
    DEFAULT_CSS = """
    SessionTurnsScreen #turns-summary { height: auto; padding: 0 1; }
    SessionTurnsScreen DataTable { height: 1fr; }
    """

    class Loaded(Message):
        def __init__(self, rows: list[TurnRow]) -> None:
            super().__init__()
            self.rows = rows

    def __init__(self, session: Session, session_id: str, part: int = 0) -> None:
        super().__init__(session)
        self.session_id, self.part = session_id, part
        self.shown = session_label(session_id, part)
        self.rows: list[TurnRow] = []

    def compose(self) -> ComposeResult:
        yield Static(plain(f"session {self.shown}"), id="turns-summary")
        table: DataTable[Cell] = SizedTable(id="turns-table", cursor_type="row", zebra_stripes=True)
        table.add_columns(*TURN_COLUMNS)
        yield table
        yield KeysFooter()

    def read_rows(self) -> Message:
        return self.Loaded(session_turns(self.session.store, self.session_id, self.part))

    def worker_failed(self, worker: Worker[object], error: BaseException) -> None:
        self.query_one("#turns-summary", Static).update(
            plain(f"cannot read the session's turns: {failure_text(error)}")
        )

    @on(Loaded)
    def _loaded(self, event: Loaded) -> None:
        self.rows = event.rows
        tokens = sum(r.output_len for r in self.rows)
        failed = sum(r.failed for r in self.rows)
        self.query_one("#turns-summary", Static).update(
            plain(
                f"session {self.shown} · {plural(len(self.rows) - failed, 'turn')} · "
                + (f"{plural(failed, 'failed request')} · " if failed else "")
                + f"{plural(tokens, 'output token')} · enter inspects a turn"
            )
        )
        shown = short_ids([r.sample_id for r in self.rows])
        rows = [(r.sample_id, turn_cells(r, shown[r.sample_id])) for r in self.rows]
        self._keep_cursor(self._table(), rows, order_column=1)

    @on(DataTable.RowSelected)
    def _selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_open()

    def current_sample_id(self) -> str | None:
        """The turn under the cursor (a failed request is no sample: None): what a, r, n and t act on here."""
        table = self._table()
        if not self.rows or table.cursor_row >= table.row_count:
            return None
        sample_id = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return next((r.sample_id for r in self.rows if r.sample_id == sample_id and not r.failed), None)

    def cursor_on_failure(self) -> bool:
        """Whether the cursor is on a failed request's row (what a curation key there says: no sample to act on)."""
        table = self._table()
        if not self.rows or table.cursor_row >= table.row_count:
            return False
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return any(r.sample_id == key and r.failed for r in self.rows)

    def next_pending(self) -> bool:
        """Move the cursor to the next turn below it that nobody has reviewed (`]` here, as on the list); False when
        none follows (it did nothing at all on this screen, though the keys table lists it here)."""
        table = self._table()
        by_id = {r.sample_id: r for r in self.rows}
        for row_index in range(table.cursor_row + 1, table.row_count):
            key = table.coordinate_to_cell_key(Coordinate(row_index, 0)).row_key.value
            turn = by_id.get(str(key))
            if turn is not None and not turn.failed and turn.status == "pending":
                table.move_cursor(row=row_index)
                return True
        return False

    def action_open(self) -> None:
        table = self._table()
        if not self.rows or table.cursor_row >= table.row_count:
            return
        sample_id = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        failed = next((r for r in self.rows if r.failed and r.sample_id == sample_id), None)
        if failed is not None:  # nothing stored to inspect: the reason is all there is
            self.notify(f"this request failed: {failed.answer}", severity="warning")  # the app notifies as plain text
        elif sample_id is not None:
            self.app.open_sample(sample_id)  # type: ignore[attr-defined]  # TokviewApp: pushes the inspect screen
