"""The tokview app: the samples list, inspect, curation; generate, doctor and stats panels; help.

The app renders and dispatches. Data work goes through the store, core analysis, the batch runner and
the doctor, in workers that post messages; handlers here own every state change. Verdicts are written
to the store synchronously on the key press that makes them, so a crash right after loses none. A worker
that fails reaches one handler here (`on_worker_state_changed`), which notifies; workers catch nothing.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import on, work
from textual.app import App, SystemCommand
from textual.command import CommandPalette
from textual.message import Message
from textual.notifications import SeverityLevel
from textual.screen import ModalScreen, Screen
from textual.worker import Worker, WorkerState

from tokview.store import bulk_review
from tokview.store.errors import CannotUndo, StoreError
from tokview.store.queries import sql_lower
from tokview.store.sample_rows import UnknownSample
from tokview.ui.bindings import KEYS, bindings
from tokview.ui.config import UIConfig
from tokview.ui.display import TokenSeq, kept_seq, served_seq
from tokview.ui.screens.inspect import InspectData, InspectScreen
from tokview.ui.screens.modals import (
    ActionsDialog,
    BulkApprove,
    Confirm,
    RejectReason,
    TagDialog,
    TagEdit,
    TextPrompt,
)
from tokview.ui.screens.samples import SamplesScreen
from tokview.ui.screens.sessions import SessionTurnsScreen
from tokview.ui.widgets.sample_list import SampleList
from tokview.ui.worker_errors import WORDED, failure_notice
from tokview.untrusted_text import printable, printable_line

if TYPE_CHECKING:
    from tokview.core.profiles import ModelProfile
    from tokview.core.tokenizer import TokenizerAdapter
    from tokview.store import Store, StoredSample
    from tokview.store.bulk_review import Outcome
    from tokview.ui.screens.samples import PendingSearch
    from tokview.ui.session import Session

CURATION_ACTIONS = {"approve", "reject", "note", "tag", "next_unreviewed"}
"""Keys for a sample: the one inspected, under the list's cursor, or under a session's turns list's cursor."""
STORE_WIDE_ACTIONS = {"undo", "undo_history", "export"}
"""Keys for the store, on every screen (help says "everywhere")."""
PANEL_OF_ACTION = {
    "generate": "GenerateScreen",
    "doctor": "DoctorScreen",
    "stats": "StatsScreen",
    "sessions": "SessionsScreen",
}
"""The panel each app-wide key opens (by class name: the panels are imported only when opened)."""


class SampleReady(Message):
    """A sample loaded in a worker, with the tokenizer and profile its run resolved to, and its two panes' token
    sequences (built in the worker: a 30,000-id sample took 0.3 s of the UI thread)."""

    def __init__(
        self,
        data: InspectData,
        index: int | None,
        tokenizer: TokenizerAdapter,
        profile: ModelProfile,
        seqs: tuple[TokenSeq, TokenSeq],
        asked: int = 0,
    ) -> None:
        super().__init__()
        self.data, self.index, self.tokenizer, self.profile, self.seqs = data, index, tokenizer, profile, seqs
        self.asked = asked
        """Which request of `open_sample` this is the answer to (only the latest is shown)."""


class NextFound(Message):
    def __init__(self, found: tuple[int, str] | None, open_it: bool) -> None:
        super().__init__()
        self.found, self.open_it = found, open_it


STORE_TROUBLE = (StoreError, UnknownSample)
"""What a key's store work may meet when another process holds, replaces or edits the store: a notification."""
QUIT_AGAIN_S = 4.0
"""How soon a second quit leaves during a generate run (`TokviewApp.action_quit`)."""


