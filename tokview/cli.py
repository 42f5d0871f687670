"""The `tokview` command: argument parsing and exit codes only.

Each subcommand lives in `tokview/commands/<name>.py` with `add_parser(subparsers)` and
`run(args) -> int`; modules are imported only for the command being run, so `tokview batch`
never pays for Textual. A TokviewError (tokview/errors.py) becomes its one line on stderr and its exit
code; any other exception is a bug: one line with a hint, or its traceback under TOKVIEW_DEBUG=1, and
exit code 70 (ExitCode.INTERNAL). A command whose module does not import is such a bug, said as one.
"""

from __future__ import annotations

import argparse
import codecs
import errno
import importlib
import io
import math
import os
import sys
import traceback
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn

from tokview.commands.once import every_flag_once
from tokview.errors import ExitCode, TokviewError, UserError, one_line
from tokview.untrusted_text import char_escape, printable_line, writes_unicode

__all__ = ["COMMANDS", "build_parser", "main"]

# Order is the order shown in --help.
COMMANDS = (
    "demo",
    "ui",
    "batch",
    "export",
    "audit",
    "stats",
    "review",
    "doctor",
    "sim",
    "show",
    "tokenize",
    "merge",
    "score",
    "proxy",
)

DEBUG_HINT = "run with TOKVIEW_DEBUG=1 for the traceback"


class UsageError(UserError):
    """Arguments argparse refused (an unknown flag, `--concurrency abc`, `--shard 3/2`)."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a refused argument is a usage error like any other: one line and exit 1.

    argparse's own `error` prints the whole usage and exits 2, the code tokview documents for an
    unreachable server, so a script could not tell a typo from a dead server. Subcommands' parsers are
    made by this class too (argparse builds them with the parent's class).

    A float option given NaN is refused here, for every command: every comparison with NaN is false, so
    `--max-nll nan` kept everything and `--off-policy-nll nan` was refused as 'not more than 0'."""

    # typeshed overloads parse_known_args on the namespace type; this one takes and gives a Namespace
    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        for action in self._actions:
            value = getattr(parsed, action.dest, None)
            if action.option_strings and isinstance(value, float) and math.isnan(value):
                self.error(f"{action.option_strings[-1]} must be a finite number, not {value}")
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("tokview").strip()
        where = f"{command}: " if command else ""
        raise UsageError(f"{where}{message} (see tokview {command + ' ' if command else ''}--help)")


class StreamClosed(OSError):
    """Written to a standard stream the shell closed (`>&-`)."""


class _ClosedStream(io.TextIOBase):
    """What `sys.stdout` is when the process started with fd 1 closed: a write (data nobody can read)
    is an error the command reports in one line; flushing, which every exit does, is not."""

    def __init__(self, name: str) -> None:
        self._name = name

    def write(self, text: str) -> int:
        raise StreamClosed(errno.EBADF, f"{self._name} is closed (the shell ran tokview with >&-)")

    def fileno(self) -> int:
        raise StreamClosed(errno.EBADF, f"{self._name} is closed (the shell ran tokview with >&-): give a file instead")

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def guard_standard_streams() -> None:
    """Hold fds 0-2 open when the shell closed them (`>&-`, `2>&-`), before anything else is opened.

    A closed fd is the first one `open` hands out: the store's database file could become fd 1, and any
    write to stdout (a library's print, a child process) would land in it. Each closed fd is taken by
    /dev/null. Python left `sys.stdout`/`sys.stderr` None: stderr becomes /dev/null (the messages have no
    reader, the exit code still tells), stdout a stream that refuses data, which nobody would receive."""
    closed = [fd for fd in (0, 1, 2) if not _is_open(fd)]
    if not closed:
        return
    null = os.open(os.devnull, os.O_RDWR)
    for fd in closed:
        if fd != null:
            os.dup2(null, fd)
    if null not in closed:
        os.close(null)
    if sys.stdout is None:
        sys.stdout = _ClosedStream("stdout")
    if sys.stderr is None:
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115 (the process's stderr: never closed)


def tolerate_narrow_encodings() -> None:
    """In a locale whose encoding cannot write every character (`LC_ALL=C` with `PYTHONUTF8=0`, a Latin-1 terminal),
    stdout writes what it cannot encode as escapes (stderr does already): tokview's own `·` and `✓`, or a sample's
    CJK text, ended `show`, `stats`, `doctor` and others as tokview's bug (exit 70). Data files are written as UTF-8
    bytes whatever the locale."""
    stream = sys.stdout
    if isinstance(stream, io.TextIOWrapper) and stream.encoding and not writes_unicode(stream):
        codecs.register_error(NARROW_ERRORS, _narrow_escape)
        stream.reconfigure(errors=NARROW_ERRORS)


NARROW_ERRORS = "tokview-narrow"
"""stdout's error handler in a narrow locale (`_narrow_escape`)."""


def _narrow_escape(exc: UnicodeError) -> tuple[str | bytes, int]:
    """What the locale cannot encode: a byte an argument carried (Python's surrogateescape, the locale's own
    handler: a path printed back as its bytes) as that byte, anything else as its backslash escape."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    ch = exc.object[exc.start]
    if "\udc80" <= ch <= "\udcff":
        return bytes([ord(ch) - 0xDC00]), exc.start + 1
    return char_escape(ch), exc.start + 1


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """`only`: build just that command's parser (a command's module may import much: `tokview batch`
    starts ~0.1 s sooner without importing the other eleven)."""
    parser = _Parser(
        prog="tokview",
        description="Capture, inspect, curate and export token-exact EAGLE-3 training data.",
    )
    parser.add_argument("--version", action="version", version=f"tokview {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        if only is not None and name != only:
            continue
        _load_command(name).add_parser(sub)
    every_flag_once(parser)
    return parser


class CommandDidNotLoad(Exception):
    """A command's module failed to import: a broken install or a bug, never a command to leave out."""


