"""`tokview proxy --server URL`: record any harness's traffic to vLLM or SGLang, token-exact, as it runs.

Point the harness's OpenAI base URL at the proxy (`http://127.0.0.1:8900/v1`). Every chat or completions
request is forwarded with the fields that return token ids added, the answer goes back exactly as the
server would have sent it without them, and each generation becomes a sample (grouped into sessions) in
the store, which the app and `stats` read while the harness runs.
"""

from __future__ import annotations

import argparse
import math
import sys

from tokview.commands.store_arg import creatable_store
from tokview.errors import UserError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tokview.commands.store_arg import store_path
    from tokview.core.resolve import add_tokenizer_arguments
    from tokview.default_store import DEFAULT_DB
    from tokview.proxy.serve import DEFAULT_LISTEN, PROXY_KEY_ENV
    from tokview.proxy.sessions import SESSION_HEADER

    p = sub.add_parser(
        "proxy",
        help="an OpenAI-compatible proxy that records every generation token-exact",
        description="Point a harness's OpenAI base URL at http://HOST:PORT/v1. Chat and completions requests are "
        "forwarded with the token-id fields added and answered exactly as the server would have answered "
        "without them; every other path passes through. Each generation becomes a sample in --db, grouped into "
        f"sessions by the {SESSION_HEADER} header, else the request's `user`, else by prompt-id prefix. "
        "Upstream credentials: user:password in the URL or TOKVIEW_API_KEY (a client's own Authorization "
        "header is forwarded instead, never stored).",
    )
    p.add_argument(
        "--server", required=True, action="append", metavar="URL", help="upstream vLLM or SGLang (repeat for several)"
    )
    p.add_argument(
        "--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT", help=f"where to listen (default {DEFAULT_LISTEN})"
    )
    p.add_argument(
        "--db",
        default=DEFAULT_DB,
        metavar="PATH",
        type=store_path,
        help=f"the store to record into (default {DEFAULT_DB})",
    )
    p.add_argument(
        "--kind", choices=("auto", "vllm", "sglang"), default="auto", help="upstream kind (default: detected)"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds per start-up probe of each server (default 30); forwarded requests keep the harness's own",
    )
    p.add_argument(
        "--allow-remote",
        action="store_true",
        help=f"listen on a non-loopback address; clients must then present the key in {PROXY_KEY_ENV}",
    )
    add_tokenizer_arguments(
        p, tokenizer_default="tokview's Kimi-layout tokenizer", profile_default="detected from the tokenizer"
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.db is not None:
        creatable_store(args.db)
    from tokview.core.resolve import load_tokenizer_and_profile
    from tokview.proxy.serve import ProxyConfig, check_listen, key_from_env, serve_forever

    if not math.isfinite(args.timeout) or args.timeout <= 0:
        raise UserError("--timeout must be a finite number of seconds above 0")
    config = ProxyConfig(
        servers=list(args.server),
        listen=args.listen,
        db=args.db,
        allow_remote=args.allow_remote,
        key=key_from_env(),
        kind=args.kind,
        timeout=args.timeout,
        say=lambda line: print(line, file=sys.stderr, flush=True),
    )
    check_listen(config)  # refused before the tokenizer loads
    config.tokenizer, config.profile = load_tokenizer_and_profile(
        args.tokenizer, args.profile, trust_remote_code=args.trust_remote_code
    )
    return serve_forever(config)
