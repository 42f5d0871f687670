"""Verdicts, notes and tags for many samples at once: one transaction, a few statements, any count.

Why set-wise SQL: `record_verdict` and `add_note` take one sample per transaction (two statements and a
status read each), so 10,000 samples cost 10,000 transactions. Here a selection is read once and each
action is one INSERT … SELECT over the ids (passed as one list) plus one UPDATE: 10,000 samples in well
under a second. The rows written are the ones a key press writes (same columns, same `who`), so the
app, `show` and exports read them as they read any verdict; all rows of one action share the
transaction's timestamp, which names the action as a whole. `write=False` works out the same outcome and
writes nothing (a dry run).

Tags follow `Store.load_sample`: a sample's tags are those of its notes not undone and of its latest
verdict not undone; they are compared without case. Removing a tag undoes the notes and the latest verdict
that carry it (nothing is deleted) and writes each again with its text and other tags, under its author; undoing
the action that wrote such a row takes its copies back with it.

Every write is one *action* (schema 8): a row in `actions` (who, what, how many samples, from the app or
`tokview review`) whose id every verdict row it wrote carries, and which every row it took back names in
`undone_by`. `undo_action` takes an action back as one step, wherever it was made: its rows are undone,
the rows it undid come back, and each touched sample's status is its latest live verdict's again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from tokview.store import queries
from tokview.store.errors import CannotUndo
from tokview.store.sample_rows import SampleFilter

if TYPE_CHECKING:
    from tokview.store.connection import Database, Statement

LATEST_VERDICT = (
    "(SELECT max(w.seq) FROM verdicts w WHERE w.sample_id = v.sample_id AND w.kind = 'verdict' AND NOT w.undone)"
)
HAS_TAG = queries.HAS_TAG
TAGGED = (
    f"SELECT DISTINCT v.sample_id FROM verdicts v WHERE NOT v.undone AND {HAS_TAG} "
    f"AND (v.kind = 'note' OR v.seq = {LATEST_VERDICT})"
)
"""The samples that carry a tag (one parameter), as `load_sample` reads tags."""
IDS = "(SELECT unnest(?::VARCHAR[]))"


@dataclass
class Outcome:
    """What one bulk action did: the ids it changed, and why the others were left as they were."""

    action: str
    selected: int
    changed: list[str] = field(default_factory=list)
    unchanged: dict[str, int] = field(default_factory=dict)
    """reason -> how many selected samples it left alone (already approved, not tagged …)."""
    action_id: int | None = None
    """The action's id in `actions` (None: nothing was written)."""

    def summary(self, what: str = "selected", dry_run: bool = False) -> str:
        """One line: what changed out of what was selected (or marked), and why the rest did not."""
        verb = VERBS[self.action]
        n = len(self.changed)
        line = (
            f"{'would have ' if dry_run else ''}{verb} {n} of {self.selected} {what} sample{'s' * (self.selected != 1)}"
        )
        if self.unchanged:
            line += " (" + ", ".join(f"{count} {why}" for why, count in self.unchanged.items()) + ")"
        return line

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "action_id": self.action_id,
            "selected": self.selected,
            "changed": len(self.changed),
            "unchanged": self.unchanged,
            "sample_ids": self.changed,
        }


def select(store: Database, filters: SampleFilter, with_tags: Sequence[str] = ()) -> list[str]:
    """The ids the filters select (the list's own WHERE, so `--search` is the app's `/`), by sample id; with
    `with_tags`, only those carrying every one (as `export --tag` selects)."""
    where, params = queries.where_clause(filters)
    for tag in with_tags:
        where = (where + " AND " if where else " WHERE ") + f"sample_id IN ({TAGGED})"
        params.append(tag)
    return [r[0] for r in store.query(f"SELECT sample_id FROM samples{where} ORDER BY sample_id", params)]


def tags_of(store: Database, ids: Sequence[str]) -> list[str]:
    """Every live tag any of `ids` carries (one spelling each): what the tag dialog offers to take off."""
    rows = store.query(
        f"SELECT DISTINCT t FROM verdicts v, unnest(v.tags) AS u(t) WHERE v.sample_id IN {IDS} "
        f"AND {queries.LIVE_TAG_ROWS}",
        [list(ids)],
    )
    return queries.caseless_tags(r[0] for r in rows)


