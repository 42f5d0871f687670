"""Verdicts, notes and tags for many samples at once: one transaction, a few statements, any count.

Why set-wise SQL: `record_verdict` and `add_note` take one sample per transaction (two statements and a
status read each), so 10,000 samples cost 10,000 transactions. Here a selection is read once and each
action is one INSERT … SELECT over the ids (passed as one list) plus one UPDATE: 10,000 samples in well
under a second. The rows written are the ones a key press writes (same columns, same `who`), so the
app, `show` and exports read them as they read any verdict; all rows of one action share the
transaction's timestamp, which names the action as a whole. `write=False` works out the same outcome and
writes nothing (a dry run).

Tags follow `Store.load_sample`: a sample's tags are those of its notes not undone and of its latest
verdict not undone; they are compared without case. Removing a tag undoes the notes that carry it
(nothing is deleted) and writes each such note again with its text and other tags, under its author.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tokview.store import queries
from tokview.store.records import SampleFilter

LATEST_VERDICT = (
    "(SELECT max(w.seq) FROM verdicts w WHERE w.sample_id = v.sample_id AND w.kind = 'verdict' AND NOT w.undone)"
)
HAS_TAG = "list_contains(list_transform(coalesce(v.tags, []), lambda t: lower(t)), lower(?))"
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "selected": self.selected,
            "changed": len(self.changed),
            "unchanged": self.unchanged,
            "sample_ids": self.changed,
        }


def select(store: Any, filters: SampleFilter, with_tag: str | None = None) -> list[str]:
    """The ids the filters select (the list's own WHERE, so `--search` is the app's `/`), by sample id."""
    where, params = queries.where_clause(filters)
    if with_tag is not None:
        where = (where + " AND " if where else " WHERE ") + f"sample_id IN ({TAGGED})"
        params.append(with_tag)
    return [r[0] for r in store.query(f"SELECT sample_id FROM samples{where} ORDER BY sample_id", params)]


def invalid_among(store: Any, ids: Sequence[str]) -> list[str]:
    """The ids with an error finding: approving them is an override, asked about once for the group."""
    rows = store.query(f"SELECT sample_id FROM samples WHERE NOT valid AND sample_id IN {IDS} ORDER BY 1", [list(ids)])
    return [r[0] for r in rows]


def _in_status(store: Any, ids: Sequence[str], status: str, reason: str | None = None) -> set[str]:
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
    store: Any,
    ids: Sequence[str],
    status: str,
    *,
    who: str | None,
    reason: str | None = None,
    override_invalid: bool = False,
    write: bool = True,
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
    store._tx(
        [
            (
                'INSERT INTO verdicts (sample_id, "at", who, kind, status, reason, tags, override) '
                f"SELECT s.sample_id, now(), ?, 'verdict', ?, ?, []::VARCHAR[], "
                f"(? AND NOT s.valid) FROM samples s WHERE s.sample_id IN {IDS} ORDER BY s.sample_id",
                [who, status, reason, status == "approved", todo],
            ),
            (f"UPDATE samples SET status = ? WHERE sample_id IN {IDS}", [status, todo]),
        ]
    )
    return outcome


def add_notes(
    store: Any, ids: Sequence[str], *, who: str | None, note: str = "", tags: Sequence[str] = (), write: bool = True
) -> Outcome:
    """A note (and/or tags) on every id; a tag a sample already carries (any case) is not added again."""
    todo = list(ids)
    outcome = Outcome("tag" if tags else "note", len(ids))
    if tags and not note:
        carried = {r[0] for r in store.query(f"{TAGGED} AND v.sample_id IN {IDS}", [tags[0], todo])}
        if len(tags) == 1 and carried:
            todo = [i for i in todo if i not in carried]
            outcome.unchanged["already tagged"] = len(carried)
    outcome.changed = todo
    if todo and write:
        store._tx(
            [
                (
                    'INSERT INTO verdicts (sample_id, "at", who, kind, note, tags) '
                    f"SELECT id, now(), ?, 'note', ?, ? FROM {IDS} AS t(id) ORDER BY id",
                    [who, note, list(tags), todo],
                )
            ]
        )
    return outcome


def remove_tag(store: Any, ids: Sequence[str], tag: str, *, who: str | None, write: bool = True) -> Outcome:
    """Take `tag` (any case) off every id: each live note carrying it is undone and written again without it
    (its text and other tags kept, under its author); an undo row says who removed it. A tag that only the
    latest verdict carries stays (a verdict is taken back with undo, not edited): counted as such."""
    outcome = Outcome("untag", len(ids))
    notes = store.query(
        f"SELECT v.seq, v.sample_id FROM verdicts v WHERE NOT v.undone AND v.kind = 'note' AND {HAS_TAG} "
        f"AND v.sample_id IN {IDS}",
        [tag, list(ids)],
    )
    seqs = [r[0] for r in notes]
    touched = sorted({r[1] for r in notes})
    on_verdicts = {r[0] for r in store.query(f"{TAGGED} AND v.sample_id IN {IDS}", [tag, list(ids)])} - set(touched)
    outcome.changed = touched
    if on_verdicts:
        outcome.unchanged["tag on the latest verdict (undo the verdict to drop it)"] = len(on_verdicts)
    untagged = len(ids) - len(touched) - len(on_verdicts)
    if untagged:
        outcome.unchanged["not tagged"] = untagged
    if not seqs or not write:
        return outcome
    rest = "list_filter(tags, lambda t: lower(t) <> lower(?))"
    store._tx(
        [
            (
                f'INSERT INTO verdicts (sample_id, "at", who, kind, note, tags) SELECT sample_id, "at", who, '
                f"'note', note, {rest} FROM verdicts WHERE seq IN (SELECT unnest(?::BIGINT[])) "
                f"AND (coalesce(note, '') <> '' OR len({rest}) > 0) ORDER BY seq",
                [tag, seqs, tag],
            ),
            ("UPDATE verdicts SET undone = true WHERE seq IN (SELECT unnest(?::BIGINT[]))", [seqs]),
            (
                f"INSERT INTO verdicts (sample_id, \"at\", who, kind, reason) SELECT id, now(), ?, 'undo', ? "
                f"FROM {IDS} AS t(id) ORDER BY id",
                [who, f"untag {tag}", touched],
            ),
        ]
    )
    return outcome
