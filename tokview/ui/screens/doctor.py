"""The doctor panel: the `tokview doctor` report for the connected server, rendered by the report itself
(`DoctorReport.render_rich`: the CLI's lines, each mark in its status colour), its advice in the app's words (a
`--tokenizer DIR` the panel has no field for is `tokview ui --tokenizer DIR`)."""

from __future__ import annotations

import re
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


UI_TOKENIZER = "`tokview ui --tokenizer DIR`"
APP_DOCTOR_WORDS = (
    (
        "give doctor (and batch) the served model's tokenizer folder (--tokenizer DIR)",
        f"quit, and start the app with the served model's tokenizer folder ({UI_TOKENIZER}): its checks and the "
        "generate panel read ids with it",
    ),
    (
        "give doctor the served model's own tokenizer folder (--tokenizer DIR)",
        f"start the app with the served model's own tokenizer folder ({UI_TOKENIZER})",
    ),
    (
        "point --tokenizer at the server's own tokenizer and chat template",
        f"start the app with the server's own tokenizer and chat template ({UI_TOKENIZER})",
    ),
    ("(none: pass --tokenizer)", f"(none: start the app with {UI_TOKENIZER})"),
    ("(needs --tokenizer)", f"(needs a tokenizer: start the app with {UI_TOKENIZER})"),
    ("leave --profile out to detect it", "start the app without --profile to detect it"),
    ("check --profile", "check the app's profile (`tokview ui --profile NAME` sets another)"),
    ("pass the server the redirect names as --server", "give the server the redirect names in the URL box"),
    ("run doctor with --no-thinking", "run `tokview doctor --server URL --no-thinking`"),
)
"""The CLI report's advice as the panel can act on it: the app takes its tokenizer and profile when it starts, its
server in the URL box (`tokview batch`'s and the server's own flags, named as commands, stay)."""
_USE_PROFILE = re.compile(r"use --profile (\S+)")
_CAPTURE_MODE = re.compile(r"capture with --mode (raw|chat)")
_FORM_MODE = {"raw": "raw ids", "chat": "parsed chat"}


def in_app_words(line: str) -> str:
    """A report line with its CLI advice as the app takes it (`APP_DOCTOR_WORDS`)."""
    for cli, app in APP_DOCTOR_WORDS:
        line = line.replace(cli, app)
    line = _USE_PROFILE.sub(r"start the app with `tokview ui --profile \1`", line)
    return _CAPTURE_MODE.sub(lambda m: f"capture with the generate panel's mode {_FORM_MODE[m[1]]}", line)


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
        report.update(event.report.render_rich(in_app_words))  # as `tokview doctor` prints it, advice as the app acts
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