def invalid_among(store: Database, ids: Sequence[str], not_yet: str | None = None) -> list[str]:
    """The ids with an error finding: approving them is an override, asked about once for the group. `not_yet`: only
    those not in that status already (a sample approved already is not approved again)."""
    also, params = ("AND status IS DISTINCT FROM ? ", [not_yet]) if not_yet is not None else ("", [])
    rows = store.query(
        f"SELECT sample_id FROM samples WHERE NOT valid AND sample_id IN {IDS} {also}ORDER BY 1", [list(ids), *params]
    )
    return [r[0] for r in rows]


def overturned_among(store: Database, ids: Sequence[str], verdict: str) -> list[str]:
    """The ids carrying the opposite verdict to `verdict`, sorted: a bulk approve or reject overturns them (the app
    says how many in its question; `tokview review` asks for a --status)."""
    return sorted(_in_status(store, ids, "rejected" if verdict == "approved" else "approved"))


def _in_status(store: Database, ids: Sequence[str], status: str, reason: str | None = None) -> set[str]:
    """The ids already `status` (for a reject: with this reason as their latest verdict's)."""
    if reason is None:
        sql, params = f"SELECT sample_id FROM samples WHERE status = ? AND sample_id IN {IDS}", [status, list(ids)]
    else:
        sql = (
            f"SELECT v.sample_id FROM verdicts v WHERE v.sample_id IN {IDS} AND v.seq = {LATEST_VERDICT} "
            "AND v.status = ? AND v.reason IS NOT DISTINCT FROM ?"
        )
        params = [list(ids), status, reason]
    return {r[0] for r in store.query(sql, params)}


def set_status(
    store: Database,
    ids: Sequence[str],
    status: str,
    *,
    who: str | None,
    reason: str | None = None,
    override_invalid: bool = False,
    write: bool = True,
    source: str = "app",
) -> Outcome:
    """Approve or reject every id not already so (a reject counts as done only with the same reason).

    An approval of a sample with an error finding is recorded as an override (`override_invalid` says the
    reviewer was asked and agreed); without it such samples are refused before anything is written."""
    already = _in_status(store, ids, status, reason if status == "rejected" else None)
    todo = [i for i in ids if i not in already]
    outcome = Outcome(status, len(ids), todo, {f"already {status}": len(already)} if already else {})
    invalid = invalid_among(store, todo) if status == "approved" and todo else []
    if invalid and not override_invalid:
        raise ValueError(f"{len(invalid)} of the samples to approve have error findings")
    if not todo or not write:
        return outcome
    outcome.action_id = new_action_id(store)
    store.write(
        [
            action_row(outcome.action_id, who=who, kind=status, detail=reason, samples=len(todo), source=source),
            (
                'INSERT INTO verdicts (sample_id, "at", who, kind, status, reason, tags, override, action_id) '
                f"SELECT s.sample_id, now(), ?, 'verdict', ?, ?, []::VARCHAR[], "
                f"(? AND NOT s.valid), ? FROM samples s WHERE s.sample_id IN {IDS} ORDER BY s.sample_id",
                [who, status, reason, status == "approved", outcome.action_id, todo],
            ),
            (f"UPDATE samples SET status = ? WHERE sample_id IN {IDS}", [status, todo]),
        ]
    )
    return outcome


def add_notes(
    store: Database,
    ids: Sequence[str],
    *,
    who: str | None,
    note: str = "",
    tags: Sequence[str] = (),
    write: bool = True,
    source: str = "app",
) -> Outcome:
    """A note (and/or tags) on every id; a tag a sample already carries (any case) is not added again."""
    todo = list(ids)
    outcome = Outcome("tag" if tags else "note", len(ids))
    if tags and not note:  # a sample carrying every one of the tags already is left as it is
        carried: set[str] | None = None
        for tag in tags:
            has = {r[0] for r in store.query(f"{TAGGED} AND v.sample_id IN {IDS}", [tag, todo])}
            carried = has if carried is None else carried & has
        if carried:
            todo = [i for i in todo if i not in carried]
            outcome.unchanged["already tagged"] = len(carried)
    outcome.changed = todo
    if todo and write:
        outcome.action_id = new_action_id(store)
        store.write(
            [
                action_row(
                    outcome.action_id,
                    who=who,
                    kind=outcome.action,
                    detail=note or ", ".join(tags),
                    samples=len(todo),
                    source=source,
                ),
                (
                    'INSERT INTO verdicts (sample_id, "at", who, kind, note, tags, action_id) '
                    f"SELECT id, now(), ?, 'note', ?, ?, ? FROM {IDS} AS t(id) ORDER BY id",
                    [who, note, list(tags), outcome.action_id, todo],
                ),
            ]
        )
    return outcome