class TokviewApp(App[None]):
    """Inspect and curate captured samples; drive small batches against a server."""

    CSS_PATH = Path(__file__).parent / "styles" / "app.tcss"
    TITLE = "tokview"
    BINDINGS = bindings("everywhere")

    def __init__(self, session: Session, config: UIConfig | None = None) -> None:
        super().__init__()
        self.session = session
        self.config = config or UIConfig()
        self.samples_screen: SamplesScreen | None = None
        self._open_index: int | None = None
        self._loaded: SampleReady | None = None
        self._asked = 0
        self._asked_from: Screen[object] | None = None
        """The sample loaded last: shown once no dialog is open (`_show_ready`)."""
        self._quit_asked_at = float("-inf")
        """When quit was refused for a generate run (`action_quit`): a second press soon after quits."""

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None:
        """Every notification (a screen's too) as plain text, its controls escaped: the messages hold sample ids,
        tags, reasons and store errors, and Textual read them as markup ("[/x]" crashed the app)."""
        super().notify(
            printable(str(message)),
            title=printable_line(title),
            severity=severity,
            timeout=timeout,
            markup=False,
        )

    def on_mount(self) -> None:
        self.theme = self.config.theme  # checked against the available themes when the config was read
        if self.config.keymap:
            self.set_keymap(self.config.keymap)
        self.samples_screen = SamplesScreen(self.session)
        self.push_screen(self.samples_screen)

    # -- opening samples -----------------------------------------------------------------------
    @on(SampleList.Opened)
    def _opened(self, event: SampleList.Opened) -> None:
        index = self.samples_screen.sample_list.cursor if self.samples_screen else None
        self.open_sample(event.sample_id, index)

    def open_sample(self, sample_id: str, index: int | None = None) -> None:
        """Load the sample in a worker and show it over the screen asked from, once loaded: only the latest sample
        asked for, and only while that screen is still the one shown (a load the user walked away from is dropped)."""
        self._asked += 1
        self._asked_from = next((sc for sc in self.screen_stack[::-1] if not isinstance(sc, ModalScreen)), None)
        listed = self.samples_screen.pending_search() if index is None and self.samples_screen is not None else None
        self._load_sample(sample_id, index, self._asked, listed)

    @work(thread=True, exclusive=True, group="open-sample", exit_on_error=False)
    def _load_sample(self, sample_id: str, index: int | None, asked: int, listed: PendingSearch | None = None) -> None:
        """`listed`: the samples list, for a sample opened from elsewhere (a session's turns, w/W): its row there,
        read now, before any verdict moves it, is where `]` and auto-advance go on from (from the list's cursor,
        approving a session's third turn opened its first)."""
        if listed is not None:
            index = listed.row(sample_id)
        stored, analysis, tokenizer, profile = self.session.load(sample_id)  # an error: on_worker_state_changed
        seqs = served_seq(stored.capture, analysis, tokenizer), kept_seq(stored.capture, analysis, tokenizer)
        self.post_message(
            SampleReady(
                InspectData(
                    stored.sample_id,
                    stored.capture,
                    analysis,
                    stored.status,
                    stored.notes,
                    stored.tags,
                    stored.history,
                    proxied_turn(stored),
                ),
                index,
                tokenizer,
                profile,
                seqs,
                asked,
            )
        )

    @on(SampleReady)
    def _sample_ready(self, event: SampleReady) -> None:
        if event.asked != self._asked:  # an earlier request that finished after a later one was made
            return
        self._loaded = event
        self._show_ready(event)

    def _show_ready(self, event: SampleReady) -> None:
        """Show a loaded sample, once no dialog is open: pushed over a dialog (a note begun on the sample before,
        while this one loaded), it took the keys typed for the dialog (the note's letters became a tag on this
        sample). A later sample loaded meanwhile replaces it."""
        if event is not self._loaded:
            return
        if isinstance(self.screen, ModalScreen):
            self.set_timer(0.1, lambda: self._show_ready(event))
            return
        if self.screen is not self._asked_from:  # the user went on to a panel (generate, doctor, …) meanwhile: pushed
            return  # over it, the sample took the keys typed there (each `a` an approval)
        self._open_index = event.index
        screen = InspectScreen(event.data, event.tokenizer, event.profile, self.config.view_mode, seqs=event.seqs)
        if isinstance(self.screen, InspectScreen):
            self.switch_screen(screen)
        else:
            self.push_screen(screen)

    # -- curation ------------------------------------------------------------------------------
    def _work_screen(self) -> Screen[object]:
        """The screen a key or palette command is for: the top one, under the command palette when it is open
        (asked for its commands, the palette itself is the active screen)."""
        for screen in self.screen_stack[::-1]:  # (reversed() of a Screen[Any] list is Any to mypy)
            if not isinstance(screen, CommandPalette):
                return screen
        return self.screen

    def current_sample(self) -> tuple[str, int | None] | None:
        """The sample a curation key applies to: the one inspected, or the one under the list cursor."""
        screen = self._work_screen()
        if isinstance(screen, InspectScreen):
            return screen.data.sample_id, self._open_index
        if isinstance(screen, SamplesScreen):
            sid = screen.current_sample_id()
            return (sid, screen.sample_list.cursor) if sid else None
        if isinstance(screen, SessionTurnsScreen):  # the turn under its cursor (no row of the samples list)
            sid = screen.current_sample_id()
            return (sid, None) if sid else None
        return None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in STORE_WIDE_ACTIONS:  # no sample needed: they worked only on the samples list and inspect
            return not isinstance(self._work_screen(), ModalScreen)
        if action == "next_unreviewed":  # the list's order from the list or a sample over it; a session's own
            return isinstance(self._work_screen(), (InspectScreen, SamplesScreen, SessionTurnsScreen))
        if action in CURATION_ACTIONS:
            return isinstance(self._work_screen(), (InspectScreen, SamplesScreen, SessionTurnsScreen))
        return PANEL_OF_ACTION.get(action) != type(self.screen).__name__  # a panel's own key: off its footer

    def _target(self) -> tuple[str, int | None] | None:
        """The sample a curation key applies to, or None after saying there is none (no dialog opens)."""
        current = self.current_sample()
        if current is None:
            self.bell()
            screen = self._work_screen()
            failed = isinstance(screen, SessionTurnsScreen) and screen.cursor_on_failure()
            said = (
                "a failed request is no sample: nothing to review (its reason is on its row)"
                if failed
                else "no sample here: open one, or move the list cursor onto one"
            )
            self.notify(said, severity="warning", timeout=2)
        return current

    def _record_verdict(
        self, target: tuple[str, int | None], status: str, *, reason: str | None = None, override: bool = False
    ) -> None:
        """Approve or reject one sample (`override`: approved although it has error findings)."""
        who = self.session.who
        said = status + (" (overriding its error findings)" if override else "")
        self._record(
            target,
            lambda store: store.record_verdict(target[0], status, reason=reason, who=who, override=override),
            said,
            tags_changed=False,
        )

    def _record_note(self, target: tuple[str, int | None], note: str, *, tags: Sequence[str] = ()) -> None:
        """A note, or tags put on (a note may be empty when only tags are added)."""
        who = self.session.who
        said = "tagged " + ", ".join(tags) if tags else "note saved"
        self._record(target, lambda store: store.add_note(target[0], note, who=who, tags=tags), said)

    def _record_untag(self, target: tuple[str, int | None], tag: str) -> None:
        who = self.session.who
        self._record(target, lambda store: bulk_review.remove_tag(store, [target[0]], tag, who=who), f"took off {tag}")

    def _record(
        self, target: tuple[str, int | None], write: Callable[[Store], object], said: str, *, tags_changed: bool = True
    ) -> None:
        """Make one sample's write, then show its new state; a store another process holds too long is a
        notification, not a crash (the write is not made: press the key again). `tags_changed`: the list's
        tags column and the tag filter's choices are read again."""
        sample_id, index = target
        store = self.session.store
        try:
            write(store)
            stored = store.load_sample(sample_id)
        except STORE_TROUBLE as exc:
            self._store_failed(exc)
            return
        self._show_verdict(sample_id, index, stored)
        self.notify(f"{sample_id}: {said} · now {stored.status} (u undoes)", timeout=2)
        if self.samples_screen is not None:
            if tags_changed:
                self.samples_screen.action_reload()
            elif index is None or self.samples_screen.follows_status():
                # the list's row was not changed in place (a sample opened by w/W or from a session's turns), or the
                # verdict moves the sample in the list or out of it: read again, so `]` and the cursor count its rows
                self.samples_screen.reload()

    def _had_it_already(self, said: str) -> None:
        """A verdict the sample has already: nothing is recorded, and auto-advance moves on as after a new one."""
        self.notify(said, timeout=2)
        if isinstance(self.screen, InspectScreen) and self.config.auto_advance:
            self.call_later(self.run_action, "next_unreviewed")

    def _stored_or_said(self, sample_id: str) -> StoredSample | None:
        """The sample as stored now; None after saying why it cannot be read (held, moved, removed)."""
        try:
            return self.session.store.load_sample(sample_id)
        except STORE_TROUBLE as exc:
            self._store_failed(exc)
            return None

    def _store_failed(self, exc: StoreError | UnknownSample) -> None:
        title, message = failure_notice(exc)
        self.notify(message, title=title, severity="error", timeout=8)

    def _show_verdict(self, sample_id: str, index: int | None, stored: StoredSample) -> None:
        if isinstance(self.screen, InspectScreen) and self.screen.data.sample_id == sample_id:
            self.screen.refresh_verdict(stored.status, stored.notes, stored.tags, stored.history)
        self._reload_turns()
        if self.samples_screen is not None and index is not None:
            lst = self.samples_screen.sample_list
            row = lst.row(index)
            if row is not None and row.sample_id == sample_id:
                lst.update_row(index, replace(row, status=stored.status))

    # -- many samples at once: the marked ones ----------------------------------------------------
    def _marked(self) -> list[str]:
        """The marked samples when the list is the screen keys are for and has marks (a bulk action), else []."""
        screen = self._work_screen()
        if isinstance(screen, SamplesScreen) and len(screen.marks):
            return screen.marks.ids()
        return []

    def _bulk(self, write: Callable[[], Outcome], what: str = "marked") -> None:
        """Run one bulk write (a function of no arguments returning an Outcome), then say what it changed,
        clear the marks and read the list again; a store another process holds is a notification."""
        try:
            outcome = write()
        except STORE_TROUBLE as exc:
            self._store_failed(exc)
            return
        self._samples_changed(outcome.changed)
        self.notify(outcome.summary(what) + (" · u undoes" if outcome.changed else ""), timeout=4)

    def _samples_changed(self, sample_ids: list[str]) -> None:
        """Samples changed in bulk (an action or its undo): clear the marks, read the list and its choices
        again, and refresh the inspected sample when it is one of them."""
        if self.samples_screen is not None:
            self.samples_screen.clear_marks()
            self.samples_screen.action_reload()
        if isinstance(self.screen, InspectScreen) and self.screen.data.sample_id in set(sample_ids):
            stored = self._stored_or_said(self.screen.data.sample_id)  # None: the change stands, ctrl+r shows it
            if stored is not None:
                self.screen.refresh_verdict(stored.status, stored.notes, stored.tags, stored.history)
        self._reload_turns()

    def _reload_turns(self) -> None:
        """A session's turns list shows each turn's status: read again at once when a key there changed one (its
        poll would show it a second later)."""
        if isinstance(self.screen, SessionTurnsScreen):
            self.screen.action_reload()

    def _confirm(self, question: str, detail: str, then: Callable[[], None]) -> None:
        self.push_screen(Confirm(question, detail), lambda yes: then() if yes else None)

    def _bulk_approve(self, ids: list[str]) -> None:
        store, who, n = self.session.store, self.session.who, len(ids)
        invalid = bulk_review.invalid_among(store, ids, not_yet="approved")  # approved already: nothing to override
        if not invalid:
            self._confirm(
                f"Approve {n} marked samples?",
                _overturns(store, ids, "approved") + "one action: u takes it back",
                lambda: self._bulk(lambda: bulk_review.set_status(store, ids, "approved", who=who)),
            )
            return
        invalid_set = set(invalid)  # once: built per id, 102,000 marked samples took 557 s before the dialog
        valid = [i for i in ids if i not in invalid_set]

        def answered(choice: str | None) -> None:
            if choice == "all":
                self._bulk(lambda: bulk_review.set_status(store, ids, "approved", who=who, override_invalid=True))
            elif choice == "valid":
                self._bulk(lambda: bulk_review.set_status(store, valid, "approved", who=who), "valid marked")

        self.push_screen(
            BulkApprove(
                f"Approve {n} marked samples?",
                _overturns(store, ids, "approved")
                + f"{len(invalid)} of them have error findings (e.g. {invalid[0]}): a trainer would learn from broken "
                f"samples; approving them is recorded as overrides.",
                any_valid=bool(valid),
            ),
            answered,
        )

    def action_approve(self) -> None:
        if self._read_only():
            return
        marked = self._marked()
        if marked:
            try:
                self._bulk_approve(marked)
            except STORE_TROUBLE as exc:
                self._store_failed(exc)
            return
        target = self._target()
        if target is None:
            return
        stored = self._stored_or_said(target[0])
        if stored is None:
            return
        if stored.says_already("approved"):
            self._had_it_already(f"{target[0]}: approved already · nothing recorded")
            return
        errors = sorted({f.code for f in stored.findings if f.severity == "error"})
        overturns = stored.overturned_by("approved", self.session.who)
        if not errors and overturns is None:
            self._record_verdict(target, "approved")
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self._record_verdict(target, "approved", override=bool(errors))
            else:
                self.notify(f"{target[0]}: not approved", timeout=1.5)

        details = [f"It is {printable_line(overturns)}: this overturns that verdict."] if overturns else []
        if errors:
            details.append(
                f"error findings: {', '.join(errors)}. A trainer would learn from a broken sample; the verdict is "
                "recorded as an override."
            )
        question = f"Approve {target[0]} although it is invalid?" if errors else f"Approve {target[0]}?"
        self.push_screen(Confirm(question, " ".join(details)), answered)

    def action_reject(self) -> None:
        if self._read_only():
            return
        marked = self._marked()
        target = None if marked else self._target()
        if not marked and target is None:
            return
        store, who = self.session.store, self.session.who

        def chosen(reason: str | None) -> None:
            if not reason:
                return
            if target is not None:
                stored = self._stored_or_said(target[0])
                if stored is None:
                    return
                if stored.says_already("rejected", reason):
                    self._had_it_already(f"{target[0]}: rejected already ({reason}) · nothing recorded")
                    return
                overturns = stored.overturned_by("rejected", who)
                if overturns is None:
                    self._record_verdict(target, "rejected", reason=reason)
                    return
                self._confirm(
                    f"Reject {target[0]}?",
                    f"It is {printable_line(overturns)}: this overturns that verdict. reason: {reason}",
                    lambda: self._record_verdict(target, "rejected", reason=reason),
                )
                return
            self._confirm(
                f"Reject {len(marked)} marked samples?",
                _overturns(store, marked, "rejected") + f"reason: {reason} · one action: u takes it back",
                lambda: self._bulk(lambda: bulk_review.set_status(store, marked, "rejected", who=who, reason=reason)),
            )

        self.push_screen(RejectReason(self.config.reject_reasons), chosen)

    def action_note(self) -> None:
        if self._read_only():
            return
        marked = self._marked()
        target = None if marked else self._target()
        if not marked and target is None:
            return
        store, who = self.session.store, self.session.who

        def written(note: str | None) -> None:
            if not note:
                return
            if target is not None:
                self._record_note(target, note)
                return
            self._confirm(
                f"Note on {len(marked)} marked samples?",
                note,
                lambda: self._bulk(lambda: bulk_review.add_notes(store, marked, who=who, note=note)),
            )

        title = f"Note for the {len(marked)} marked samples" if marked else "Note for this sample"
        self.push_screen(TextPrompt(title, "what a reviewer should know"), written)

    def action_tag(self) -> None:
        if self._read_only():
            return
        marked = self._marked()
        target = None if marked else self._target()
        if not marked and target is None:
            return
        store, who = self.session.store, self.session.who
        try:
            carried = bulk_review.tags_of(store, marked if marked else [target[0]] if target is not None else [])
            existing = store.tag_counts()
        except STORE_TROUBLE as exc:
            self._store_failed(exc)
            return

        def chosen(edit: TagEdit | None) -> None:
            if edit is None or (not edit.add and not edit.remove):
                return
            if target is not None:
                if edit.remove and sql_lower(edit.remove) not in {sql_lower(t) for t in carried}:
                    self.notify(f"{target[0]}: has no tag {edit.remove} · nothing recorded", timeout=3)
                elif edit.remove:  # nothing written said "took off", and the next `u` took back an earlier action
                    self._record_untag(target, edit.remove)
                else:
                    self._record_note(target, "", tags=edit.add)
                return
            n = len(marked)
            if edit.remove:
                tag = edit.remove
                self._confirm(
                    f"Take tag {tag} off {n} marked samples?",
                    "one action: u puts it back",
                    lambda: self._bulk(lambda: bulk_review.remove_tag(store, marked, tag, who=who)),
                )
            else:
                tags = edit.add
                self._confirm(
                    f"Tag {n} marked samples with {', '.join(tags)}?",
                    "one action: u takes it back",
                    lambda: self._bulk(lambda: bulk_review.add_notes(store, marked, who=who, tags=tags)),
                )

        title = f"Tags for the {len(marked)} marked samples" if marked else "Tags for this sample"
        self.push_screen(TagDialog(existing, carried, title), chosen)

    def action_undo(self) -> None:
        """Take back the latest action wherever it was made (this sample or not, a bulk one, tokview review's); one
        another reviewer made is named and asked about first: `u` to take back one's own verdict took back a
        colleague's 600-sample `tokview review` run that had come in since, at once."""
        if self._read_only():
            return
        try:
            latest = bulk_review.latest_undoable(self.session.store)
        except STORE_TROUBLE as exc:
            self._store_failed(exc)
            return
        if latest is None or latest.who == self.session.who:
            self._undo(None if latest is None else latest.action_id)
            return
        where = f" ({latest.source})" if latest.source else ""
        self._confirm(
            f"Undo {latest.who or 'someone'}'s action?",
            f"the latest action is theirs{where}: {latest.described}. U lists the latest actions to pick another.",
            lambda: self._undo(latest.action_id),
        )

    def _read_only(self) -> bool:
        """A store that cannot be written (a read-only mount) is said so at the key, before any dialog: each write
        failed as "cannot read STORE: … read-only mode", after the reason and the count were asked for."""
        if not self.session.store.read_only:
            return False
        self.notify(
            f"{self.session.store.path} is read-only: verdicts, notes, tags, undo and generation cannot be "
            "recorded (viewing and export work)",
            title="store",
            severity="error",
        )
        return True

    def action_undo_history(self) -> None:
        try:
            listed = self.session.store.actions(30)
        except STORE_TROUBLE as exc:
            self._store_failed(exc)
            return
        self.push_screen(ActionsDialog(listed), lambda action_id: self._undo(action_id) if action_id else None)

    def _undo(self, action_id: int | None) -> None:
        if self._read_only():
            return
        try:
            undone = self.session.store.undo_action(action_id, who=self.session.who)
        except STORE_TROUBLE as exc:
            self._store_failed(exc)
            return
        except CannotUndo as exc:  # chosen from a list another process changed since
            self.notify(str(exc), severity="warning", timeout=4)
            return
        if undone is None:
            self.notify("nothing to undo in this store", timeout=2)
            return
        self._samples_changed(undone.sample_ids)
        self.notify(undone.line, title="undo", timeout=6)

    def action_export(self) -> None:
        from tokview.ui.screens.export_dialog import ExportDialog

        filters = self.samples_screen.filters if self.samples_screen is not None else None
        self.push_screen(
            ExportDialog(self.session, run=getattr(filters, "run_id", None), tag=getattr(filters, "tag", None))
        )

    def action_next_unreviewed(self) -> None:
        screen = self._work_screen()
        if isinstance(screen, SessionTurnsScreen):  # the session's next pending turn, in its own order
            if not screen.next_pending():
                self.notify("no pending turn after this one in this session", timeout=2)
            return
        if self.samples_screen is None:
            return
        after = self.samples_screen.sample_list.cursor
        anchor = self.samples_screen.current_sample_id()
        screen = self.screen
        open_it = isinstance(screen, InspectScreen)
        if isinstance(screen, InspectScreen):
            anchor = screen.data.sample_id
            if self._open_index is not None:
                after = self._open_index
        search = self.samples_screen.pending_search()  # read here, searched in a thread
        self._find_next(search, after, open_it, anchor)

    @work(thread=True, exclusive=True, group="next-unreviewed", exit_on_error=False)
    def _find_next(self, search: PendingSearch, after: int, open_it: bool, anchor: str | None) -> None:
        self.post_message(NextFound(search.after(after, anchor), open_it))

    @on(NextFound)
    def _next_found(self, event: NextFound) -> None:
        if event.found is None:
            self.notify("no pending sample after this one", timeout=2)
            return
        index, sample_id = event.found
        if self.samples_screen is not None:
            self.samples_screen.sample_list.cursor = index
        if event.open_it:
            self.open_sample(sample_id, index)

    # -- failed workers ------------------------------------------------------------------------
    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """Every failed worker, the app's own and those its screens and widgets forward: one notification, titled
        by the error's kind for a TokviewError, a generic line for anything else (a bug)."""
        if event.state is not WorkerState.ERROR or event.worker.error is None:
            return
        error = event.worker.error
        if not isinstance(error, WORDED):
            self.log.error(event.worker, "".join(traceback.format_exception(error)))
        title, message = failure_notice(error)
        self.notify(message, title=title, severity="error", timeout=8)

    # -- panels --------------------------------------------------------------------------------
    def _push_panel(self, panel: Callable[[Session], Screen[Any]]) -> None:
        """Open a panel (its class), unless one of its kind is open already: `g` on the generate panel's button
        opened a second one on top, and a second run beside the first."""
        if any(type(screen) is panel for screen in self.screen_stack):
            if type(self.screen) is not panel:
                self.notify("that panel is open already: esc goes back to it", timeout=3)
            return
        self.push_screen(panel(self.session))

    def action_generate(self) -> None:
        if self._read_only():  # its batch would write into the store
            return
        from tokview.ui.screens.generate import GenerateScreen

        self._push_panel(GenerateScreen)

    def action_doctor(self) -> None:
        from tokview.ui.screens.doctor import DoctorScreen

        self._push_panel(DoctorScreen)

    def action_stats(self) -> None:
        from tokview.ui.screens.stats import StatsScreen

        self._push_panel(StatsScreen)

    def action_sessions(self) -> None:
        from tokview.ui.screens.sessions import SessionsScreen

        self._push_panel(SessionsScreen)

    async def action_quit(self) -> None:
        """Quit; during a generate run only on a second press within a few seconds: ctrl+q left mid-run at once, its
        requests in flight lost, where esc on the panel refuses to leave a running run."""
        from tokview.ui.screens.generate import GenerateScreen

        running = any(isinstance(screen, GenerateScreen) and screen.running for screen in self.screen_stack)
        now = time.monotonic()
        if running and now - self._quit_asked_at > QUIT_AGAIN_S:
            self._quit_asked_at = now
            self.notify(
                "a generate run is in progress: ctrl+c on its panel cancels it (what was written is kept); "
                "quit again to leave now",
                severity="warning",
                timeout=QUIT_AGAIN_S,
            )
            return
        self.exit()

    def action_toggle_theme(self) -> None:
        """Switch light/dark and remember it: `[ui] theme` in the config file in use, that one key only."""
        from tokview.ui.config import ConfigError, remember_theme

        self.theme = "textual-light" if self.current_theme.dark else "textual-dark"
        self.config.theme = self.theme
        try:
            remember_theme(self.theme, self.config.path)
        except (ConfigError, OSError) as exc:
            self.notify(f"theme not remembered: {exc}", title="config", severity="warning", timeout=5)

    def action_help(self) -> None:
        from tokview.ui.screens.help import HelpScreen

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.config.keymap))

    def samples_changed(self) -> None:
        """New samples landed (a batch from the generate panel): recount the list."""
        if self.samples_screen is not None:
            self.samples_screen.action_reload()

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        """The registry's commands live on this screen (once each), then Textual's own but Quit (ours)."""
        live = {b.id: node for node, b, _enabled, _tip in screen.active_bindings.values() if b.id}
        for key in KEYS:
            node = live.get(key.id)
            if key.palette and node is not None:
                yield SystemCommand(
                    key.description,
                    key.help or key.description,
                    lambda node=node, action=key.action: self.run_action(action, node),
                )
        ours = {k.description for k in KEYS}
        for command in super().get_system_commands(screen):
            if command.title not in ours:
                yield command


def proxied_turn(stored: StoredSample) -> tuple[str, int] | None:
    """The session and turn of a sample `tokview proxy` recorded (its prompt id is its session), else None."""
    if stored.sample_id.startswith("proxy:") and stored.turn is not None:
        return stored.prompt_id, stored.turn
    return None


def _overturns(store: Store, ids: list[str], verdict: str) -> str:
    """`3 of them are rejected: this overturns their verdict · ` for a bulk verdict's question, else nothing."""
    n = len(bulk_review.overturned_among(store, ids, verdict))
    other = "rejected" if verdict == "approved" else "approved"
    if not n:
        return ""
    return f"{n} of them {'is' if n == 1 else 'are'} {other}: this overturns {'its' if n == 1 else 'their'} verdict · "
