"""`tokview review`: approve, reject, tag, untag or note every sample a filter selects, in one step.

The filters are the app's: `--run`, `--finding`, `--status`, `--with-tag` and `--search` (what `/` finds:
ids, prompt and answer text, tags, notes; `acc<=2.5` and `nll<=1.5` terms too). Each sample gets the row
a key press in the app writes, recorded under the reviewer (`--reviewer`, else the config's [ui]
reviewer, else $USER). Samples already in the asked state are left alone and counted. Approving samples
with an error finding needs `--override` (the app asks once for the group; here the flag is the answer).
Prints what it changed (`--json`: the same as JSON, with the sample ids); `--dry-run` writes nothing.

Each run is one action, as a key press in the app is: `--history` lists the latest actions (the app's and
these), `--undo last` takes back the latest one wherever it was made, `--undo ID` an earlier one, each as
one step (the app's `u` does the same). An untag takes the tag off notes and verdicts alike.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from tokview.commands.once import GivenOnce
from tokview.commands.store_arg import add_db_argument, existing_store, run_name
from tokview.errors import UserError
from tokview.untrusted_text import printable_line

if TYPE_CHECKING:
    from tokview.store import Store
    from tokview.store.bulk_review import Outcome
    from tokview.store.sample_rows import SampleFilter

STATUSES = ("pending", "approved", "rejected", "valid", "invalid")


_FILTERS = {
    "--run": "run_name",
    "--finding": "finding",
    "--status": "status",
    "--with-tag": "with_tag",
    "--search": "search",
    "--override": "override",
}
"""What `--history` and `--undo` do not take (flag → its argparse dest)."""


class _Once(GivenOnce):
    """`--tag a --tag b` tagged b alone, where `export --tag a --tag b` asks for both: a review's flags are refused."""

    why = "one value per review (its action is one step)"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("review", help="approve, reject, tag, untag or note many samples at once", description=__doc__)
    add_db_argument(p)
    p.add_argument("--run", type=run_name, metavar="RUN", dest="run_name", action=_Once, help="only this run's samples")
    p.add_argument("--finding", metavar="CODE", action=_Once, help="only samples with this finding code")
    p.add_argument(
        "--status", choices=STATUSES, action=_Once, help="only samples with this verdict, or only valid/invalid ones"
    )
    p.add_argument(
        "--with-tag",
        metavar="TAG",
        action="append",
        help="only samples carrying this tag (any case; repeat: every one)",
    )
    p.add_argument("--search", metavar="TEXT", action=_Once, help="only samples the app's / finds for TEXT")
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--approve", action="store_true", help="approve them")
    action.add_argument("--reject", metavar="REASON", action=_Once, help="reject them with this reason")
    action.add_argument("--tag", metavar="TAG", action="append", help="tag them (repeat to add several)")
    action.add_argument("--untag", metavar="TAG", action=_Once, help="take this tag off them (any case)")
    action.add_argument("--note", metavar="TEXT", action=_Once, help="attach this note to them")
    action.add_argument(
        "--undo",
        metavar="ID",
        action=_Once,
        help="take back action ID (see --history), or 'last': the latest not undone",
    )
    action.add_argument("--history", action="store_true", help="list the latest actions (the app's too), newest first")
    p.add_argument("--override", action="store_true", help="with --approve: approve samples with error findings too")
    p.add_argument("--reviewer", metavar="NAME", help="who the rows are recorded as (default: config, else $USER)")
    p.add_argument("--dry-run", action="store_true", help="say what would change, write nothing")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")
    p.set_defaults(run=run)


def _text(value: str | None, flag: str) -> str | None:
    if value is not None and not value.strip():
        raise UserError(f"{flag} must not be empty")
    _utf8(value, flag)
    return value.strip() if value is not None else None


def _utf8(value: str | None, flag: str) -> None:
    """Bytes the terminal passed that are not UTF-8 reach Python as lone surrogates, which the store cannot hold
    (DuckDB said "cannot read STORE: … Python Conversion Failure")."""
    if value is None:
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(f"{flag} holds bytes that are not UTF-8 text") from None