def remove_tag(
    store: Database, ids: Sequence[str], tag: str, *, who: str | None, write: bool = True, source: str = "app"
) -> Outcome:
    """Take `tag` (any case) off every id: each live note carrying it, and the latest live verdict carrying it,
    is undone and written again without it (its text, status and other tags kept, under its author); an undo
    row says who removed it. All of it is one action, so `undo_action` puts the tag back."""
    outcome = Outcome("untag", len(ids))
    rows = store.query(
        f"SELECT v.seq, v.sample_id FROM verdicts v WHERE NOT v.undone AND {HAS_TAG} "
        f"AND (v.kind = 'note' OR v.seq = {LATEST_VERDICT}) AND v.sample_id IN {IDS}",
        [tag, list(ids)],
    )
    seqs = [r[0] for r in rows]
    touched = sorted({r[1] for r in rows})
    outcome.changed = touched
    if len(ids) > len(touched):
        outcome.unchanged["not tagged"] = len(ids) - len(touched)
    if not seqs or not write:
        return outcome
    outcome.action_id = action = new_action_id(store)
    rest = "list_filter(tags, lambda t: lower(t) <> lower(?))"
    seq_list = "(SELECT unnest(?::BIGINT[]))"
    store.write(
        [
            action_row(action, who=who, kind="untag", detail=tag, samples=len(touched), source=source),
            (  # the copies keep their order: a verdict copy is its sample's latest verdict again
                'INSERT INTO verdicts (sample_id, "at", who, kind, status, reason, note, tags, override, action_id) '
                f'SELECT sample_id, "at", who, kind, status, reason, note, {rest}, override, ? FROM verdicts '
                f"WHERE seq IN {seq_list} AND (kind = 'verdict' OR coalesce(note, '') <> '' OR len({rest}) > 0) "
                "ORDER BY seq",
                [tag, action, seqs, tag],
            ),
            (f"UPDATE verdicts SET undone = true, undone_by = ? WHERE seq IN {seq_list}", [action, seqs]),
            (
                'INSERT INTO verdicts (sample_id, "at", who, kind, reason, action_id) '
                f"SELECT id, now(), ?, 'undo', ?, ? FROM {IDS} AS t(id) ORDER BY id",
                [who, f"untag {tag}", action, touched],
            ),
        ]
    )
    return outcome


# -- actions and their undo ------------------------------------------------------------------------
VERBS = {
    "approved": "approved",
    "rejected": "rejected",
    "tag": "tagged",
    "untag": "untagged",
    "note": "noted",
    "merge": "merged the review of",
}


def new_action_id(store: Database) -> int:
    """A fresh action id, from the verdict rows' own sequence (older stores' actions are named by a row's seq)."""
    return int(store.query("SELECT nextval('verdict_seq')")[0][0])


def action_row(
    action_id: int, *, who: str | None, kind: str, detail: str | None, samples: int, source: str
) -> Statement:
    """The `actions` row of one action: who did what (`kind`, `detail`) to how many samples, from where."""
    return (
        'INSERT INTO actions (action_id, "at", who, kind, detail, samples, source) VALUES (?, now(), ?, ?, ?, ?, ?)',
        [action_id, who, kind, detail or None, samples, source],
    )


def describe_action(kind: str, detail: str | None, samples: int) -> str:
    """`rejected 200 samples (loops)`, `tagged 1 sample (math)`: what an action did, in one phrase."""
    if kind == "undo":
        return f"undo of {detail}"  # the detail names the action taken back: `#812 rejected 200 samples (loops)`
    verb = VERBS.get(kind, kind)
    return f"{verb} {samples} sample{'s' * (samples != 1)}" + (f" ({detail})" if detail else "")


