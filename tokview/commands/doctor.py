"""`tokview doctor --server URL`: what one server does with token ids, in plain words.

Exit 0 when no check fails, 3 when a check fails (✗), 2 when the server does not answer, so it
can gate a CI job or a batch run.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys

from tokview.errors import ExitCode, UserError
from tokview.untrusted_text import stdout_json


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tokview.core.resolve import add_tokenizer_arguments

    p = sub.add_parser("doctor", help="probe a server: id fields, think opener, reasoning field, hidden ids")
    p.add_argument("--server", required=True, metavar="URL", help="e.g. http://127.0.0.1:8000")
    add_tokenizer_arguments(
        p,
        tokenizer_default="none; the render and hidden-id checks need one, the tokview simulator's Kimi layout "
        "is found on its own",
        profile_default="detected from the tokenizer or the server's answers",
    )
    p.add_argument(
        "--thinking",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="probe with thinking on (default) or off",
    )
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per request (default 30)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tokview.core.profiles import get_profile
    from tokview.core.tokenizer import load_tokenizer
    from tokview.servers.doctor import run_doctor
    from tokview.servers.urls import server_url_notes, validate_server_url

    if not math.isfinite(args.timeout) or args.timeout <= 0:
        raise UserError("--timeout must be a finite number of seconds above 0")
    server = validate_server_url(args.server)  # BadServerURL: "bad server URL …", as batch and ui word it
    notes = server_url_notes(args.server)
    if args.json:  # the text report shows its notes on stdout; JSON readers get them on stderr too
        for note in notes:
            print(f"tokview: note: {note}", file=sys.stderr)
    tokenizer = load_tokenizer(args.tokenizer, trust_remote_code=args.trust_remote_code) if args.tokenizer else None
    profile = get_profile(args.profile) if args.profile else None
    report = asyncio.run(  # ServerUnreachable: exit 2
        run_doctor(
            server, tokenizer=tokenizer, profile=profile, thinking=args.thinking, timeout=args.timeout, notes=notes
        )
    )
    if args.json:
        print(stdout_json(report.to_dict()))
    else:
        print(report.render_text())
    return ExitCode.FAILURES if report.failed or report.incomplete else ExitCode.OK
