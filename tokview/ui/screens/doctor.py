"""The doctor panel: the `tokview doctor` report for the connected server, check by check."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Button, Input, Static

from tokview.ui.bindings import bindings
from tokview.ui.widgets.footer import KeysFooter

if TYPE_CHECKING:
    from tokview.ui.session import Session

MARK = {True: ("✓", "green"), False: ("✗", "bold red"), None: ("•", "yellow")}


def render_report(report) -> Text:
    """Notes about the URL (e.g. a dropped /v1), then each check: a mark, its title, the detail, what to do."""
    text = Text()
    for note in getattr(report, "notes", ()):
        text.append(f"note: {note}\n", "italic yellow")
    for check in report.checks:
        mark, style = MARK.get(check.ok, ("?", ""))
        text.append(f"{mark} ", style)
        text.append(f"{check.title}\n", "bold")
        if getattr(check, "detail", None):
            text.append(f"    {check.detail}\n")
        if getattr(check, "recommendation", None):
            text.append(f"    → {check.recommendation}\n", "italic")
    return text


class DoctorScreen(Screen):
    BINDINGS = bindings("doctor")

    class Done(Message):
        def __init__(self, report, error: str | None) -> None:
            super().__init__()
            self.report, self.error = report, error

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session
        self.report = None

    def compose(self) -> ComposeResult:
        with Horizontal(classes="form-row"):
            yield Input(self.session.server_shown, placeholder="http://127.0.0.1:30000", id="doctor-url")
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
        from tokview.servers.urls import public_url

        try:
            url, notes = self.session.server_for(self.query_one("#doctor-url", Input).value)
        except ValueError as exc:
            self.query_one("#doctor-report", Static).update(Text(f"doctor failed: {exc}", "bold red"))
            return
        self.query_one("#doctor-report", Static).update(f"checking {public_url(url)}…")
        self._run(url, notes)

    @work(exclusive=True, group="doctor", exit_on_error=False)
    async def _run(self, url: str, notes: list[str]) -> None:
        import asyncio

        from tokview.servers import ServerUnreachable

        try:
            from tokview.servers.doctor import run_doctor

            tokenizer = await asyncio.to_thread(self.session.tokenizer)
            profile = await asyncio.to_thread(self.session.profile)
            report = await run_doctor(url, tokenizer=tokenizer, profile=profile, notes=notes)
        except ServerUnreachable as exc:  # worded as `tokview doctor` words it
            self.post_message(self.Done(None, f"server unreachable: {exc.reason}"))
            return
        except Exception as exc:  # a doctor error: shown, never a crash
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self.post_message(self.Done(None, first))
            return
        self.post_message(self.Done(report, None))

    @on(Done)
    def _done(self, event: Done) -> None:
        body = self.query_one("#doctor-report", Static)
        if event.error:
            body.update(Text(f"doctor failed: {event.error}", "bold red"))
            return
        self.report = event.report
        body.update(render_report(event.report))

    def action_close(self) -> None:
        self.app.pop_screen()
