"""`tokview merge A.duckdb B.duckdb … --into STORE`: land stores made elsewhere (Slurm array shards,
other machines) into one. Idempotent: merging a store twice adds nothing. A store of another model,
tokenizer or profile is refused with a one-line reason and nothing of it is added."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tokview.commands.store_arg import store_path
from tokview.errors import UserError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "merge", help="land stores made elsewhere (e.g. --shard K/N runs) into one store", description=__doc__
    )
    p.add_argument("sources", nargs="+", type=Path, metavar="A.duckdb", help="stores to merge")
    p.add_argument(
        "--into", required=True, metavar="STORE", type=store_path, help="the store to merge into (created if missing)"
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tokview.store import Store

    for src in args.sources:
        if src.is_dir():
            raise UserError(f"{src} is a directory, not a store: name its .duckdb file")
        if not src.is_file():
            raise UserError(f"database not found: {src}")
    with Store(args.into) as store:  # MergeRefused, StoreError: one line
        for src in args.sources:
            added = store.merge(src)
            print(
                f"merged {src}: +{added['samples']} samples, +{added['runs']} runs, +{added['failures']} failures",
                file=sys.stderr,
            )
    return 0
