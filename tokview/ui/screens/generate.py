"""The generate panel: pick prompts, set sampling, run `run_batch` against the server with live progress.

It calls the same `run_batch` the `tokview batch` command calls, in an async worker on the app's
loop; progress arrives through `on_progress` as coalescing messages and is shown as the CLI prints it
(`progress_line`, then `BatchSummary.render`), samples land in the store as they are captured (a live run:
each part lands as soon as it is written, and each landing recounts the list), and Cancel sets the batch's cancel event. A run that fails (no server, unreadable
prompts) raises: the progress line says why and the app's one handler notifies.
"""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Button, Input, Label, ProgressBar, Static, Switch, TextArea
from textual.worker import Worker

from tokview.batch.config import PANEL_DEFAULTS, TOKENIZER_QUESTION
from tokview.batch.inputs import bad_rows_said
from tokview.batch.progress import progress_line
from tokview.batch.vocabulary_guard import BATCH_ADVICE
from tokview.errors import TokviewError
from tokview.ui.bindings import bindings
from tokview.ui.display import plain
from tokview.ui.form_words import in_words, reword
from tokview.ui.widgets.footer import KeysFooter
from tokview.ui.widgets.select import Select
from tokview.ui.worker_errors import ForwardsWorkerErrors, failure_text

if TYPE_CHECKING:
    from collections.abc import Callable

    from tokview.batch import BatchConfig, BatchProgress, BatchSummary
    from tokview.core.prompts import PromptRow
    from tokview.store import Store
    from tokview.ui.session import Session

Number = TypeVar("Number", int, float)

DEFAULT_PROMPTS = Path(__file__).resolve().parents[3] / "sample_data" / "openai_messages.jsonl"
"""Absolute: the app may be started from any folder."""
FORM_FIELDS = {"samples": "samples_per_prompt", "temperature": "temperature", "max-tokens": "max_new_tokens"}
"""Form box id → BatchConfig field."""
FORM_DEFAULTS = {box: str(PANEL_DEFAULTS[name]) for box, name in FORM_FIELDS.items()}
"""What an empty field means (batch/config.py's panel defaults); the boxes show these as placeholders, so what
you see is what runs."""
FORM_NAMES = {
    "--samples-per-prompt": "samples",
    "--max-new-tokens": "max tok",
    "--temperature": "temp",
    "--prompts": "prompts",
    "--server": "server",
    "--top-p": "top p",
    "--concurrency": "concurrency",
    "--timeout": "timeout",
    "--retries": "retries",
    "--logprobs": "logprobs",
    "--run": "run",
    "--mode chat": "mode parsed chat",
    "--mode raw": "mode raw ids",
    "--mode dual": "mode dual",
}
RERUN, RERUN_FORM = "re-run the same command", "run the same form again"
"""The summary's advice to resume, as the panel does it."""
ANOTHER_DB, ANOTHER_DB_FORM = "(another --db, or other settings,", "(another store, or other settings,"
"""The summary's note on samples stored by another run, as the panel (which has no --db) can act on it."""


def default_prompts_shown() -> str:
    """The default prompts file as the box shows it: short when under the current folder, else absolute;
    either way it names the packaged file wherever the app was started."""
    try:
        return str(DEFAULT_PROMPTS.relative_to(Path.cwd()))
    except ValueError:
        return str(DEFAULT_PROMPTS)


APP_TOKENIZER = {
    BATCH_ADVICE: "quit, and start the app with the served model's tokenizer folder (`tokview ui --tokenizer DIR`; "
    "the doctor panel, D, compares the app's with the server)",
    TOKENIZER_QUESTION: "is the app's tokenizer the served model's? (the doctor panel, D, compares them; `tokview ui "
    "--tokenizer DIR` starts the app with another)",
}
"""The summary's advice about the tokenizer, as the panel (which has no tokenizer field) can act on it."""


def in_form_words(message: str) -> str:
    """A batch error as the panel names its fields: 'temp must be 0 or more', not '--temperature …'
    (`form_words.in_words`), and its advice to resume as the panel does it."""
    return in_words(_app_advice(message), FORM_NAMES).replace(RERUN, RERUN_FORM)


def summary_in_form_words(summary: str) -> str:
    """The summary `tokview batch` prints, its advice in the form's words (only its advice: a run, a path, a server's
    message may hold any word, `sweep.temperature`, `/data/--db/`)."""
    return _app_advice(summary).replace(RERUN, RERUN_FORM).replace(ANOTHER_DB, ANOTHER_DB_FORM)


