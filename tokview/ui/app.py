"""The tokview app: the samples list, inspect, curation; generate, doctor and stats panels; help.

The app renders and dispatches. Data work goes through the store, core analysis, the batch runner and
the doctor, in workers that post messages; handlers here own every state change. Verdicts are written
to the store synchronously on the key press that makes them, so a crash right after loses none.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from textual import on, work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen

from tokview.ui.config import UIConfig
from tokview.ui.screens.inspect import InspectData, InspectScreen
from tokview.ui.screens.modals import RejectReason, TextPrompt
from tokview.ui.screens.samples import SamplesScreen
from tokview.ui.widgets.sample_list import SampleList

if TYPE_CHECKING:
    from tokview.ui.session import Session

CURATION_ACTIONS = {"approve", "reject", "note", "tag", "undo", "next_unreviewed"}


class SampleReady(Message):
    """A sample loaded in a worker, with the tokenizer and profile its run resolved to."""

    def __init__(self, data: InspectData, index: int | None, tokenizer, profile) -> None:
        super().__init__()
        self.data, self.index, self.tokenizer, self.profile = data, index, tokenizer, profile


class NextFound(Message):
    def __init__(self, found: tuple[int, str] | None, open_it: bool) -> None:
        super().__init__()
        self.found, self.open_it = found, open_it


class TokviewApp(App):
    """Inspect and curate captured samples; drive small batches against a server."""

    CSS_PATH = Path(__file__).parent / "styles" / "app.tcss"
    TITLE = "tokview"
    BINDINGS = [
        Binding("a", "approve", "Approve", tooltip="Approve the sample (written to the store at once).",
                id="curate.approve"),
        Binding("r", "reject", "Reject", tooltip="Reject the sample with a reason picked or typed.",
                id="curate.reject"),
        Binding("n", "note", "Note", show=False, tooltip="Attach a note to the sample.", id="curate.note"),
        Binding("t", "tag", "Tag", show=False, tooltip="Tag the sample (comma-separated tags).", id="curate.tag"),
        Binding("u", "undo", "Undo", tooltip="Take back the sample's latest verdict.", id="curate.undo"),
        Binding("right_square_bracket", "next_unreviewed", "Next pending", key_display="]",
                tooltip="Go to the next sample nobody has reviewed yet.", id="curate.next"),
        Binding("g", "generate", "Generate", show=False, tooltip="Open the generate panel.", id="app.generate"),
        Binding("D", "doctor", "Doctor", show=False, tooltip="Check the connected server.", id="app.doctor"),
        Binding("S", "stats", "Stats", show=False, tooltip="Plots of lengths, finish reasons, findings.",
                id="app.stats"),
        Binding("T", "toggle_theme", "Theme", show=False, tooltip="Switch between light and dark.",
                id="app.theme"),
        Binding("question_mark,f1", "help", "Help", key_display="?", tooltip="All keys, generated from the bindings.",
                id="app.help"),
        Binding("q", "quit", "Quit", tooltip="Leave tokview.", id="app.quit"),
    ]

    def __init__(self, session: "Session", config: UIConfig | None = None) -> None:
        super().__init__()
        self.session = session
        self.config = config or UIConfig()
        self.samples_screen: SamplesScreen | None = None
        self._open_index: int | None = None

    def on_mount(self) -> None:
        if self.config.theme in self.available_themes:
            self.theme = self.config.theme
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
        self._load_sample(sample_id, index)

    @work(thread=True, exclusive=True, group="open-sample", exit_on_error=False)
    def _load_sample(self, sample_id: str, index: int | None) -> None:
        try:
            stored, analysis, tokenizer, profile = self.session.load(sample_id)
        except Exception as exc:  # an unreadable sample or tokenizer: tell the user, keep the app
            self.call_from_thread(self.notify, f"cannot open {sample_id}: {exc}", severity="error")
            return
        self.post_message(SampleReady(InspectData(stored.sample_id, stored.capture, analysis, stored.status,
                                                  stored.notes, stored.tags), index, tokenizer, profile))

    @on(SampleReady)
    def _sample_ready(self, event: SampleReady) -> None:
        self._open_index = event.index
        screen = InspectScreen(event.data, event.tokenizer, event.profile, self.config.view_mode)
        if isinstance(self.screen, InspectScreen):
            self.switch_screen(screen)
        else:
            self.push_screen(screen)

    # -- curation ------------------------------------------------------------------------------
    def current_sample(self) -> tuple[str, int | None] | None:
        """The sample a curation key applies to: the one inspected, or the one under the list cursor."""
        if isinstance(self.screen, InspectScreen):
            return self.screen.data.sample_id, self._open_index
        if isinstance(self.screen, SamplesScreen):
            sid = self.screen.current_sample_id()
            return (sid, self.screen.sample_list.cursor) if sid else None
        return None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in CURATION_ACTIONS:
            return isinstance(self.screen, (InspectScreen, SamplesScreen))
        return True

    def _record(self, op: str, **kwargs) -> None:
        current = self.current_sample()
        if current is None:
            self.bell()
            return
        sample_id, index = current
        store = self.session.store
        if op == "verdict":
            store.record_verdict(sample_id, kwargs["status"], reason=kwargs.get("reason"), who=self.session.who)
        elif op == "undo":
            store.undo_verdict(sample_id, who=self.session.who)
        else:
            store.add_note(sample_id, kwargs.get("note") or "", who=self.session.who, tags=kwargs.get("tags", ()))
        stored = store.load_sample(sample_id)
        self._show_verdict(sample_id, index, stored.status, stored.notes, stored.tags)

    def _show_verdict(self, sample_id: str, index: int | None, status: str, notes: list[str],
                      tags: list[str]) -> None:
        if isinstance(self.screen, InspectScreen) and self.screen.data.sample_id == sample_id:
            self.screen.refresh_verdict(status, notes, tags)
        if self.samples_screen is not None and index is not None:
            lst = self.samples_screen.sample_list
            row = lst.row(index)
            if row is not None and row.sample_id == sample_id:
                lst.update_row(index, replace(row, status=status))
        self.notify(f"{sample_id}: {status}", timeout=1.5)

    def action_approve(self) -> None:
        self._record("verdict", status="approved")

    def action_reject(self) -> None:
        def chosen(reason: str | None) -> None:
            if reason:
                self._record("verdict", status="rejected", reason=reason)

        self.push_screen(RejectReason(self.config.reject_reasons), chosen)

    def action_note(self) -> None:
        self.push_screen(TextPrompt("Note for this sample", "what a reviewer should know"),
                         lambda note: note and self._record("note", note=note))

    def action_tag(self) -> None:
        def chosen(text: str | None) -> None:
            tags = [t.strip() for t in (text or "").split(",") if t.strip()]
            if tags:
                self._record("note", note="", tags=tags)

        self.push_screen(TextPrompt("Tags (comma-separated)", "e.g. math, long"), chosen)

    def action_undo(self) -> None:
        self._record("undo")

    def action_next_unreviewed(self) -> None:
        if self.samples_screen is None:
            return
        after = self.samples_screen.sample_list.cursor
        open_it = isinstance(self.screen, InspectScreen)
        if open_it and self._open_index is not None:
            after = self._open_index
        self._find_next(after, open_it)

    @work(thread=True, exclusive=True, group="next-unreviewed", exit_on_error=False)
    def _find_next(self, after: int, open_it: bool) -> None:
        assert self.samples_screen is not None
        self.post_message(NextFound(self.samples_screen.next_unreviewed(after), open_it))

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

    # -- panels --------------------------------------------------------------------------------
    def action_generate(self) -> None:
        from tokview.ui.screens.generate import GenerateScreen

        self.push_screen(GenerateScreen(self.session))

    def action_doctor(self) -> None:
        from tokview.ui.screens.doctor import DoctorScreen

        self.push_screen(DoctorScreen(self.session))

    def action_stats(self) -> None:
        from tokview.ui.screens.stats import StatsScreen

        self.push_screen(StatsScreen(self.session))

    def action_toggle_theme(self) -> None:
        self.theme = "textual-light" if self.current_theme.dark else "textual-dark"

    def action_help(self) -> None:
        from tokview.ui.screens.help import HelpScreen

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self))

    def samples_changed(self) -> None:
        """New samples landed (a batch from the generate panel): recount the list."""
        if self.samples_screen is not None:
            self.samples_screen.action_reload()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """A palette entry for every binding of the app and the active screen."""
        yield from super().get_system_commands(screen)
        seen = set()
        for node in (screen, self):
            for _key, binding in node._bindings:
                if binding.id in seen or not binding.id:
                    continue
                seen.add(binding.id)
                action = binding.action
                yield SystemCommand(binding.description, binding.tooltip or binding.description,
                                    lambda node=node, action=action: self.run_action(action, node))
