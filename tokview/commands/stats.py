"""`tokview stats`: what is in a store: prompts, samples by status and validity, failures by reason,
findings by code, token-length percentiles. `--json` prints the same numbers as JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tokview.cli import UserError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stats", help="counts, failures, findings and token lengths in a store",
                       description=__doc__)
    p.add_argument("--db", default="tokview.duckdb", help="DuckDB store (default: ./tokview.duckdb)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run)


def render(st: dict[str, Any]) -> str:
    s = st["by_status"]
    lines = [
        f"prompts   {st['prompts']}",
        f"samples   {st['samples']}  (pending {s.get('pending', 0)}, approved {s.get('approved', 0)}, "
        f"rejected {s.get('rejected', 0)})",
        f"valid     {st['valid']}  invalid {st['invalid']}  truncated {st['truncated']}  "
        f"exportable (--select valid) {st['exportable_valid']}",
        f"failures  {st['failures']['total']}",
    ]
    lines += [f"  {n:>6}  {reason}" for reason, n in st["failures"]["by_reason"].items()]
    lines.append("findings (samples per code)")
    lines += [f"  {v['samples']:>6}  {code} [{v['severity']}]" for code, v in st["findings"].items()]
    for key in ("prompt_len", "output_len"):
        p = st[key]
        lines.append(f"{key:<11}p50 {p['p50']}  p90 {p['p90']}  p99 {p['p99']}  max {p['max']}  mean {p['mean']}")
    lines.append(f"runs      {st['runs']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from tokview.store import Store

    if not Path(args.db).is_file():
        raise UserError(f"database not found: {args.db}")
    with Store(args.db) as store:
        st = store.stats()
    print(json.dumps(st, indent=2, default=str) if args.json else render(st))
    return 0
