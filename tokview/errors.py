"""One error model for the whole tool: `TokviewError(message, title=…)` and the exit codes.

Everything a user can fix or act on (a missing file, a locked store, an unreachable server, a tokenizer
that will not load, a bad row) is raised as a `TokviewError` subclass with a short `title` (what kind of
problem, the heading of an app notification) and a one-line `message` (what happened and what to do).
The CLI prints such an error as its one line and exits with its `exit_code`; the app shows it as a
notification titled `title`. Any other exception is a bug in tokview: the CLI says so in one line (the
traceback under `TOKVIEW_DEBUG=1`) and exits `ExitCode.INTERNAL`, the app says so in a generic notification.

A message is masked when the error is made (tokview/secrets.py's rules): whoever shows it (the CLI, a
notification, a stored failure) never shows a credential.

This module imports nothing from tokview but two leaves (secrets, untrusted_text), so every layer (core
included) can raise these.
"""

from __future__ import annotations

import errno
import os
from enum import IntEnum
from pathlib import Path

from tokview.secrets import scrub_text
from tokview.untrusted_text import printable_line


class ExitCode(IntEnum):
    """The process exit codes of every `tokview` command, defined here only."""

    OK = 0
    USAGE = 1
    """Bad arguments or input, a missing file, a store that cannot be opened: the user can fix it."""
    UNREACHABLE = 2
    """No server answered."""
    FAILURES = 3
    """Finished, but some requests failed (batch, score) or a doctor check failed."""
    BAD_ROWS = 4
    """Finished without failed requests, but unreadable input rows were skipped: the data set is not the
    whole file, and a script must not mistake that for a clean run."""
    INTERRUPTED = 130
    """Ctrl-C (128 + SIGINT); committed samples are kept."""
    TERMINATED = 143
    """128 + SIGTERM: `tokview proxy` left at a second SIGTERM without waiting for its recorder (which lands on)."""
    INTERNAL = 70
    """A bug in tokview (an exception no layer worded for the user): sysexits' EX_SOFTWARE, so a script
    tells a broken tool from a usage error (1) and from a finished run's outcomes (2-4)."""
    PIPE_CLOSED = 141
    """128 + SIGPIPE: what a shell reports for a writer whose reader went away (`tokview stats | head`)."""


class TokviewError(Exception):
    """A problem worded for the user: a `title` (its kind) and a one-line message (what happened, what to do)."""

    title: str = "error"
    exit_code: int = ExitCode.USAGE
    titled: bool = False
    """The CLI's line starts with the title (`server unreachable: …`) where the message alone does not say
    what kind of failure it is; the app shows the title anyway, as the notification's heading."""

    def __init__(self, message: str, *, title: str | None = None, exit_code: int | None = None) -> None:
        message = scrub_text(message)  # an error may quote a URL or a server's text: no credential in it
        super().__init__(message)
        self.message = message
        if title is not None:
            self.title = title
        if exit_code is not None:
            self.exit_code = exit_code


class UserError(TokviewError):
    """A problem the user can fix on the command line (a bad flag value, a missing file)."""

    title = "usage"


def first_line(exc: BaseException, limit: int | None = None) -> str:
    """The first non-empty line of an exception's text (its type's name when it has none), cut to `limit`.

    Library errors (DuckDB, transformers, jinja, httpx) carry multi-line texts with hints and context
    dumps; a one-line error, a notification or a failure reason takes their first line only, and the line after
    when the first only introduces it (transformers' "Couldn't instantiate the backend tokenizer from one of:").
    """
    text = str(exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = lines[0] if lines else type(exc).__name__
    if line.endswith(":") and len(lines) > 1:
        line = f"{line} {lines[1]}"
    return line[:limit] if limit is not None else line


def one_line(exc: BaseException) -> str:
    """What a user sees for any exception on one line: a TokviewError's whole message (its lines joined, a
    server's multi-line reason included); for anything else (a bug) its type and first line. Control
    characters are escaped: a message may quote a server's text (a model name, an error body), and an ESC
    in it would act on the terminal."""
    return printable_line(_one_line(exc))


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, TokviewError):
        return " ".join(line.strip() for line in exc.message.splitlines() if line.strip()) or exc.title
    text = first_line(exc)
    name = type(exc).__name__
    return name if text == name else f"{name}: {text}"


def describe_error(exc: BaseException) -> str:
    """An exception in words; an OSError about a path whose parent is a file says so: `[Errno 17] File exists:
    'a'` for `--db a/x.duckdb` means a is a file, not a folder."""
    if isinstance(exc, OSError) and exc.errno in (errno.EEXIST, errno.ENOTDIR) and exc.filename:
        path = Path(os.fsdecode(exc.filename))
        blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            return f"cannot create {path}: {blocker} is a file, not a folder"
    return str(exc)