def _load_command(name: str) -> ModuleType:
    """The module of command `name`; any failure to import it is said (CommandDidNotLoad), so a command
    never silently vanishes from `--help` or turns into argparse's 'invalid choice'."""
    try:
        return importlib.import_module(f"tokview.commands.{name}")
    except Exception as exc:  # ImportError, or whatever the module's top level raised
        raise CommandDidNotLoad(f"the {name} command did not load: {one_line(exc)}") from exc


def _version() -> str:
    from tokview import __version__

    return __version__


PATHS_READ_OR_WRITTEN_ONLY = frozenset({"--out", "--chat"})
"""Options whose value is a path tokview only reads or writes, never stores (an export's file, `tokenize --chat`): its
bytes may be any a file system takes. A store, a tokenizer folder, a profile and a prompts file are recorded in the
store (a run's source and tokenizer folder), which holds UTF-8 only."""


def _not_utf8(args: list[str]) -> str | None:
    """What to say of the first argument whose bytes are not UTF-8 (Python hands them over as lone surrogates), or
    None. Names and paths tokview records end up in the store, which holds UTF-8 only: `batch --run $'\\xff'` stored
    its samples under a garbled run with no run record, then said it could not write to the store; a prompts file so
    named did the same. Let through: a path only read or written (`PATHS_READ_OR_WRITTEN_ONLY`), and `audit`'s
    dataset, which asks for --name then."""
    for k, arg in enumerate(args):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            flag = args[k - 1] if k else ""
            if flag in PATHS_READ_OR_WRITTEN_ONLY or arg.split("=", 1)[0] in PATHS_READ_OR_WRITTEN_ONLY:
                continue
            if args[0] == "audit" and not flag.startswith("-") and os.path.lexists(arg):
                continue
            raw = os.fsencode(arg)
            shown = raw.decode("utf-8", "backslashreplace")
            what = f"the value of {args[k - 1]}" if k and args[k - 1].startswith("-") else f"argument {k + 1}"
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return f"{what} ('{shown}') holds bytes that are not UTF-8 text: give names and paths in UTF-8"
            encoding = sys.getfilesystemencoding()  # UTF-8 bytes a narrow locale could not read as text
            return f"{what} ('{shown}') is UTF-8, which this locale ({encoding}) cannot read: run with LC_ALL=C.UTF-8"
    return None


