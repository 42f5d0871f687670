"""`tokview ui` (and bare `tokview`): open the app on a store. Textual is imported only here, lazily."""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from pathlib import Path

from tokview.commands.store_arg import add_db_argument
from tokview.errors import UserError

APP_LOCK_TIMEOUT_S = 15.0
"""How long a key press waits for a store another process holds before saying so: the app's keys run on
its one thread, so the batch default (minutes) would freeze the screen."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tokview.core.resolve import add_tokenizer_arguments

    p = sub.add_parser("ui", help="open the app: inspect tokens, curate, generate (the default command)")
    add_db_argument(p, "DuckDB file")
    p.add_argument(
        "--create",
        action="store_true",
        help="create the store (and its folder) if it does not exist; without it, the app asks",
    )
    p.add_argument("--server", metavar="URL", default=None, help="SGLang or vLLM server for generate and doctor")
    p.add_argument(
        "--reviewer",
        metavar="NAME",
        default=None,
        help="who verdicts are recorded as (default: config [ui] reviewer, else $USER)",
    )
    add_tokenizer_arguments(p)
    p.set_defaults(run=run, create=False, reviewer=None)


def reviewer_name(given: str | None, configured: str | None) -> str | None:
    """Who the verdicts are recorded as: --reviewer, else the config's [ui] reviewer, else the login name."""
    if given is not None and not given.strip():
        raise UserError("--reviewer must not be empty")
    name = (given or "").strip() or configured or os.environ.get("USER") or os.environ.get("USERNAME")
    if not name:
        try:
            name = getpass.getuser()
        except Exception:  # no login name at all (a container without /etc/passwd entry): stay anonymous
            name = None
    return name


def confirm_new_store(db: str, create: bool) -> None:
    """A store that does not exist is made only when asked: a mistyped --db must not start an empty one."""
    path = Path(db)
    if path.exists() or create:
        return
    where = f"{path}" + ("" if path.parent.is_dir() else f" (and the folder {path.parent})")
    if sys.stdin is None or not sys.stdin.isatty():  # None: stdin closed (`<&-`)
        raise UserError(f"database not found: {db} (pass --create to make a new store there)")
    try:
        answer = input(f"tokview: {where} does not exist. Create a new store there? [y/N] ")
    except EOFError:
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        raise UserError(f"database not found: {db} (nothing created)")


def has_terminal() -> bool:
    """Whether the app can run here: Textual reads keys from stdin and draws on stderr. Without a terminal (cron, CI,
    a script's redirect) it waited forever for keys that never came, writing its escapes into the log."""
    return all(stream is not None and stream.isatty() for stream in (sys.__stdin__, sys.__stderr__))


NO_TERMINAL = (
    "the app needs a terminal (stdin and stderr are not one here): run it in a terminal, or use another command"
)


def open_app(
    db: str,
    *,
    server: str | None = None,
    tokenizer: Path | None = None,
    profile: str | None = None,
    trust_remote_code: bool = False,
    create: bool = True,
    reviewer: str | None = None,
) -> int:
    """Open the store, check the config, run the app until the user quits."""
    from tokview.store import Store
    from tokview.ui.config import load_config
    from tokview.ui.session import Session

    config = load_config()  # ConfigError: one line
    who = reviewer_name(reviewer, config.reviewer)
    from tokview.ui.app import TokviewApp

    if server is not None:
        from tokview.servers.urls import server_url_notes, validate_server_url

        notes = server_url_notes(server)  # BadServerURL: one line
        server = validate_server_url(server)
        for note in notes:  # before the app takes the terminal, so it is still there after quitting
            print(f"tokview: note: {note}", file=sys.stderr)
    if tokenizer is not None:
        from tokview.core.tokenizer_folder import existing_folder

        existing_folder(tokenizer)
    if profile:
        from tokview.core.profiles import get_profile

        get_profile(profile)  # an unknown name fails here as one line, not inside the app
    confirm_new_store(db, create)
    if not has_terminal():
        raise UserError(NO_TERMINAL)
    with Store(db, lock_timeout=APP_LOCK_TIMEOUT_S) as store:
        session = Session(
            store,
            tokenizer_dir=tokenizer,
            profile_name=profile,
            server_url=server,
            trust_remote_code=trust_remote_code,
            who=who,
        )
        app = TokviewApp(session, config)
        app.run()
    return app.return_code or 0  # non-zero when the app ended on an error


def run(args: argparse.Namespace) -> int:
    return open_app(
        args.db,
        server=args.server,
        tokenizer=args.tokenizer,
        profile=args.profile,
        trust_remote_code=args.trust_remote_code,
        create=args.create,
        reviewer=args.reviewer,
    )
