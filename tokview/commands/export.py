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
    p.add_argument("--trust-remote-code", action="store_true",
                   help="run the code of the folder given with --tokenizer (never of a folder the database names)")
    p.add_argument("--profile", help="fallback profile for samples stored without a known one "
                                     "(default: the runs' recorded profile, else detected)")
    p.set_defaults(run=run)


def resolve_tokenizer(store, run_name: str | None, tokenizer_dir: Path | None, trust_remote_code: bool,
                      profile: str | None = None):
    """The tokenizer and fallback profile the samples were made with: the flags, else what the runs recorded.

    Goes through `core.resolve.resolve_for_stored`, so `--trust-remote-code` only ever applies to a
    folder named with `--tokenizer` on this command line, never to one a database points at.
    """
    from tokview.core.resolve import resolve_for_stored

    runs = [r for r in store.runs() if run_name is None or r["run_id"] == run_name]
    dirs = sorted({r["tokenizer_dir"] for r in runs if r["tokenizer_dir"]})
    if tokenizer_dir is None and len(dirs) > 1:
        raise UserError(f"the runs used {len(dirs)} tokenizers ({', '.join(dirs)}): pass --tokenizer or --run")
    profiles = sorted({r["profile"] for r in runs if r["profile"]})
    hashes = {r["tokenizer_hash"] for r in runs if dirs and r["tokenizer_dir"] == dirs[0]}
    return resolve_for_stored(tokenizer_dir, profile, recorded_tokenizer_dir=dirs[0] if dirs else None,
                              recorded_profile=profiles[0] if len(profiles) == 1 else None,
                              trust_remote_code=trust_remote_code,
                              recorded_tokenizer_hash=hashes.pop() if len(hashes) == 1 else None)


def run(args: argparse.Namespace) -> int:
    from tokview.export import export
    from tokview.store import Store

    if not Path(args.db).is_file():
        raise UserError(f"database not found: {args.db} (pass --db PATH)")
    with Store(args.db) as store:
        tokenizer, profile = resolve_tokenizer(store, args.run_name, args.tokenizer, args.trust_remote_code,
                                               args.profile)
        result = export(store, args.format, args.out, select=args.select, run=args.run_name, tokenizer=tokenizer,
                        profile=profile)
    refused = ", ".join(f"{n} {why}" for why, n in result.refused.items()) or "none"
    print(f"exported {result.exported} of {result.selected} selected samples to {result.out} "
          f"(refused: {refused}); manifest {result.manifest_path.name}, token counts "
          f"{result.token_freq_path.name}", file=sys.stderr)
    return 0