@dataclass
class Action:
    """One row of `actions`: who did what to how many samples, when, from where; undone by which action."""

    action_id: int
    at: datetime | None
    who: str | None
    kind: str
    detail: str | None
    samples: int
    source: str | None
    undone_by: int | None

    @property
    def described(self) -> str:
        return describe_action(self.kind, self.detail, self.samples)

    @property
    def line(self) -> str:
        """`#812  2026-12-02 01:30  carol  rejected 200 samples (loops)  [review]`, `(undone by #830)` when so."""
        when = self.at.strftime("%Y-%m-%d %H:%M") if self.at is not None else "?"
        text = f"#{self.action_id}  {when}  {self.who or '?'}  {self.described}  [{self.source or '?'}]"
        return text + (f"  (undone by #{self.undone_by})" if self.undone_by else "")


@dataclass
class Undone:
    """What an undo took back: the action, and the samples it touched (their statuses now)."""

    action: Action
    undo_id: int
    sample_ids: list[str]
    statuses: dict[str, str]

    @property
    def kind(self) -> str:
        return self.action.kind

    @property
    def who(self) -> str | None:
        return self.action.who

    @property
    def line(self) -> str:
        """`undid #812 rejected 200 samples (loops) by carol: 200 samples (a, b, c and 197 more) back to pending`."""
        ids = self.sample_ids
        shown = ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
        a = self.action
        now = (  # a tag, untag or note left every status as it was: "back to approved, pending" read as a change
            f", {'notes' if a.kind == 'note' else 'tags'} as they were"
            if a.kind in ("tag", "untag", "note")
            else f" back to {', '.join(sorted(set(self.statuses.values())))}"
        )
        n = len(ids)
        return f"undid #{a.action_id} {a.described} by {a.who or '?'}: {n} sample{'s' * (n != 1)} ({shown}){now}"

    def to_dict(self) -> dict[str, Any]:
        a = self.action
        return {
            "undid": a.action_id,
            "kind": a.kind,
            "detail": a.detail,
            "who": a.who,
            "source": a.source,
            "undo_id": self.undo_id,
            "sample_ids": self.sample_ids,
        }


ACTION_COLUMNS = 'action_id, "at", who, kind, detail, samples, source, undone_by'


def actions(store: Database, limit: int = 50) -> list[Action]:
    """The latest actions first (undos included, each naming what it took back in its detail)."""
    rows = store.query(f"SELECT {ACTION_COLUMNS} FROM actions ORDER BY action_id DESC LIMIT ?", [int(limit)])
    return [Action(*r) for r in rows]


def latest_undoable(store: Database) -> Action | None:
    """The action `u` takes back: the latest not undone (an undo itself is never the target)."""
    return _target(store, None)


def _target(store: Database, action_id: int | None) -> Action | None:
    if action_id is None:
        rows = store.query(
            f"SELECT {ACTION_COLUMNS} FROM actions WHERE undone_by IS NULL AND kind <> 'undo' "
            "ORDER BY action_id DESC LIMIT 1"
        )
        return Action(*rows[0]) if rows else None
    rows = store.query(f"SELECT {ACTION_COLUMNS} FROM actions WHERE action_id = ?", [int(action_id)])
    if not rows:
        raise CannotUndo(f"no action #{action_id} in this store")
    action = Action(*rows[0])
    if action.kind == "undo":
        raise CannotUndo(f"#{action_id} is an undo: take back the action it undid again instead")
    if action.undone_by is not None:
        raise CannotUndo(f"#{action_id} ({action.described}) is already undone")
    return action


UNTAG_COPY_OF_ACTION = (
    "kind IN ('verdict', 'note') AND action_id IN (SELECT action_id FROM actions WHERE kind IN ('untag', 'merge')) "
    "AND EXISTS (SELECT 1 FROM verdicts o WHERE o.action_id = ? AND o.sample_id = verdicts.sample_id "
    'AND o."at" = verdicts."at" AND o.kind = verdicts.kind AND o.who IS NOT DISTINCT FROM verdicts.who)'
)
"""A verdict or note row an untag wrote again (`remove_tag`: the same sample, time, author and kind, a tag fewer) of
a row the action (one parameter) wrote, or a merge brought from a copy where an untag wrote it: undoing the action
takes it back with its own rows. Left live, the untag's copy of an undone reject kept the sample rejected, and of an
undone note kept the note."""

UNDONE_ORIGINALS = (
    'SELECT o.sample_id, o."at", o.kind, o.who, max(x.undone_by) AS undo FROM verdicts o '
    "JOIN actions x ON x.action_id = o.action_id WHERE x.undone_by IS NOT NULL AND x.kind NOT IN ('untag', 'undo') "
    "AND o.kind IN ('verdict', 'note') GROUP BY ALL"
)
"""The verdict and note rows of undone actions (not untags), by what their untag copies keep of them, with the undo
that took each back: a copy of one must not come back when an untag is undone."""


