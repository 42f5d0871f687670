"""The export dialog: format, selection, run, tags and path, written by the same `tokview.export.export` the
`tokview export` command runs, and its summary shown as the command prints it (`commands.export.summary`).

The export runs in a thread worker (a large store takes seconds); the dialog stays open to show the summary
or the one-line error, so a second export with other settings is one edit away. Escape closes it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Input, Label, Static, Switch
from textual.worker import Worker

from tokview.store.connection import is_duckdb_file
from tokview.ui.bindings import bindings
from tokview.ui.display import plain
from tokview.ui.form_words import in_words, reword
from tokview.ui.screens.modals import NARROW_BREAKPOINTS
from tokview.ui.widgets.footer import KeysFooter
from tokview.ui.widgets.select import Select
from tokview.ui.worker_errors import ForwardsWorkerErrors, failure_text

if TYPE_CHECKING:
    from tokview.ui.session import Session


DIALOG_NAMES = {
    "--select": "selection",
    "--run": "run",
    "--tag": "tags",
    "--without-tag": "without tags",
    "--include-invalid": "+invalid",
    "--out": "path",
    "--format": "format",
}
"""`tokview export`'s flags → this dialog's labels: its errors and summary are the command's (`form_words`)."""


def in_dialog_words(message: str) -> str:
    return in_words(message, DIALOG_NAMES)


@dataclass(frozen=True)
class ExportRequest:
    """What the dialog asks for, read on the UI thread and handed to the worker as plain values."""

    fmt: str
    out: str
    select: str
    run: str | None
    tags: tuple[str, ...]
    without_tags: tuple[str, ...]
    include_invalid: bool