def _filters(args: argparse.Namespace, store: Store) -> tuple[SampleFilter, list[str]]:
    from tokview.core.findings import FINDING_CODES
    from tokview.store.sample_rows import SampleFilter
    from tokview.ui.search_terms import parse_search, unread_threshold

    if args.finding is not None and args.finding not in FINDING_CODES:
        raise UserError(f"unknown finding code {args.finding!r} (tokview stats lists the codes a store has)")
    if args.run_name is not None and not store.query("SELECT 1 FROM samples WHERE run_id = ? LIMIT 1", [args.run_name]):
        raise UserError(f"no sample of a run {args.run_name!r} in {args.db} (tokview stats --samples shows them)")
    # an empty --search read as no search: `review --search "" --reject bad` rejected the whole store
    search = _text(args.search, "--search")
    unread = unread_threshold(search) if search else None
    if unread is not None:  # searched for as text, it matched nothing, exit 0
        raise UserError(
            f"--search {unread!r}: the thresholds read are upper bounds, `nll<=N` and `acc<=N`; for samples above "
            "a target NLL, --finding off_policy (above score's --off-policy-nll)"
        )
    text, max_acceptance, max_nll = parse_search(search) if search else (None, None, None)
    status = args.status if args.status in ("pending", "approved", "rejected") else None
    valid = {"valid": True, "invalid": False}.get(args.status or "")
    filters = SampleFilter(
        status=status,
        code=args.finding,
        run_id=args.run_name,
        text=text,
        valid=valid,
        max_acceptance=max_acceptance,
        max_nll=max_nll,
    )
    return filters, [str(_text(t, "--with-tag")) for t in args.with_tag or ()]


def _reviewer(given: str | None) -> str | None:
    from tokview.commands.ui import reviewer_name

    if given is not None:
        return reviewer_name(given, None)
    from tokview.ui.config import load_config

    return reviewer_name(None, load_config().reviewer)  # ConfigError: one line


def describe(outcome: Outcome, dry_run: bool) -> str:
    """One line: what changed out of what was selected, and why the rest did not."""
    return outcome.summary("selected", dry_run)


def apply(store: Store, args: argparse.Namespace, ids: list[str], who: str | None) -> Outcome:
    """Run the asked action on `ids` (with --dry-run: work out what it would change, write nothing)."""
    from tokview.store import bulk_review as bulk

    write = not args.dry_run
    if args.approve:
        invalid = bulk.invalid_among(store, ids, not_yet="approved")  # those approved already change nothing
        if invalid and not args.override:
            raise UserError(
                f"{len(invalid)} of the {len(ids)} selected samples have error findings (e.g. {invalid[0]}): "
                "add --override to approve them anyway (recorded as overrides), or --status valid to leave them out"
            )
        return bulk.set_status(store, ids, "approved", who=who, override_invalid=True, write=write, source=SOURCE)
    if args.reject is not None:
        reason = _text(args.reject, "--reject")
        return bulk.set_status(store, ids, "rejected", who=who, reason=reason, write=write, source=SOURCE)
    if args.tag is not None:
        kept: dict[str, str] = {}  # `--tag X --tag x` is one tag (compared without case), spelled as given first
        for given in args.tag:
            tag = str(_text(given, "--tag"))
            kept.setdefault(tag.casefold(), tag)
        tags = tuple(kept.values())
        return bulk.add_notes(store, ids, who=who, tags=tags, write=write, source=SOURCE)
    if args.untag is not None:
        return bulk.remove_tag(store, ids, _text(args.untag, "--untag") or "", who=who, write=write, source=SOURCE)
    return bulk.add_notes(store, ids, who=who, note=_text(args.note, "--note") or "", write=write, source=SOURCE)


