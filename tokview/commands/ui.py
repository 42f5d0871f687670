"""`tokview ui` (and bare `tokview`): open the app on a store. Textual is imported only here, lazily."""

from __future__ import annotations

import sys

from tokview.cli import UserError


def add_parser(sub) -> None:
    from tokview.core.resolve import add_tokenizer_arguments

    p = sub.add_parser("ui", help="open the app: inspect tokens, curate, generate (the default command)")
    p.add_argument("--db", default="tokview.duckdb", help="DuckDB file (default: ./tokview.duckdb; created if missing)")
    p.add_argument("--server", metavar="URL", default=None, help="SGLang or vLLM server for generate and doctor")
    add_tokenizer_arguments(p)
    p.set_defaults(run=run)


def open_app(db: str, *, server: str | None = None, tokenizer=None, profile: str | None = None,
             trust_remote_code: bool = False) -> int:
    """Open the store, check the config, run the app until the user quits."""
    from tokview.store import Store
    from tokview.ui.config import ConfigError, load_config
    from tokview.ui.session import Session

    try:
        config = load_config()
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    from tokview.ui.app import TokviewApp
    from tokview.ui.screens.help import binding_ids

    unknown = set(config.keymap) - binding_ids()
    if unknown:
        raise UserError(f"config {config.path}: keymap names unknown binding ids {sorted(unknown)} "
                        f"(see the help screen, ?, for the ids)")
    if server is not None:
        from tokview.servers.urls import server_url_notes, validate_server_url

        try:
            notes = server_url_notes(server)
            server = validate_server_url(server)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        for note in notes:  # before the app takes the terminal, so it is still there after quitting
            print(f"tokview: note: {note}", file=sys.stderr)
    if tokenizer is not None and not tokenizer.is_dir():
        raise UserError(f"tokenizer directory not found: {tokenizer}")
    if profile:
        from tokview.core.profiles import get_profile

        get_profile(profile)  # an unknown name fails here as one line, not inside the app
    with Store(db) as store:
        session = Session(store, tokenizer_dir=tokenizer, profile_name=profile, server_url=server,
                          trust_remote_code=trust_remote_code)
        TokviewApp(session, config).run()
    return 0


def run(args) -> int:
    return open_app(args.db, server=args.server, tokenizer=args.tokenizer, profile=args.profile,
                    trust_remote_code=args.trust_remote_code)