def split_tags(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def writable(folder: Path) -> bool:
    """Whether this process may create a file in `folder`."""
    return os.access(folder, os.W_OK)


class ExportDialog(ForwardsWorkerErrors, ModalScreen[None]):
    HORIZONTAL_BREAKPOINTS = NARROW_BREAKPOINTS
    BINDINGS: ClassVar[list[BindingType]] = [*bindings("export dialog")]
    DEFAULT_CSS = """
    ExportDialog { align: center middle; }
    ExportDialog .modal { width: 90; max-height: 100%; padding: 0 1; }
    ExportDialog .export-row { height: 3; }
    ExportDialog .export-row Label { width: 12; padding: 1 1 0 0; }
    ExportDialog .export-row Input, ExportDialog .export-row Select { width: 1fr; }
    /* scrolls: cut at 8 lines, a summary's last lines (how exact each trainer's path is) were never seen */
    ExportDialog #export-summary-box { height: auto; max-height: 14; }
    ExportDialog #export-summary { height: auto; }
    """

    class Done(Message):
        def __init__(self, summary: str) -> None:
            super().__init__()
            self.summary = summary

    def __init__(self, session: Session, run: str | None = None, tag: str | None = None) -> None:
        super().__init__()
        self.session, self.run, self.tag = session, run, tag

    def compose(self) -> ComposeResult:
        from tokview.export import FORMATS, SELECTIONS
        from tokview.export.registry import DEFAULT_FORMAT

        with Vertical(classes="modal"):
            yield Label("Export (as tokview export does) · ctrl+s writes · esc closes", classes="modal-title")
            with Horizontal(classes="export-row"):
                yield Label("format")
                yield Select(
                    [(f"{n} ({f.label})", n) for n, f in FORMATS.items()],
                    value=DEFAULT_FORMAT,
                    id="export-format",
                    allow_blank=False,
                )
                yield Select([(s, s) for s in SELECTIONS], value="valid", id="export-select", allow_blank=False)
            with Horizontal(classes="export-row"):
                yield Label("tags")
                yield Input(self.tag or "", placeholder="only samples tagged (a, b: every one)", id="export-tags")
                yield Input(placeholder="without tags", id="export-without-tags")
            with Horizontal(classes="export-row"):
                yield Label("run")
                yield Input(self.run or "", placeholder="every run", id="export-run")
                yield Label("+invalid")
                yield Switch(False, id="export-invalid")
            with Horizontal(classes="export-row"):
                yield Label("path")
                yield Input(self._default_path(DEFAULT_FORMAT), id="export-path")
            with VerticalScroll(id="export-summary-box"):
                yield Static("", id="export-summary")
        yield KeysFooter()

    def _default_path(self, fmt: str) -> str:
        """`export.<suffix>` beside the store (a bare name landed in whatever folder the app was started from); where
        the store's folder cannot be written (a read-only mount, another user's folder), in the current folder or the
        home folder, the first that can: a default that cannot be written fails only on ctrl+s."""
        from tokview.export.registry import export_format

        name = f"export.{export_format(fmt).file.suffix}"
        store = self.session.store.path
        if store in ("", ":memory:"):
            return name
        places = (Path(store).resolve().parent, Path.cwd(), Path.home())
        folder = next((p for p in places if writable(p)), places[0])
        return str(folder / name)

    @on(Select.Changed, "#export-format")
    def _format_changed(self, event: Select.Changed) -> None:
        """A path still at a default name follows the format's suffix (Parquet writes .parquet)."""
        path = self.query_one("#export-path", Input)
        if Path(path.value).name.startswith("export.") and event.value is not Select.NULL:
            path.value = str(Path(path.value).with_name(Path(self._default_path(str(event.value))).name))

    def request(self) -> ExportRequest:
        def value(widget_id: str) -> str:
            return self.query_one(widget_id, Input).value.strip()

        out = value("#export-path")
        return ExportRequest(
            fmt=str(self.query_one("#export-format", Select).value),
            out=str(Path(out).expanduser()) if out else "",  # `~/x.jsonl`: the file checked is the file written
            select=str(self.query_one("#export-select", Select).value),
            run=value("#export-run") or None,
            tags=split_tags(value("#export-tags")),
            without_tags=split_tags(value("#export-without-tags")),
            include_invalid=self.query_one("#export-invalid", Switch).value,
        )

    _replacing: str | None = None
    """The existing file the last ctrl+s was told about: the next one with the same path replaces it."""

    running = False
    """An export this dialog started is writing: Esc does not close the dialog until it has ended (its thread cannot
    be stopped halfway, and closed, the dialog would never say how it ended)."""

    def action_run(self) -> None:
        request = self.request()
        if self.running:
            self._say(f"an export is still writing: {request.out}")
            return
        if not request.out:
            self._say("give a path to write to")
            return
        asked, self._replacing = self._replacing, None  # a ctrl+s replaces only right after the one that asked
        if request.include_invalid and request.select != "approved":  # `export --include-invalid` refuses it too
            other = "exports them already" if request.select == "all" else "leaves every invalid sample out"
            self._say(f"+invalid goes with the approved selection ({request.select} {other})")
            return
        if request.out == "-":  # `tokview export --out -` streams to stdout: the app's stdout is no file to read back
            self._say("the dialog writes a file: give its path (- streams, from `tokview export --out -`)")
            return
        target = Path(request.out)  # `request` expanded `~`
        if is_duckdb_file(target):  # refused by the export anyway: not offered to be replaced first
            self._say(f"{target} is a DuckDB database (a store?): choose another file")
            return
        if target.is_file() and asked != str(target.resolve()):  # one key press replaced an earlier export
            self._replacing = str(target.resolve())
            self._say(f"{target.resolve()} exists: ctrl+s again replaces it (or change the path)")
            return
        self.query_one("#export-summary", Static).update(plain(f"exporting to {request.out} …"))
        self.running = True
        self._export(request)

    def _say(self, text: str) -> None:
        """Why ctrl+s wrote nothing, in the summary line and as a notification: at 80x24 the summary lies below the
        dialog's visible part, and a second ctrl+s replaced a file after a warning nobody saw."""
        self.query_one("#export-summary", Static).update(plain(text))
        self.app.notify(text, title="export", severity="warning", markup=False, timeout=4)

    @on(Input.Submitted)
    def _submitted(self) -> None:
        self.action_run()

    @work(thread=True, exclusive=True, group="export", exit_on_error=False)
    def _export(self, request: ExportRequest) -> None:
        from tokview.commands.export import summary
        from tokview.export import export

        store = self.session.store
        tokenizer, profile = self.session.export_pair(request.run)
        result = export(
            store,
            request.fmt,
            request.out,
            select=request.select,
            run=request.run,
            tokenizer=tokenizer,
            profile=profile,
            include_invalid=request.include_invalid,
            tags=request.tags,
            without_tags=request.without_tags,
        )
        self.post_message(self.Done(in_dialog_words(summary(result))))

    @on(Done)
    def _done(self, event: Done) -> None:
        self.running = False
        self.query_one("#export-summary", Static).update(plain(event.summary))
        # said where it is seen too: at 80x24 the summary lies below the dialog's visible part
        first = event.summary.splitlines()[0] if event.summary else "exported"
        self.app.notify(first, title="export", markup=False)

    def worker_failed(self, worker: Worker[object], error: BaseException) -> None:
        self.running = False  # the app says it too (a falsy answer forwards the failure)
        reword(error, in_dialog_words)
        self.query_one("#export-summary", Static).update(plain(failure_text(error)))

    def action_cancel(self) -> None:
        if self.running:  # closed, the export wrote on unseen (29 s of a 100,000-sample store) and said nothing
            self._say(
                "the export is still writing (it cannot stop halfway): its summary shows when it ends, then Esc closes"
            )
            return
        self.dismiss(None)
