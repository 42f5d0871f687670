"""The `tokview` command: argument parsing and exit codes only.

Each subcommand lives in `tokview/commands/<name>.py` with `add_parser(subparsers)` and
`run(args) -> int`; modules are imported only for the command being run, so `tokview batch`
never pays for Textual. Every user-facing error becomes one line on stderr and a non-zero exit.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# Order is the order shown in --help.
COMMANDS = ("demo", "ui", "batch", "export", "audit", "stats", "doctor", "sim", "show", "tokenize", "merge", "score")

EXIT_OK, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_FAILURES, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_PIPE_CLOSED = 141  # 128 + SIGPIPE, what a shell reports for a writer whose reader went away


class UserError(Exception):
    """A problem the user can fix (bad input, missing file): printed as one line, exit 1."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


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
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args_in = sys.argv[1:] if argv is None else argv
    if not args_in or (args_in[0].startswith("--") and args_in[0] not in ("--help", "--version")):
        args_in = ["ui", *args_in]  # bare `tokview [--db …]` opens the app
    parser = build_parser(args_in[0] if args_in[0] in COMMANDS else None)
    args = parser.parse_args(args_in)
    if not getattr(args, "run", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.run(args) or 0)
    except UserError as exc:
        print(f"tokview: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("tokview: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `tokview stats | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return EXIT_PIPE_CLOSED
    except (ValueError, OSError) as exc:  # our own error types derive from ValueError
        print(f"tokview: error: {describe_error(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # last resort: one line, the traceback only when asked for
        if os.environ.get("TOKVIEW_DEBUG"):
            raise
        print(f"tokview: error: {type(exc).__name__}: {exc} (set TOKVIEW_DEBUG=1 for the traceback)", file=sys.stderr)
        return EXIT_USAGE


def describe_error(exc: BaseException) -> str:
    """An OSError in words: `[Errno 17] File exists: 'a'` for `--db a/x.duckdb` means a is a file."""
    import errno
    from pathlib import Path

    if isinstance(exc, OSError) and exc.errno in (errno.EEXIST, errno.ENOTDIR) and exc.filename:
        path = Path(os.fsdecode(exc.filename))
        blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            return f"cannot create {path}: {blocker} is a file, not a folder"
    return str(exc)


if __name__ == "__main__":
    sys.exit(main())
