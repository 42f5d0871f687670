"""`tokview merge A.duckdb B.duckdb … --into STORE`: land stores made elsewhere (Slurm array shards,
other machines) into one. Idempotent: merging a store twice adds nothing. A store of another model,
tokenizer or profile is refused with a one-line reason and nothing of it is added. Review done on a copy comes
back: a sample already here takes the copy's verdicts and notes when its history here is where the copy began;
where both stores reviewed it since, the review here stands and the merge says how many."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tokview.commands.once import GivenOnce
from tokview.commands.store_arg import creatable_store, store_path
from tokview.errors import TokviewError, UserError

if TYPE_CHECKING:
    from tokview.store import Store


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "merge", help="land stores made elsewhere (e.g. --shard K/N runs) into one store", description=__doc__
    )
    p.add_argument("sources", nargs="+", type=Path, metavar="A.duckdb", help="stores to merge")
    p.add_argument(
        "--into",
        required=True,
        metavar="STORE",
        type=store_path,
        action=GivenOnce,
        help="the store to merge into (created if missing)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    creatable_store(args.into, "--into")
    from tokview.store import SchemaError, Store, StoreError

    for src in args.sources:
        if src.is_dir():
            raise UserError(f"{src} is a directory, not a store: name its .duckdb file")
        if not src.is_file():
            raise UserError(f"database not found: {src}")
    into = Path(args.into).expanduser()
    for src in args.sources:  # before anything lands: found only when its turn came, the stores before it were merged
        if into.is_file() and os.path.samefile(src, into):  # by path, link or a hard link's inode
            raise UserError(f"{src} is the store itself (--into {args.into}): leave it out; nothing was merged")
    made = not os.path.lexists(into)  # a dangling symlink is not ours to remove either
    try:
        with Store(args.into) as store:  # MergeRefused, StoreError: one line
            if store.read_only:  # DuckDB's own refusal of the first INSERT read as the source's fault
                raise StoreError(f"{args.into} cannot be written (read-only): nothing merged; pass another --into")
            for k, src in enumerate(args.sources):
                try:
                    added = store.merge(src)
                except TokviewError as exc:
                    if made and k == 0:  # refused before anything landed: no empty store left behind
                        _remove_if_empty(store, into)
                    _say_the_others(exc, args.sources, k)
                    raise
                _say(added, src, args.into)
    except (StoreError, SchemaError) as exc:  # the store layer words the flag to change as every other command's: --db
        target = exc.message.startswith(f"{args.into} ")  # about the target, else about a source (which it names)
        flag = "pass another --into" if target else "leave that store out"
        exc.message = re.sub(r"\bpass another --db\b", flag, exc.message)
        exc.args = (exc.message,)
        raise
    return 0


def _say_the_others(exc: TokviewError, sources: list[Path], k: int) -> None:
    """Add to the refusal of source `k` what happened to the others: the stores before it stay merged, the ones after
    it were not tried (a merge of three that stopped at the second said nothing of the third)."""
    if len(sources) == 1:
        return
    before, after = [str(s) for s in sources[:k]], [str(s) for s in sources[k + 1 :]]
    said = [f"kept from the stores merged before: {', '.join(before)}"] if before else []
    said += [f"not tried: {', '.join(after)}"] if after else []
    if said:
        exc.message = f"{exc.message}; {'; '.join(said)}"
        exc.args = (exc.message,)


def _remove_if_empty(store: Store, path: Path) -> None:
    """The store this merge created, if it is still empty: checked and removed while this process holds it, so a
    batch that created the same file meanwhile (its samples, its runs) is never removed. A parts folder only if
    it is empty."""
    with store.hold():
        if store.query("SELECT (SELECT count(*) FROM runs) + (SELECT count(*) FROM samples)") != [(0,)]:
            return
        for leftover in (path, Path(f"{path}.wal")):
            leftover.unlink(missing_ok=True)
    try:
        Path(f"{path}.parts").rmdir()
    except OSError:
        pass


def _say(added: dict[str, int], src: Path, into: str) -> None:
    print(
        f"merged {src}: +{added['samples']} samples, +{added['runs']} runs, +{added['failures']} failures",
        file=sys.stderr,
    )
    if added.get("verdicts_taken"):
        print(f"merged the review of {added['verdicts_taken']} samples already in {into} from {src}", file=sys.stderr)
    if added.get("scores_taken"):
        print(
            f"merged the target scores of {added['scores_taken']} samples already in {into} from {src}", file=sys.stderr
        )
    if added.get("review_action"):
        action = added["review_action"]
        print(
            f"the review it brought is action #{action}: `tokview review --undo {action}` takes it back",
            file=sys.stderr,
        )
    if added.get("other_ids"):
        print(
            f"tokview: note: {added['other_ids']} samples already in {into} hold other ids in {src} under the same "
            "sample id (generated again, against another server or seed): the ones here were kept",
            file=sys.stderr,
        )
    if added.get("verdicts_kept"):  # both stores reviewed them since the copy: this one's review stands
        print(
            f"tokview: note: {added['verdicts_kept']} samples already in {into} have another status in {src} (both "
            "reviewed them since the copy, or their ids differ under one sample id): the review here was kept and "
            "the source's was not merged (review them here, or in the app)",
            file=sys.stderr,
        )
    if added.get("verdicts_undone_here"):  # merging again took nothing, and said nothing of why
        print(
            f"tokview: note: {added['verdicts_undone_here']} samples already in {into} hold the review {src} holds, "
            "undone here since (`tokview review --history` shows the undo): not merged again",
            file=sys.stderr,
        )
    if added.get("notes_taken"):
        print(
            f"tokview: merged the notes and tags {src} added to {added['notes_taken']} samples both stores reviewed "
            "since the copy (beside the review here)",
            file=sys.stderr,
        )
    if added.get("scores_kept"):
        print(
            f"tokview: note: {added['scores_kept']} samples already in {into} were scored otherwise in {src} (scored "
            "in both since the copy): the scores here were kept",
            file=sys.stderr,
        )