def _refuse_overturning(store: Store, args: argparse.Namespace, ids: list[str]) -> None:
    """A verdict that would overturn the opposite one needs a `--status` to say what it selects: a bare
    `review --approve` approved the whole store, every rejection of the team's included (undoable, but said only as a
    count). Any `--status` is that word (`valid` takes every verdict, as it says)."""
    if not (args.approve or args.reject is not None) or args.status is not None:
        return
    from tokview.store import bulk_review as bulk

    verb, other, whole = ("approving", "rejected", "valid") if args.approve else ("rejecting", "approved", "invalid")
    overturned = bulk.overturned_among(store, ids, "approved" if args.approve else "rejected")
    if overturned:
        are = "is" if len(overturned) == 1 else "are"
        raise UserError(
            f"{len(overturned)} of the {len(ids)} selected samples {are} {other} (e.g. {overturned[0]}): {verb} "
            f"them overturns that verdict; add --status {other} to overturn those alone, --status pending to leave "
            f"them, or --status {whole} to take every {whole} sample whatever its verdict"
        )


SOURCE = "review"
"""What `actions.source` records for a change made here (the app records `app`)."""


def _undo(store: Store, args: argparse.Namespace, who: str | None) -> int:
    target = args.undo.strip().lstrip("#")
    if target != "last" and not target.isdecimal():
        raise UserError(f"--undo takes an action id from --history or 'last', not {args.undo!r}")
    if args.dry_run:
        raise UserError("--undo writes at once: leave out --dry-run (--history shows what it would take back)")
    undone = store.undo_action(None if target == "last" else int(target), who=who, source=SOURCE)
    if undone is None:
        raise UserError(f"nothing left to undo in {args.db}")
    print(json.dumps({**undone.to_dict(), "by": who}) if args.json else printable_line(undone.line))
    return 0


def _history(store: Store, args: argparse.Namespace) -> int:
    listed = store.actions(50)
    if args.json:
        print(json.dumps([{**vars(a), "at": str(a.at)} for a in listed]))
    for a in [] if args.json else listed:  # reasons, tags and names are anyone's text: escapes shown, not run
        print(printable_line(a.line))
    return 0


def run(args: argparse.Namespace) -> int:
    from tokview.store import Store

    existing_store(args.db)
    who = _reviewer(args.reviewer)
    if args.override and not args.approve:  # accepted and ignored beside --reject, --tag: the help says --approve
        raise UserError("--override goes with --approve only (approving samples with error findings)")
    if args.history or args.undo is not None:  # an action is undone whole; `--undo last --run r1` undid every run's
        given = [flag for flag, value in _FILTERS.items() if getattr(args, value) not in (None, False, [])]
        given += ["--dry-run"] if args.history and args.dry_run else []  # a listing writes nothing to try first
        if given:
            what = "--history" if args.history else "--undo"
            raise UserError(f"{what} takes no {', '.join(given)}: an action is listed and undone whole")
    with Store(args.db) as store:
        if args.history:
            return _history(store, args)
        if store.read_only and not (args.dry_run and args.undo is None):  # a dry run writes nothing
            raise UserError(f"{args.db} cannot be written (read-only): nothing reviewed")
        if args.undo is not None:
            return _undo(store, args, who)
        filters, with_tags = _filters(args, store)
        from tokview.store import bulk_review as bulk

        ids = bulk.select(store, filters, with_tags)
        _refuse_overturning(store, args, ids)
        outcome = apply(store, args, ids, who)
    try:
        if args.json:
            print(json.dumps({**outcome.to_dict(), "dry_run": args.dry_run, "who": who}))
        else:
            print(printable_line(describe(outcome, args.dry_run)))
        sys.stdout.flush()
    except BrokenPipeError:
        raise  # `review … | head`: quiet, as every command's closed pipe
    except OSError as exc:  # a full disk, a closed stdout: the review is recorded all the same, and said so
        action = getattr(outcome, "action_id", None)
        if args.dry_run or action is None:
            raise
        raise UserError(
            f"the review was recorded as action #{action}, but its report could not be written ({exc.strerror or exc})"
            f": `tokview review --db {args.db} --undo {action}` takes it back"
        ) from None
    if not ids:
        print("tokview: note: no sample matches these filters", file=sys.stderr)
    return 0