def _app_advice(text: str) -> str:
    for cli, app in APP_TOKENIZER.items():
        text = text.replace(cli, app)
    return text


def typed_prompts(text: str) -> list[PromptRow]:
    """One prompt per non-empty line: a single user message, with a stable id from its text."""
    from tokview.core.prompts import parse_row

    return [
        parse_row({"messages": [{"role": "user", "content": line.strip()}]}, line=n)
        for n, line in enumerate(text.splitlines(), 1)
        if line.strip()
    ]


def store_prompts(store: Store) -> list[PromptRow]:
    """The conversations already in the store, one per prompt id (to sample them again), with the tools they declared."""
    from tokview.core.prompts import PromptRow

    return [PromptRow(pid, messages, tools=tools) for pid, messages, tools in store.stored_conversations()]


class GenerateScreen(ForwardsWorkerErrors, Screen[None]):
    BINDINGS = bindings("generate")
    DEFAULT_CSS = """
    /* at 80 columns the last row holds thinking, mode, logprobs and both buttons: the buttons take their
       label's width, not Textual's 16 cells (Cancel fell off the screen) */
    GenerateScreen #run, GenerateScreen #cancel { min-width: 8; width: auto; }
    GenerateScreen #logprobs { min-width: 10; }
    GenerateScreen #thinking { padding: 0 1; }
    """

    class Progress(Message):
        def __init__(self, progress: BatchProgress) -> None:
            super().__init__()
            self.progress = progress

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, GenerateScreen.Progress)

    class Landed(Message):
        """Samples of the run reached the store (sent from the landing thread)."""

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, GenerateScreen.Landed)

    class Finished(Message):
        def __init__(self, summary: BatchSummary) -> None:
            super().__init__()
            self.summary = summary

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session
        self.cancel_event: asyncio.Event | None = None
        """Set while a run goes on: what ctrl+c sets to cancel it."""
        self.last_summary: BatchSummary | None = None
        self.url_notes: list[str] = []
        """What was changed about the typed server URL (e.g. a dropped /v1), set by build_config."""

    @property
    def running(self) -> bool:
        """Whether a run goes on (the app asks before quitting)."""
        return self.cancel_event is not None

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="generate-form"):
            with Horizontal(classes="form-row"):
                yield Label("server", classes="form-label")
                yield Input(
                    self.session.server_shown, placeholder="http://127.0.0.1:30000", id="server", select_on_focus=False
                )
                yield Label("run", classes="form-label")
                yield Input("", placeholder="automatic (batch-<settings>)", id="run-name")
            with Horizontal(classes="form-row"):
                yield Label("prompts", classes="form-label")
                yield Select(
                    [("file", "file"), ("typed below", "typed"), ("stored prompts", "store")],
                    value="file",
                    allow_blank=False,
                    id="source",
                )
                yield Input(default_prompts_shown(), placeholder="prompts .jsonl / .parquet", id="prompts-file")
            yield TextArea("What is 6 times 7?", id="typed", soft_wrap=True)
            with Horizontal(classes="form-row"):
                yield Label("samples", classes="form-label")
                yield Input(
                    FORM_DEFAULTS["samples"], placeholder=FORM_DEFAULTS["samples"], id="samples", type="integer"
                )
                yield Label("temp", classes="form-label")
                yield Input(
                    FORM_DEFAULTS["temperature"],
                    placeholder=FORM_DEFAULTS["temperature"],
                    id="temperature",
                    type="number",
                )
                yield Label("max tok", classes="form-label")
                yield Input(
                    FORM_DEFAULTS["max-tokens"],
                    placeholder=FORM_DEFAULTS["max-tokens"],
                    id="max-tokens",
                    type="integer",
                )
            with Horizontal(classes="form-row"):
                yield Label("thinking", classes="form-label")
                yield Switch(True, id="thinking")
                yield Label("mode", classes="form-label")
                yield Select(
                    [("raw ids", "raw"), ("parsed chat", "chat"), ("dual", "dual")],
                    value="raw",
                    allow_blank=False,
                    id="mode",
                )
                yield Label("logprobs", classes="form-label")
                yield Input("", placeholder="off", id="logprobs", type="integer")
                yield Button("Run", id="run", variant="primary")
                yield Button("Cancel", id="cancel", variant="error", disabled=True)
        with Vertical(id="generate-progress"):
            yield ProgressBar(total=1, id="bar", show_eta=False)  # determinate: no idle animation
            yield Static("idle", id="progress-line")
        yield KeysFooter()

    def on_mount(self) -> None:
        # the first field, not the form's scroll container: typing goes somewhere at once
        self.query_one("#server", Input).focus()

    # -- form --------------------------------------------------------------------------------
    @on(TextArea.Changed, "#typed")
    def _typed_edited(self, event: TextArea.Changed) -> None:
        """Typing prompts chooses them: typed with the source left at `file`, they were ignored and the default file's
        30 prompts ran."""
        if event.text_area.has_focus:
            self._choose_source("typed")

    @on(Input.Changed, "#prompts-file")
    def _file_edited(self, event: Input.Changed) -> None:
        if event.input.has_focus:
            self._choose_source("file")

    def _choose_source(self, source: str) -> None:
        chooser = self.query_one("#source", Select)
        if chooser.value != source:
            chooser.value = source

    def _value(self, selector: str) -> str:
        return self.query_one(selector, Input).value.strip()

    def _choice(self, selector: str) -> str:
        """A Select's value (each has allow_blank=False: always one of its options)."""
        return str(self.query_one(selector, Select).value)

    def _number(self, name: str, label: str, kind: Callable[[str], Number]) -> Number:
        """A numeric field; empty means the default its placeholder shows."""
        text = self._value(f"#{name}") or FORM_DEFAULTS[name]
        try:
            return kind(text)
        except ValueError:
            raise ValueError(f"{label}: {text!r} is not a number") from None

    def _logprobs(self) -> int | None:
        """Top-K alternatives to capture with each output token's logprob; empty means none (as the
        placeholder says), so a run without it keeps the sample ids of earlier runs."""
        text = self._value("#logprobs")
        if not text:
            return None
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"logprobs: {text!r} is not a number") from None

    def build_config(self) -> BatchConfig:
        from tokview.batch import BatchConfig

        # a bad URL is a one-line BadServerURL, shown by action_run; the session's credentials stay out of the box
        server, self.url_notes = self.session.server_for(self._value("#server"))
        self.session.use_server(server)  # the doctor panel checks the server generate used, and the reverse
        source = self._choice("#source")
        if source == "file" and not self._value("#prompts-file"):  # Path("") is the working directory
            raise ValueError("prompts file: give the path of a JSONL or Parquet file")
        config = BatchConfig(
            **{
                **PANEL_DEFAULTS,
                "servers": [server],
                "prompts_path": Path(self._value("#prompts-file")) if source == "file" else None,
                "mode": self._choice("#mode"),
                "samples_per_prompt": self._number("samples", "samples", int),
                "temperature": self._number("temperature", "temp", float),
                "max_new_tokens": self._number("max-tokens", "max tok", int),
                "thinking": self.query_one("#thinking", Switch).value,
                "logprobs": self._logprobs(),
                "run": self._value("#run-name") or None,  # a name for the run; empty: one from its settings
            }
        )
        config.validate()  # range checks before a worker starts: said in the form's words by action_run
        return config

    @on(Button.Pressed, "#run")
    def action_run(self) -> None:
        if self.cancel_event is not None:
            return
        try:
            config = self.build_config()
        except (ValueError, TokviewError) as exc:  # a bad number (ValueError), a bad URL (BadServerURL), a range
            said = in_form_words(str(exc))
            self.notify(f"cannot run: {said}", severity="error")
            self.query_one("#progress-line", Static).update(Text(f"cannot run: {said}", "bold red"))
            return
        for note in self.url_notes:
            self.notify(note, title="server URL")
        source = self._choice("#source")
        self.cancel_event = asyncio.Event()
        self.query_one("#run", Button).disabled = True
        self.query_one("#cancel", Button).disabled = False
        self.query_one("#bar", ProgressBar).update(total=1, progress=0)  # not the last run's 100% over this one
        self.query_one("#progress-line", Static).update("starting…")
        self._run_batch(config, source, self.query_one("#typed", TextArea).text, self.cancel_event)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        if self.cancel_event is None:  # the footer always shows ^c: said, as the doctor panel says it
            self.notify("no run is in progress", timeout=3)
            return
        self.cancel_event.set()
        self.query_one("#progress-line", Static).update("cancelling…")

    def action_close(self) -> None:
        """Leave the panel; not while a run goes on (leaving would end it silently: the run is this
        screen's worker). ctrl+c cancels it, keeping what was written."""
        if self.cancel_event is not None:
            self.notify("a run is in progress: ctrl+c cancels it (what was written is kept), then esc", timeout=4)
            return
        self.app.pop_screen()

    # -- the run -----------------------------------------------------------------------------
    @work(exclusive=True, group="generate", exit_on_error=False)
    async def _run_batch(self, config: BatchConfig, source: str, typed: str, cancel: asyncio.Event) -> None:
        """An unreachable server or unreadable prompts raise: `worker_failed` resets the form, the app notifies."""
        from tokview.batch import InputError, run_batch

        config.tokenizer = await asyncio.to_thread(self.session.tokenizer)
        config.model_profile = await asyncio.to_thread(self.session.profile)
        prompts = None
        if source == "typed":
            prompts = typed_prompts(typed)
        elif source == "store":
            prompts = await asyncio.to_thread(store_prompts, self.session.store)
        if prompts is not None and not prompts:
            raise InputError("no prompts to run")
        summary = await run_batch(
            config,
            self.session.store,
            prompts,
            on_progress=self._post_progress,
            cancel=cancel,
            live=True,  # each sample lands as soon as it is written: the list shows it at once
            on_landed=partial(self._post_landed, asyncio.get_running_loop()),
        )
        self.post_message(self.Finished(summary))

    def _post_landed(self, loop: asyncio.AbstractEventLoop, _samples: int) -> None:
        """Called on the landing thread: the message is posted from the app's loop (its queue is not
        thread-safe), without waiting for it."""
        loop.call_soon_threadsafe(self.post_message, self.Landed())

    def _post_progress(self, progress: BatchProgress) -> None:
        self.post_message(self.Progress(progress))  # coalesced: a burst of progress redraws once

    def worker_failed(self, worker: Worker[object], error: BaseException) -> bool:
        from tokview.batch.tasks import StartInterrupted

        self._idle()
        if isinstance(error, StartInterrupted):  # cancelled while the servers were probed: asked for, no error
            self.query_one("#progress-line", Static).update(plain(f"cancelled: {error}"))
            return True
        self.query_one("#progress-line", Static).update(Text(f"failed: {in_form_words(failure_text(error))}", "red"))
        reword(error, in_form_words)  # the app's notification too names the form's fields, not the flags
        return False

    def _idle(self) -> None:
        self.cancel_event = None
        self.query_one("#run", Button).disabled = False
        self.query_one("#cancel", Button).disabled = True

    @on(Progress)
    def _progress(self, event: Progress) -> None:
        p = event.progress
        bar = self.query_one("#bar", ProgressBar)
        bar.update(total=max(1, p.total), progress=p.done)
        # the line `tokview batch` prints, as text: a retry's reason quotes the server (`[/x]` was read as markup)
        self.query_one("#progress-line", Static).update(plain(progress_line(p)))

    @on(Landed)
    def _landed(self, event: Landed) -> None:
        self._samples_changed()  # results appear in the list the moment they land

    @on(Finished)
    def _finished(self, event: Finished) -> None:
        self._idle()
        s = self.last_summary = event.summary
        state = (
            "cancelled"
            if s.interrupted
            else "stopped"
            if s.stopped
            else "failed"
            if s.failed and not s.ok
            else "done with failures"
            if s.failed
            else "done"
        )
        self.query_one("#progress-line", Static).update(plain(f"{state}: {summary_in_form_words(s.render())}"))
        if s.stopped and not s.interrupted:  # it gave up (a full disk, too many failures in a row): not a finished run
            self.notify(  # a server's words in it (a vocabulary stop quotes its answer): text, not markup
                f"the run stopped: {summary_in_form_words(s.stopped)}", severity="warning", timeout=8, markup=False
            )
        elif s.failed and not s.interrupted:  # `tokview batch` exits 3 then; "done:" and no word hid five HTTP 400s
            why = "; ".join(f"{n} {reason}" for reason, n in list(s.failures_by_class.items())[:2])
            self.notify(
                f"{s.failed} of {s.failed + s.ok} requests failed" + (f": {why}" if why else ""),
                severity="error" if not s.ok else "warning",
                timeout=8,
                markup=False,
            )
        if s.bad_rows:  # the CLI lists them (`say_bad_rows`); the panel said only "N bad rows"
            self.notify(
                in_form_words(bad_rows_said(s.bad_rows, chat_mode="mode parsed chat")),  # "only --mode chat sends"
                title="bad rows skipped",
                severity="warning",
                timeout=12,
                markup=False,  # a row's own text may hold [brackets]
            )
        self._samples_changed()

    def _samples_changed(self) -> None:
        samples_changed = getattr(self.app, "samples_changed", None)
        if samples_changed is not None:  # the tokview app: recount the list as samples land
            samples_changed()
