"""The doctor panel: the `tokview doctor` report for the connected server, rendered by the report itself
(`DoctorReport.render_rich`: the CLI's lines, each mark in its status colour)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Button, Input, Static
from textual.worker import Worker, WorkerState

from tokview.ui.bindings import bindings
from tokview.ui.widgets.footer import KeysFooter
from tokview.ui.worker_errors import ForwardsWorkerErrors, failure_text

if TYPE_CHECKING:
    from tokview.servers.doctor import DoctorReport
    from tokview.ui.session import Session


class DoctorScreen(ForwardsWorkerErrors, Screen[None]):
    BINDINGS = bindings("doctor")
    DEFAULT_CSS = """
    DoctorScreen #doctor-report.-failed { color: $text-error; }
    /* a fixed red measured 3.0:1 on the light panel; #870000 is a 256-colour cube colour (the same painted) */
    DoctorScreen:light #doctor-report.-failed { color: #870000; }
    """

    class Done(Message):
        def __init__(self, report: DoctorReport) -> None:
            super().__init__()
            self.report = report

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session
        self.report: DoctorReport | None = None
        self._worker: Worker[None] | None = None

    @property
    def running(self) -> Worker[None] | None:
        """The doctor worker while it runs, else None."""
        worker = self._worker
        return worker if worker is not None and worker.state in (WorkerState.PENDING, WorkerState.RUNNING) else None

    def compose(self) -> ComposeResult:
        with Horizontal(classes="form-row"):
            yield Input(
                self.session.server_shown, placeholder="http://127.0.0.1:30000", id="doctor-url", select_on_focus=False
            )
            yield Button("Run checks", id="doctor-run", variant="primary")
        with VerticalScroll(id="doctor-body"):
            yield Static("Press Run checks (ctrl+s) to probe the server.", id="doctor-report")
        yield KeysFooter()

    def on_mount(self) -> None:
        if self.session.server_url:
            self.action_run()

    @on(Button.Pressed, "#doctor-run")
    @on(Input.Submitted, "#doctor-url")
    def action_run(self) -> None:
        from tokview.servers.urls import BadServerURL, public_url

        try:
            url, notes = self.session.server_for(self.query_one("#doctor-url", Input).value)
        except BadServerURL as exc:  # a bad URL, worded as the CLI words it
            self._say(f"doctor failed: {exc}", failed=True)
            return
        self.session.use_server(url)  # the generate panel runs against the server checked here
        self._say(f"checking {public_url(url)}… (esc or ctrl+c cancels)")
        self._worker = self._run(url, notes)

    @work(exclusive=True, group="doctor", exit_on_error=False)
    async def _run(self, url: str, notes: list[str]) -> None:
        import asyncio

        from tokview.servers.doctor import run_doctor

        tokenizer = await asyncio.to_thread(self.session.tokenizer)
        profile = await asyncio.to_thread(self.session.profile)
        report = await run_doctor(url, tokenizer=tokenizer, profile=profile, notes=notes)
        self.post_message(self.Done(report))  # an error: worker_failed below, and the app notifies

    def worker_failed(self, worker: Worker[object], error: BaseException) -> None:
        """Said in place of the report, worded as `tokview doctor` words it (`server unreachable: …`)."""
        self._say(f"doctor failed: {failure_text(error)}", failed=True)

    @on(Done)
    def _done(self, event: Done) -> None:
        self.report = event.report
        report = self.query_one("#doctor-report", Static)
        report.remove_class("-failed")
        report.update(event.report.render_rich())  # as `tokview doctor` prints it
        if self.focused is self.query_one("#doctor-url", Input):  # read next: the app's one-letter keys (g, S, ?) were
            self.query_one("#doctor-body", VerticalScroll).focus()  # typed into the URL while its checks ran

    def action_cancel(self) -> None:
        """Stop the running checks; the panel stays, saying so."""
        worker = self.running
        if worker is None:
            self.notify("no checks are running", timeout=3)
            return
        worker.cancel()
        self._say("doctor cancelled: press Run checks (ctrl+s) to try again, esc to go back", bold=True)

    def _say(self, text: str, failed: bool = False, bold: bool = False) -> None:
        """One line in place of the report; a failure in the theme's error colour (a class, so the light theme
        can pick a darker red than a fixed style would give it)."""
        report = self.query_one("#doctor-report", Static)
        report.set_class(failed, "-failed")
        report.update(Text(text, "bold" if failed or bold else ""))

    def action_close(self) -> None:
        """esc: a run in progress is cancelled first (one press, the panel stays); else back to the list."""
        if self.running is not None:
            self.action_cancel()
            return
        self.app.pop_screen()
