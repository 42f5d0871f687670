"""`tokview export`: write stored samples in a trainer's format, with a manifest and token counts.

`--select valid` (default): no error finding and not rejected; `approved`: a person approved it;
`all`: everything stored. A sample whose loss mask has no 1 is refused and counted in the manifest.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tokview.cli import UserError


def add_parser(sub: argparse._SubParsersAction) -> None:
    from tokview.export import FORMATS, SELECTIONS

    p = sub.add_parser("export", help="write samples as speculators / SpecForge / ShareGPT / Kimi inline / Parquet",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", default="tokview.duckdb", help="DuckDB store (default: ./tokview.duckdb)")
    p.add_argument("--format", default="speculators", choices=FORMATS, help="default: speculators (token-exact)")
    p.add_argument("--out", required=True, type=Path, help="output file (.jsonl, or .parquet for parquet)")
    p.add_argument("--select", default="valid", choices=tuple(SELECTIONS))
    p.add_argument("--run", dest="run_name", help="only this run")
    p.add_argument("--tokenizer", type=Path, help="tokenizer directory (default: the run's, else Kimi-layout)")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--profile", help="fallback profile for samples stored without a known one")
    p.set_defaults(run=run)


def resolve_tokenizer(store, run_name: str | None, tokenizer_dir: Path | None, trust_remote_code: bool):
    """The tokenizer the samples were made with: the flag, else the run's recorded dir, else Kimi-layout."""
    from tokview.core.kimi_layout import kimi_tokenizer_dir
    from tokview.core.tokenizer import load_tokenizer

    if tokenizer_dir is None:
        dirs = {r["tokenizer_dir"] for r in store.runs() if r["tokenizer_dir"] and
                (run_name is None or r["run_id"] == run_name)}
        dirs = {d for d in dirs if Path(d).is_dir()}
        if len(dirs) > 1:
            raise UserError(f"the runs used {len(dirs)} tokenizers ({', '.join(sorted(dirs))}): pass --tokenizer "
                            "or --run")
        tokenizer_dir = Path(dirs.pop()) if dirs else kimi_tokenizer_dir()
    return load_tokenizer(tokenizer_dir, trust_remote_code=trust_remote_code)


def run(args: argparse.Namespace) -> int:
    from tokview.core.profiles import get_profile
    from tokview.export import export
    from tokview.store import Store

    if not Path(args.db).is_file():
        raise UserError(f"database not found: {args.db}")
    with Store(args.db) as store:
        tokenizer = resolve_tokenizer(store, args.run_name, args.tokenizer, args.trust_remote_code)
        profile = get_profile(args.profile) if args.profile else None
        result = export(store, args.format, args.out, select=args.select, run=args.run_name, tokenizer=tokenizer,
                        profile=profile)
    refused = ", ".join(f"{n} {why}" for why, n in result.refused.items()) or "none"
    print(f"exported {result.exported} of {result.selected} selected samples to {result.out} "
          f"(refused: {refused}); manifest {result.manifest_path.name}, token counts "
          f"{result.token_freq_path.name}", file=sys.stderr)
    return 0