def _refuse_an_untag_untagged_since(store: Database, target: Action) -> None:
    """CannotUndo when a later untag, still in force, wrote again the rows this untag wrote: undone first, this one
    would bring back the row before both, the later untag's tag with it (or leave two of the note). Undone in turn
    (the later one first, as `u` does), each comes back as it was."""
    later = store.query(
        "SELECT min(b.action_id) FROM verdicts v JOIN actions b ON b.action_id = v.undone_by "
        "WHERE v.action_id = ? AND b.kind = 'untag' AND b.undone_by IS NULL",
        [target.action_id],
    )
    if later and later[0][0] is not None:
        raise CannotUndo(
            f"#{target.action_id} ({target.described}): untag #{later[0][0]} took a tag off the same notes since; "
            f"undo #{later[0][0]} first"
        )


def undo_action(
    store: Database, action_id: int | None = None, *, who: str | None, source: str = "app"
) -> Undone | None:
    """Take back one action (the latest one not undone, or `action_id`) as one step; None when none is left.

    Its rows are undone and the rows it undid come back, so an undone untag puts the tag back; each touched
    sample's status becomes its latest live verdict's (else pending), whatever came after the action."""
    target = _target(store, action_id)
    if target is None:
        return None
    a = target.action_id
    if target.kind == "untag":
        _refuse_an_untag_untagged_since(store, target)
    touched = [
        r[0]
        for r in store.query(
            "SELECT DISTINCT sample_id FROM verdicts WHERE action_id = ? OR undone_by = ? ORDER BY 1", [a, a]
        )
    ]
    undo = new_action_id(store)
    latest_status = (
        "coalesce((SELECT arg_max(v.status, v.seq) FROM verdicts v WHERE v.sample_id = samples.sample_id "
        "AND v.kind = 'verdict' AND NOT v.undone), 'pending')"
    )
    store.write(
        [
            action_row(
                undo, who=who, kind="undo", detail=f"#{a} {target.described}", samples=len(touched), source=source
            ),
            (
                "UPDATE verdicts SET undone = true, undone_by = ? WHERE action_id = ? AND kind IN ('verdict', 'note') "
                "AND NOT undone",
                [undo, a],
            ),
            (  # and the live copies an untag wrote of them since (they keep the row's sample, time, author, kind)
                f"UPDATE verdicts SET undone = true, undone_by = ? WHERE NOT undone AND {UNTAG_COPY_OF_ACTION}",
                [undo, a],
            ),
            (  # rows it undid whose own action was undone since stay undone, by that action's undo: undoing an
                # untag after undoing the tag put the tag back
                "UPDATE verdicts SET undone_by = x.undone_by FROM actions x WHERE verdicts.undone_by = ? "
                "AND x.action_id = verdicts.action_id AND x.undone_by IS NOT NULL",
                [a],
            ),
            (  # and so do untag copies of rows whose action was undone since (undo the note, then the untag)
                f"UPDATE verdicts SET undone_by = f.undo FROM ({UNDONE_ORIGINALS}) f WHERE verdicts.undone_by = ? "
                'AND f.sample_id = verdicts.sample_id AND f."at" = verdicts."at" AND f.kind = verdicts.kind '
                "AND f.who IS NOT DISTINCT FROM verdicts.who",
                [a],
            ),
            ("UPDATE verdicts SET undone = false, undone_by = NULL WHERE undone_by = ?", [a]),
            (f"UPDATE samples SET status = {latest_status} WHERE sample_id IN {IDS}", [touched]),
            (
                'INSERT INTO verdicts (sample_id, "at", who, kind, status, reason, action_id) '
                f"SELECT sample_id, now(), ?, 'undo', status, ?, ? FROM samples WHERE sample_id IN {IDS} "
                "ORDER BY sample_id",
                [who, f"undo #{a} {target.described}", undo, touched],
            ),
            ("UPDATE actions SET undone_by = ? WHERE action_id = ?", [undo, a]),
        ]
    )
    statuses = dict(store.query(f"SELECT sample_id, status FROM samples WHERE sample_id IN {IDS}", [touched]))
    return Undone(target, undo, touched, statuses)
