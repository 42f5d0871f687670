"""`tokview export`: write stored samples in a trainer's format, with a manifest and token counts.

`--select valid` (default): no error finding and not rejected; `approved`: a person approved it and it
is valid (`--include-invalid` exports approved samples with error findings too); `all`: everything
stored. A sample whose loss mask has no 1 is refused and counted in the manifest.

`--tag T` keeps only samples tagged T (repeat it: tagged with every one), `--without-tag T` leaves out samples
tagged T (repeat it: with any one); tags are compared without case, and the manifest counts the exported samples
by tag (Parquet has a `tags` column when any has one).

`--trajectory` (`--format trajectory`) writes one row per conversation (a `tokview proxy` session, a `tokview
batch` chain): the served ids of every turn in order, each served output with mask 1; a conversation is split
where a turn's prompt does not extend the previous turn's prompt + output ids (the manifest's `trajectory` says
where and why). Text formats carry the request's `tools` (as JSON text), the assistant's `tool_calls` and the
tool results; kimi-inline refuses rows with tools.

`--out -` streams the data to stdout (no sidecars); a FIFO is streamed to, a symlink written through.
Each text format is re-rendered through the run's chat template the way the trainers do, and the
rows whose ids or loss mask would differ are counted (printed, and in the manifest's `rerender`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokview.commands.once import GivenOnce
from tokview.commands.store_arg import add_db_argument, existing_store, run_name
from tokview.commands.vocabulary_check import refuse_another_vocabulary
from tokview.errors import UserError
from tokview.export import row_shapes

if TYPE_CHECKING:
    from tokview.core.profiles import ModelProfile
    from tokview.core.tokenizer import TokenizerAdapter
    from tokview.export.writer import ExportResult
    from tokview.store import Store


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tokview.core.resolve import add_tokenizer_arguments
    from tokview.export import FORMATS, SELECTIONS
    from tokview.export.registry import DEFAULT_FORMAT

    p = sub.add_parser(
        "export",
        help="write samples as " + " / ".join(f.label for f in FORMATS.values()),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_db_argument(p)
    p.add_argument(
        "--format",
        default=None,
        choices=tuple(FORMATS),
        action=GivenOnce,
        help=f"default: {DEFAULT_FORMAT} (token-exact)",
    )
    p.add_argument(
        "--trajectory",
        action="store_true",
        help="one row per conversation (a proxy session, a batch chain): the whole conversation as served, "
        "every served output supervised; split where a turn's prompt does not extend the previous turn "
        "(same as --format trajectory)",
    )
    p.add_argument(
        "--out", required=True, action=GivenOnce, help="output file (.jsonl, or .parquet for parquet); - for stdout"
    )
    p.add_argument("--select", default="valid", choices=tuple(SELECTIONS), action=GivenOnce)
    p.add_argument(
        "--include-invalid",
        action="store_true",
        help="with --select approved: also export approved samples that have error findings",
    )
    p.add_argument("--run", type=run_name, dest="run_name", action=GivenOnce, help="only this run")
    p.add_argument(
        "--tag",
        dest="tags",
        action="append",
        default=[],
        metavar="T",
        help="only samples tagged T (repeatable: every one; tags compared without case)",
    )
    p.add_argument(
        "--without-tag",
        dest="without_tags",
        action="append",
        default=[],
        metavar="T",
        help="leave out samples tagged T (repeatable: any one)",
    )
    p.add_argument(
        "--max-acceptance",
        type=float,
        action=GivenOnce,
        metavar="L",
        help="keep samples whose mean acceptance length is at most L (the hard ones for the drafter)",
    )
    p.add_argument(
        "--max-nll",
        type=float,
        action=GivenOnce,
        metavar="X",
        help="keep samples whose target mean NLL (tokview score) is at most X (drops off-policy ones)",
    )
    add_tokenizer_arguments(p)  # a folder the database names never runs its own code
    p.set_defaults(run=run)


def resolve_tokenizer(
    store: Store, run_name: str | None, tokenizer_dir: Path | None, trust_remote_code: bool, profile: str | None = None
) -> tuple[TokenizerAdapter, ModelProfile]:
    """The tokenizer and fallback profile the samples were made with: the flags, else what the runs recorded.

    Goes through `core.resolve.resolve_for_stored`, so `--trust-remote-code` only ever applies to a
    folder named with `--tokenizer` on this command line, never to one a database points at.
    """
    from tokview.core.resolve import recorded_vocabulary, resolve_for_stored

    runs = [r for r in ([store.run(run_name)] if run_name else store.runs()) if r]
    dirs = sorted({r["tokenizer_dir"] for r in runs if r["tokenizer_dir"]})
    _refuse_mixed_vocabularies([r for r in runs if r["samples"]])
    if tokenizer_dir is None and len(dirs) > 1:
        raise UserError(f"the runs used {len(dirs)} tokenizers ({', '.join(dirs)}): pass --tokenizer or --run")
    profiles = sorted({r["profile"] for r in runs if r["profile"]})
    hashes = {r["tokenizer_hash"] for r in runs if dirs and r["tokenizer_dir"] == dirs[0]}
    vocabularies = {recorded_vocabulary(r) for r in runs if dirs and r["tokenizer_dir"] == dirs[0]}
    defs = {json.dumps(r.get("profile_def"), sort_keys=True) for r in runs if r["profile"] in profiles[:1]}
    resolved = resolve_for_stored(
        tokenizer_dir,
        profile,
        recorded_tokenizer_dir=dirs[0] if dirs else None,
        recorded_profile=profiles[0] if len(profiles) == 1 else None,
        trust_remote_code=trust_remote_code,
        recorded_tokenizer_hash=hashes.pop() if len(hashes) == 1 else None,
        recorded_profile_def=json.loads(defs.pop()) if len(profiles) == 1 and len(defs) == 1 else None,
        recorded_vocabulary=vocabularies.pop() if len(vocabularies) == 1 else None,
    )
    if tokenizer_dir is not None:
        refuse_another_vocabulary(resolved[0], tokenizer_dir, [r for r in runs if r["samples"]])
    return resolved


def _refuse_mixed_vocabularies(runs: list[dict[str, Any]]) -> None:
    """Samples made with two different tokenizers cannot share one training file: their ids mean different
    tokens, and no `--tokenizer` makes both right (it only picks whose rules the other's ids are read by).
    Runs are told apart by the tokenizer's file hash (two copies of one folder are one tokenizer), by
    the folder when a run has no hash."""
    kinds: dict[str, list[str]] = {}
    by = "tokenizer_hash" if all(r["tokenizer_hash"] for r in runs) else "tokenizer_dir"
    for r in runs:
        key = r[by]
        if key:
            kinds.setdefault(key, []).append(r["run_id"])
    if len(kinds) > 1:
        names = ", ".join(sorted(run_id for ids in kinds.values() for run_id in ids))
        raise UserError(
            f"the runs used {len(kinds)} different tokenizers, and one training file holds one vocabulary: "
            f"export one run at a time with --run R (runs: {names})"
        )


def run(args: argparse.Namespace) -> int:
    from tokview.export import export
    from tokview.export.registry import DEFAULT_FORMAT, TRAJECTORY_FORMAT
    from tokview.store import Store

    for flag, value in (("--max-acceptance", args.max_acceptance), ("--max-nll", args.max_nll)):
        if value is not None and not math.isfinite(value):  # the manifest records it, and JSON has no infinity
            raise UserError(f"{flag} must be a finite number, not {value} (leave it out for no limit)")
    if args.include_invalid and args.select != "approved":
        other = "exports them already" if args.select == "all" else "leaves every invalid sample out"
        raise UserError(f"--include-invalid goes with --select approved (--select {args.select} {other})")
    if args.trajectory:  # `--format speculators` given as well was taken for the default and ignored
        if args.format not in (None, TRAJECTORY_FORMAT):
            raise UserError(
                f"--trajectory writes --format {TRAJECTORY_FORMAT}: it cannot be combined with --format {args.format}"
            )
        args.format = TRAJECTORY_FORMAT
    args.format = args.format or DEFAULT_FORMAT
    existing_store(args.db)
    with Store(args.db) as store:
        tokenizer, profile = resolve_tokenizer(
            store, args.run_name, args.tokenizer, args.trust_remote_code, args.profile
        )
        result = export(
            store,
            args.format,
            args.out,
            select=args.select,
            run=args.run_name,
            tokenizer=tokenizer,
            profile=profile,
            profile_override=args.profile is not None,
            include_invalid=args.include_invalid,
            max_acceptance=args.max_acceptance,
            max_nll=args.max_nll,
            tags=args.tags,
            without_tags=args.without_tags,
        )
    print(summary(result), file=sys.stderr)
    return 0


def summary(result: ExportResult) -> str:
    """What the user needs to know about the file just written, a line per topic."""
    from tokview.export.manifest import unfit_warning
    from tokview.export.writer import include_invalid_caveat, thresholds_text
    from tokview.untrusted_text import printable_line
    from tokview.wording import plural

    refused = ", ".join(f"{n} {why}" for why, n in result.refused.items()) or "none"
    written = (result.manifest_path, result.token_freq_path, result.template_path, result.errors_path)
    sidecars = [p.name for p in written if p]
    lines = [
        f"exported {result.exported} of {result.selected} selected samples to {result.out} (refused: {refused}); "
        + (f"sidecars {', '.join(sidecars)}" if sidecars else "no sidecars (streamed to a device)")
    ]
    if result.thresholds and result.thresholds.get("left_out"):
        lines.append(
            f"the thresholds left out {plural(result.thresholds['left_out'], 'sample')} of the selection"
            + thresholds_text(result.thresholds)
            + " (a sample can be under two reasons; the manifest's thresholds)"
        )
    if result.refused_examples:
        lines.append(
            "refused, first of each: "
            + "; ".join(
                f"{why}: {', '.join(map(printable_line, ids[:3]))}" for why, ids in result.refused_examples.items()
            )
            + " (up to 20 each in the manifest's refused_examples)"
        )
    unfit = result.seen.unfit if result.seen is not None else None
    if unfit and result.select == "all":  # --include-invalid asked for them: the manifest counts them
        lines.append(f"WARNING: {unfit_warning(unfit)}")
    if result.late_in_stream:
        lines.append(
            f"WARNING: {result.late_in_stream} rows past the first {row_shapes.LOADER_CHUNK_BYTES / 2**20:g} MiB of this "
            "stream bring "
            "keys or types no row before them has: datasets.load_dataset('json') (speculators, SpecForge) fails on "
            "the file it lands in; export to a file (--out PATH), which moves them first"
        )
    if result.left_out:
        reasons = ", ".join(f"{n} {code}" for code, n in result.left_out["by_reason"].items())
        lines.append(
            f"left out {result.left_out['invalid']} approved samples that are invalid ({reasons}); "
            f"--include-invalid exports them{include_invalid_caveat(result.left_out)}"
        )
    trajectory = result.table_section.get("trajectory")
    if trajectory:
        reasons = ", ".join(f"{n} {why}" for why, n in trajectory["breaks_by_reason"].items())
        where = "; where: the manifest's trajectory.first_breaks" if result.manifest_path is not None else ""
        late = trajectory.get("late_starts", 0)
        lines.append(
            f"trajectory: {trajectory['conversations']} conversations ({trajectory['turns']} turns) as "
            f"{trajectory['rows']} rows; {trajectory['split_conversations']} split at {trajectory['breaks']} breaks"
            + (f" ({reasons}{where})" if reasons else "")
            + (f"; {late} of them only start after turn 0 (their first turns not in the selection)" if late else "")
        )
    if result.by_tag:
        lines.append("by tag: " + ", ".join(f"{n} {printable_line(tag)}" for tag, n in result.by_tag.items()))
    lines.append(
        f"retokenize_drift: {result.retokenize_drift} of {result.exported} exported samples are exact only "
        "through pre-tokenized paths (speculators / Parquet input_ids + loss_mask)"
    )
    if result.lengths is not None:
        lines += [f"warning: {w}" for w in result.lengths.warnings()]
    if result.conformance is not None and result.conformance.paths():
        lines.append(f"re-rendered through the run's chat template as the trainers do: {result.conformance.line()}")
    return "\n".join(lines)
