"""`tokview stats`: what is in a store: prompts, samples by status and validity, failures by reason,
findings by code, token-length percentiles. `--samples` also lists sample ids (what `tokview show`
takes), oldest first, `--limit` of them. `--by run` prints the same numbers per run instead (samples by status,
validity, truncation, failures, lengths, acceptance, target NLL, findings), to compare regeneration runs.
`--json` prints the same as JSON."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from tokview.commands.store_arg import add_db_argument, existing_store
from tokview.core.json_value import strict_json
from tokview.errors import UserError
from tokview.untrusted_text import printable, printable_line
from tokview.wording import plural

if TYPE_CHECKING:
    from tokview.core.json_value import JsonObject
    from tokview.store.sample_rows import SampleRow


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("stats", help="counts, failures, findings and token lengths in a store", description=__doc__)
    add_db_argument(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--samples",
        action="store_true",
        help="also list sample ids: sample_id, status, valid, finish reason, finding codes",
    )
    p.add_argument(
        "--limit",
        type=int,
        default=None,
        metavar="N",
        help=f"with --samples: list at most N (default {DEFAULT_LIMIT})",
    )
    p.add_argument(
        "--by",
        choices=["run"],
        help="per run: samples by status, findings, lengths, acceptance, target NLL (to compare runs)",
    )
    p.set_defaults(run=run)


DEFAULT_LIMIT = 50


def sample_line(row: SampleRow) -> str:
    """One listed sample: its id first, so `cut -f1` gives ids for `tokview show`."""
    return "\t".join(
        [
            printable_line(row.sample_id),  # one line, one tab-separated record, whatever the id holds
            row.status,
            "valid" if row.valid else "invalid",
            row.finish_reason or "none",
            ",".join(row.codes) or "-",
        ]
    )


def sample_dict(row: SampleRow) -> JsonObject:
    return {
        "sample_id": row.sample_id,
        "status": row.status,
        "valid": row.valid,
        "finish_reason": row.finish_reason,
        "codes": list(row.codes),
    }


def drift_samples(st: dict[str, Any]) -> int:
    """Samples whose output ids a text-based pipeline would corrupt (encode(decode(ids)) != ids)."""
    samples: int = st["findings"].get("retokenize_drift", {}).get("samples", 0)  # a COUNT(DISTINCT …)
    return samples


def render(st: dict[str, Any]) -> str:
    s = st["by_status"]
    lines = [
        f"prompts   {st['prompts']}"
        + (f"  (+{st['prompts_failed_only']} with failures only)" if st.get("prompts_failed_only") else ""),
        f"samples   {st['samples']}  (pending {s.get('pending', 0)}, approved {s.get('approved', 0)}, "
        f"rejected {s.get('rejected', 0)})",
        f"valid     {st['valid']}  invalid {st['invalid']}  truncated {st['truncated']}  "
        f"exportable (--select valid) {st['exportable_valid']}",
        f"failures  {st['failures']['total']}",
    ]
    from tokview.batch.config import group_reasons, reason_examples

    examples = reason_examples(st["failures"]["by_reason"])
    for cls, n in group_reasons(st["failures"]["by_reason"]).items():
        example = examples[cls]
        shown = printable_line(example[:160])  # one line each, whatever the server put in its message
        lines.append(f"  {n:>6}  {printable_line(cls)}" + (f"  (e.g. {shown})" if example != cls else ""))
    lines.append(
        f"retokenize drift {drift_samples(st)} samples (encode(decode(ids)) != ids: a pipeline "
        "that keeps text instead of ids would train on other tokens)"
    )
    lines.append("findings (samples per code)")
    lines += [f"  {v['samples']:>6}  {code} [{v['severity']}]" for code, v in st["findings"].items()]
    for key in ("prompt_len", "output_len"):
        p = st[key]
        lines.append(f"{key:<11}" + "  ".join(f"{k} {_or_na(p[k])}" for k in ("p50", "p90", "p99", "max", "mean")))
    lines.append(f"runs      {st['runs']}")
    return "\n".join(lines)


def _number(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _or_na(value: object) -> object:
    """A length statistic as printed: `n/a` for a run with no samples (it printed `None`)."""
    return "n/a" if value is None else value


def render_runs(runs: list[dict[str, Any]]) -> str:
    """Three lines per run: counts; lengths, acceptance and NLL; findings (samples per code)."""
    lines = []
    names = [printable_line(str(r["run"])) for r in runs]  # a run name with a newline kept its run on one line
    width = max(map(len, names), default=0) + 2
    pad = " " * width
    for r, name in zip(runs, names):
        s, out, acc, nll = r["by_status"], r["output_len"], r["acceptance"], r["target_nll"]
        lines.append(
            f"{name:<{width}}{plural(r['samples'], 'sample')} (pending {s['pending']}, approved "
            f"{s['approved']}, rejected {s['rejected']}) · valid {r['valid']} invalid {r['invalid']} · "
            f"truncated {r['truncated']} · {plural(r['failures'], 'failure')}"
        )
        lines.append(
            f"{pad}output p50 {_or_na(out['p50'])} p90 {_or_na(out['p90'])} max {_or_na(out['max'])} mean "
            f"{_or_na(out['mean'])} · prompt p50 {_or_na(r['prompt_len']['p50'])} · acceptance length {_number(acc['mean_acceptance_length'])} "
            f"({acc['samples']} with metrics) · target NLL {_number(nll['mean'], 3)} (mean over {plural(nll['samples'], 'scored sample')})"
        )
        found = ", ".join(f"{code} {n}" for code, n in r["findings"].items()) or "none"
        lines.append(f"{pad}findings (samples per code): {found}")
    return "\n".join(lines) if lines else "no samples and no failures in this store"


def run_by_run(args: argparse.Namespace) -> int:
    from tokview.store import Store
    from tokview.store.run_stats import run_stats

    with Store(args.db) as store:
        runs = run_stats(store)
    if args.json:
        print(strict_json({"runs": runs}, indent=2, default=str))
    else:
        print(printable(render_runs(runs)))  # run names and finding codes come from files and servers
    return 0


def run(args: argparse.Namespace) -> int:
    from tokview.store import Store
    from tokview.store.side_stats import render_side, store_side_stats

    existing_store(args.db)
    if args.limit is not None and not args.samples:  # else ignored without a word: no list to limit
        raise UserError("--limit counts the listed samples: give --samples too")
    limit = DEFAULT_LIMIT if args.limit is None else args.limit
    if limit < 1:
        raise UserError("--limit must be at least 1")
    if args.by == "run":
        if args.samples:
            raise UserError("--samples lists the whole store: leave out --by run, or --samples")
        return run_by_run(args)
    with Store(args.db) as store:
        st = {**store.stats(), **store_side_stats(store)}  # + spec_decode, logprobs, target_logprobs
        rows = store.samples_page(order_by="created_at", limit=limit) if args.samples else []
    # The samples a text-based pipeline would corrupt, said on its own line (issue 14), 0 when none.
    st["retokenize_drift"] = drift_samples(st)
    from tokview.batch.config import group_reasons

    st["failures"]["by_class"] = group_reasons(st["failures"]["by_reason"])
    if args.json:
        if args.samples:
            st = {**st, "sample_list": [sample_dict(r) for r in rows]}
        print(strict_json(st, indent=2, default=str))
        return 0
    # failure reasons quote servers and finish reasons come from them: escapes are shown, never run
    print(printable(render(st)))
    if side := render_side(st):
        print(printable(side))
    if args.samples:
        shown = f"{len(rows)} of {st['samples']}" if len(rows) < st["samples"] else f"all {len(rows)}"
        print(f"sample ids ({shown}; sample_id status valid finish codes)")
        for row in rows:
            print(printable(sample_line(row)))
    return 0