def main(argv: list[str] | None = None) -> int:
    """Run one command and return its exit code.

    `argv` None means these are the process's own arguments (the `tokview` script, `python -m
    tokview`). Then a command that sets `exit_without_teardown` (`batch`) ends the process here, once
    its work is closed and its output written: see `exit_without_teardown`."""
    guard_standard_streams()
    tolerate_narrow_encodings()
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args_in = sys.argv[1:] if argv is None else argv
    if not args_in or (args_in[0].startswith("--") and args_in[0] not in ("--help", "--version")):
        args_in = ["ui", *args_in]  # bare `tokview [--db …]` opens the app
    if (bad := _not_utf8(args_in)) is not None:
        print(f"tokview: error: {bad}", file=sys.stderr)
        return ExitCode.USAGE
    try:
        if argv is None and args_in[0] in ("batch", "score"):
            from tokview.batch.tasks import sigterm_as_ctrl_c

            sigterm_as_ctrl_c()
        if argv is None and args_in[0] == "batch":
            from tokview.batch.early_landing import start_early

            start_early(args_in)  # its imports overlap ours from here, not from the run's start (~0.1 s later)
        parser = build_parser(args_in[0] if args_in[0] in COMMANDS else None)
        args = parser.parse_args(args_in)
    except UsageError as exc:
        print(f"tokview: error: {one_line(exc)}", file=sys.stderr)
        return ExitCode.USAGE
    except CommandDidNotLoad as exc:
        return report_bug(exc.__cause__ or exc, line=str(exc))
    except KeyboardInterrupt:  # Ctrl-C while the command's modules load
        print("tokview: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    if not getattr(args, "run", None):
        parser.print_help()
        return ExitCode.USAGE
    code = _run_command(args)
    if argv is None:
        _stops_end_quietly()
    try:  # what the command printed last is still buffered: written now, so a full disk is said, not ignored
        sys.stdout.flush()
    except OSError as exc:
        if exc.errno in OUT_OF_ROOM:
            code = max(code, _out_of_room(exc))
    if argv is None and getattr(args, "exit_without_teardown", False):
        exit_without_teardown(code)
    return code


def _stops_end_quietly() -> None:
    """Once the command's work is done (its exit code decided), a Ctrl-C is ignored and a SIGTERM ends the process
    as its default does: one arriving while the interpreter joins its threads at exit printed a traceback from
    `threading._shutdown` (a merge that had merged, killed then; exit 0 either way)."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def exit_without_teardown(code: int) -> NoReturn:
    """End the process now: atexit handlers run (Ray's shutdown, multiprocessing's reaping, logging's
    flush) and stdout/stderr are flushed, but the interpreter's teardown, which frees every object one
    by one, is skipped. After a batch that is the tokenizer's 160k-entry vocabulary, DuckDB and the
    imported modules: ~50 ms of a 300-sample run's ~1 s, spent after the work is durable. The command
    has closed its stores and files itself by then (nothing is left to a finalizer)."""
    import atexit
    import threading

    for thread in threading.enumerate():  # what the interpreter waits for before its atexit handlers
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # a closed pipe (the reader is gone) or no stream at all
            pass
    os._exit(code)


def _run_command(args: argparse.Namespace) -> int:
    try:
        return int(args.run(args) or 0)
    except TokviewError as exc:  # raised where it happened, already worded and masked: never re-wrapped
        title = f"{exc.title}: " if exc.titled else ""
        print(f"tokview: error: {title}{one_line(exc)}", file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        print("tokview: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except BrokenPipeError:  # `tokview stats | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return ExitCode.PIPE_CLOSED
    except StreamClosed as exc:  # `tokview export --out - >&-`: the data has nowhere to go
        print(f"tokview: error: {exc.strerror}", file=sys.stderr)
        return ExitCode.USAGE
    except OSError as exc:
        if exc.errno in OUT_OF_ROOM:
            return _out_of_room(exc)
        if exc.errno in PATH_REFUSED and exc.filename:
            print(
                f"tokview: error: {printable_line(f'cannot use {exc.filename}: {exc.strerror or exc}')}",
                file=sys.stderr,
            )
            return ExitCode.USAGE
        return report_bug(exc)
    except Exception as exc:  # not worded for the user, so a bug in tokview: one line, the traceback when asked for
        if _ctrl_c_in_a_query(exc):
            print("tokview: interrupted", file=sys.stderr)
            return ExitCode.INTERRUPTED
        return report_bug(exc)


OUT_OF_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
"""What writing can meet that the user fixes (a full disk or quota, `> /dev/full`, a file past the size limit): no
bug, so one line and exit 1, not the internal error (exit 70) they were reported as. An EIO or EROFS that no layer
worded stays a bug's exit: tokview may have written where it should not."""


PATH_REFUSED = frozenset({errno.EACCES, errno.EPERM, errno.ENAMETOOLONG, errno.ELOOP})
"""What the system says of a path the user gave (a file or folder this user may not read, a name too long, a symlink
loop), wherever tokview first touched it (Python's `Path.is_dir()` and `exists()` raise these rather than answer
False): one line naming the path and exit 1, not the internal error (exit 70) twelve commands reported."""


def _out_of_room(exc: OSError) -> int:
    where = f": {exc.filename}" if exc.filename else ""
    print(f"tokview: error: {printable_line(f'{exc.strerror or exc}{where}')}", file=sys.stderr)
    return ExitCode.USAGE


def _ctrl_c_in_a_query(exc: Exception) -> bool:
    """A Ctrl-C that reached DuckDB inside a statement: it stops the statement (rolled back) and raises its own
    error, "Query interrupted" (`InterruptException`, or a RuntimeError from a fetch), instead of the
    KeyboardInterrupt every command turns into exit 130. It was reported as an internal error (exit 70)."""
    duckdb = sys.modules.get("duckdb")
    interrupt = getattr(duckdb, "InterruptException", None) if duckdb is not None else None
    if interrupt is not None and isinstance(exc, interrupt):
        return True
    return isinstance(exc, RuntimeError) and str(exc).startswith("Query interrupted")


def report_bug(exc: BaseException, line: str | None = None) -> int:
    """An exception that is not a TokviewError: one line (`line`, else the exception's) and a hint, or the
    whole traceback under TOKVIEW_DEBUG; either way the exit code of a bug, not of a usage error."""
    if os.environ.get("TOKVIEW_DEBUG"):
        traceback.print_exception(exc, file=sys.stderr)
        return ExitCode.INTERNAL
    print(f"tokview: internal error: {line or one_line(exc)} ({DEBUG_HINT})", file=sys.stderr)
    return ExitCode.INTERNAL


if __name__ == "__main__":
    sys.exit(main())
