"""The `tokview` command: argument parsing and exit codes only.

Each subcommand lives in `tokview/commands/<name>.py` with `add_parser(subparsers)` and
`run(args) -> int`; modules are imported only for the command being run, so `tokview batch`
never pays for Textual. A TokviewError (tokview/errors.py) becomes its one line on stderr and its exit
code; any other exception is a bug: one line with a hint, or its traceback under TOKVIEW_DEBUG=1.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from typing import NoReturn

from tokview.errors import ExitCode, TokviewError, one_line

__all__ = ["COMMANDS", "build_parser", "main"]

# Order is the order shown in --help.
COMMANDS = ("demo", "ui", "batch", "export", "audit", "stats", "doctor", "sim", "show", "tokenize", "merge", "score")

DEBUG_HINT = "run with TOKVIEW_DEBUG=1 for the traceback"


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """`only`: build just that command's parser (a command's module may import much: `tokview batch`
    starts ~0.1 s sooner without importing the other eleven)."""
    parser = argparse.ArgumentParser(
        prog="tokview",
        description="Capture, inspect, curate and export token-exact EAGLE-3 training data.",
    )
    parser.add_argument("--version", action="version", version=f"tokview {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        if only is not None and name != only:
            continue
        try:
            module = importlib.import_module(f"tokview.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"tokview.commands.{name}":
                continue
            raise
        module.add_parser(sub)
    return parser


def _version() -> str:
    from tokview import __version__

    return __version__


def main(argv: list[str] | None = None) -> int:
    """Run one command and return its exit code.

    `argv` None means these are the process's own arguments (the `tokview` script, `python -m
    tokview`). Then a command that sets `exit_without_teardown` (`batch`) ends the process here, once
    its work is closed and its output written: see `exit_without_teardown`."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args_in = sys.argv[1:] if argv is None else argv
    if not args_in or (args_in[0].startswith("--") and args_in[0] not in ("--help", "--version")):
        args_in = ["ui", *args_in]  # bare `tokview [--db …]` opens the app
    parser = build_parser(args_in[0] if args_in[0] in COMMANDS else None)
    args = parser.parse_args(args_in)
    if not getattr(args, "run", None):
        parser.print_help()
        return ExitCode.USAGE
    code = _run_command(args)
    if argv is None and getattr(args, "exit_without_teardown", False):
        exit_without_teardown(code)
    return code


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
        except (OSError, ValueError):  # a closed pipe: the reader is gone, nothing to keep
            pass
    os._exit(code)


def _run_command(args: argparse.Namespace) -> int:
    try:
        return int(args.run(args) or 0)
    except TokviewError as exc:
        print(f"tokview: error: {one_line(exc)}", file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        print("tokview: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except BrokenPipeError:  # `tokview stats | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return ExitCode.PIPE_CLOSED
    except Exception as exc:  # not worded for the user, so a bug in tokview: one line, the traceback when asked for
        return report_bug(exc)


def report_bug(exc: BaseException) -> int:
    """An exception that is not a TokviewError: its one line and a hint, or the whole traceback under TOKVIEW_DEBUG."""
    if os.environ.get("TOKVIEW_DEBUG"):
        traceback.print_exception(exc, file=sys.stderr)
        return ExitCode.USAGE
    print(f"tokview: internal error: {one_line(exc)} ({DEBUG_HINT})", file=sys.stderr)
    return ExitCode.USAGE


if __name__ == "__main__":
    sys.exit(main())
