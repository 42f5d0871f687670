"""`tokview audit DATASET`: load a dataset another pipeline produced into the store, run every finding
and print a report (counts by finding code). The rows can then be reviewed in the UI (run
`audit-<name>`). Reads speculators rows (input_ids + loss_mask) and SpecForge / ShareGPT / messages
conversations with or without reasoning_content / reasoning / thinking."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from tokview.commands.store_arg import add_db_argument, creatable_store
from tokview.errors import ExitCode, UserError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tokview.core.resolve import add_tokenizer_arguments

    p = sub.add_parser(
        "audit", help="check a dataset made by another pipeline (speculators, SpecForge, ShareGPT)", description=__doc__
    )
    p.add_argument("dataset", type=Path, help="JSONL or Parquet dataset")
    add_tokenizer_arguments(
        p, tokenizer_default="tokview's Kimi-layout tokenizer", profile_default="detected from the tokenizer"
    )
    add_db_argument(p)
    p.add_argument("--name", help="run name suffix (default: the dataset's file name)")
    p.add_argument(
        "--thinking",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="render conversation rows with thinking on (default) or off",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    creatable_store(args.db)
    from tokview.core.resolve import load_tokenizer_and_profile
    from tokview.export.audit import audit
    from tokview.store import Store

    if args.dataset.is_dir():
        raise UserError(f"dataset is a directory: {args.dataset}")
    from tokview.export.audit import readable_dataset

    if not readable_dataset(args.dataset):
        raise UserError(f"dataset not found: {args.dataset}")
    tokenizer, profile = load_tokenizer_and_profile(
        args.tokenizer, args.profile, trust_remote_code=args.trust_remote_code
    )
    with Store(args.db) as store:
        report = audit(
            store, args.dataset, tokenizer=tokenizer, profile=profile, name=args.name, thinking=args.thinking
        )
    if args.json:
        print(json.dumps({**asdict(report), "by_code": dict(report.by_code.most_common())}))
    else:
        print(report.render())
    if not report.imported:
        _say_bad_rows(args.dataset, report.bad_rows)  # why each row was refused, before the one-line verdict
        raise UserError(f"no row of {args.dataset} could be read as a sample")
    return _say_bad_rows(args.dataset, report.bad_rows)


def _say_bad_rows(dataset: Path, bad_rows: list[str]) -> int:
    """Each skipped row as `FILE:LINE: why` on stderr, as `tokview batch` says them, and the exit code:
    4 when any was skipped (the audit is not of the whole file; a script must not take it for clean)."""
    from tokview.batch.inputs import say_bad_rows

    say_bad_rows(dataset, bad_rows)
    return ExitCode.BAD_ROWS if bad_rows else ExitCode.OK
