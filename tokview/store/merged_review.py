"""The review a merge brings across, as one action of the target store.

Why an action: a review done on a copy (two reviewers each taking half, on their own laptops) comes back with
`tokview merge`; a merge that brought the wrong copy's verdicts must be taken back as one step (`u` in the app,
`tokview review --undo ID`), not sample by sample. Every verdict and note row the merge adds carries the merge's
action id, and every earlier row it marks undone (an undo made in the copy) names the merge in `undone_by`, so
`bulk_review.undo_action` takes all of it back like any bulk action.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from tokview.store import bulk_review, prompt_refs
from tokview.store.merge import shared_columns


@dataclass(frozen=True)
class MergedReview:
    """The merge's action: its id (taken before any row is written) and the last verdict row before the merge."""

    action_id: int
    before: int

    @classmethod
    def begin(cls, conn: duckdb.DuckDBPyConnection) -> MergedReview:
        row = conn.execute("SELECT nextval('verdict_seq'), (SELECT coalesce(max(seq), -1) FROM main.verdicts)")
        action_id, before = row.fetchone() or (0, -1)
        return cls(int(action_id), int(before))

    def finish(self, conn: duckdb.DuckDBPyConnection, source_name: str) -> dict[str, int]:
        """Name the rows the merge wrote as its action, and write the action when there is any (`review_action`:
        its id, for the merge to print)."""
        written = f"seq > {self.before} AND kind IN ('verdict', 'note')"
        conn.execute(f"UPDATE main.verdicts SET action_id = ? WHERE {written}", [self.action_id])
        row = conn.execute(
            f"SELECT count(DISTINCT sample_id) FROM main.verdicts WHERE {written} OR undone_by = ?", [self.action_id]
        ).fetchone()
        samples = int(row[0]) if row else 0
        if not samples:
            return {}
        sql, params = bulk_review.action_row(
            self.action_id, who=None, kind="merge", detail=source_name, samples=samples, source="merge"
        )
        conn.execute(sql, params)
        return {"review_action": self.action_id}


_VERDICT_COLUMNS = ("sample_id", '"at"', "who", "kind", "status", "reason", "note", "tags", "undone")
_EVENT = 'struct_pack(t := "at", w := who, k := kind, s := status, r := reason, n := note, g := tags)'
"""One review event as both stores recorded it, its `undone` flag left out (a later undo sets it on an earlier
event) and its numbering (`seq`: each store's own)."""


def verdict_columns(conn: duckdb.DuckDBPyConnection) -> str:
    """The verdict columns a merge copies: the events themselves, and `override` when both stores have it. Not the
    numbering or the `actions` links, which are each store's own (the merge is one action here: `MergedReview`)."""
    shared = set(shared_columns(conn, "verdicts"))
    return ", ".join([*_VERDICT_COLUMNS, *(["override"] if "override" in shared else [])])


def take_review(conn: duckdb.DuckDBPyConnection, verdict_cols: str, action: MergedReview) -> tuple[int, int, int, int]:
    """The review a source added to samples this store holds too: (samples whose review came across, samples whose
    review here was kept though the source's differs, samples given the source's notes or tags beside it, samples
    whose review here is the source's undone since: `undone_here`).

    Why: a review done on a copy (or on two copies, two reviewers each taking half) and merged back used to vanish:
    only new samples brought their verdicts. A sample's review comes across when this store's events for it are
    the source's first ones (none, or the history the copy was made from): the events past them are added and the
    earlier ones take the source's `undone` flags, so its status is the source's. Only for a sample whose ids are the
    same in both stores: sample ids come from the prompt and the settings, so two runs of one prompt (shards, a
    re-run) share an id for other answers, and a review of one is no review of the other. When the two histories
    diverge (both stores reviewed it since the copy), or the ids differ, this store's review stands, and the merge
    says how many samples have another status there; the source's notes and tags are added beside it
    (`_take_notes`)."""
    conn.execute(
        f"CREATE OR REPLACE TEMP TABLE _merge_hist AS SELECT s.sample_id, s.ev AS src_ev, m.ev AS main_ev FROM "
        f"(SELECT sample_id, list({_EVENT} ORDER BY seq) AS ev FROM src.verdicts WHERE sample_id IN "
        "(SELECT sample_id FROM main.samples) GROUP BY sample_id) s LEFT JOIN "
        f"(SELECT sample_id, list({_EVENT} ORDER BY seq) AS ev FROM main.verdicts WHERE sample_id IN "
        "(SELECT sample_id FROM src.verdicts) GROUP BY sample_id) m "
        "USING (sample_id)"
    )
    refs = [c for c in prompt_refs.REF_COLUMNS if c in shared_columns(conn, "samples")]  # an older source: none
    same_refs = "".join(f" AND s.{c} IS NOT DISTINCT FROM m.{c}" for c in refs)
    conn.execute(  # a sample id names the same ids in both only if they were made alike: compared, never assumed
        "CREATE OR REPLACE TEMP TABLE _merge_same AS SELECT h.sample_id FROM _merge_hist h "
        "JOIN src.samples s USING (sample_id) JOIN main.samples m USING (sample_id) "
        f"WHERE s.output_ids = m.output_ids AND s.prompt_ids = m.prompt_ids{same_refs}"
    )
    conn.execute(
        "CREATE OR REPLACE TEMP TABLE _merge_take AS SELECT sample_id, coalesce(len(main_ev), 0) AS held "
        "FROM _merge_hist WHERE sample_id IN (SELECT sample_id FROM _merge_same) AND (main_ev IS NULL OR "
        "(len(main_ev) < len(src_ev) AND src_ev[1:len(main_ev)] IS NOT DISTINCT FROM main_ev))"
    )
    kept = conn.execute(  # reviewed otherwise: another status there, and not only an older history of this one
        "SELECT count(*) FROM _merge_hist h JOIN src.samples s USING (sample_id) JOIN main.samples m USING "
        "(sample_id) WHERE h.sample_id NOT IN (SELECT sample_id FROM _merge_take) AND s.status <> m.status "
        "AND NOT (len(src_ev) <= coalesce(len(main_ev), 0) AND main_ev[1:len(src_ev)] IS NOT DISTINCT FROM src_ev)"
    ).fetchone()
    numbered = "row_number() OVER (PARTITION BY sample_id ORDER BY seq)"
    conn.execute(
        f"CREATE OR REPLACE TEMP TABLE _merge_src AS SELECT v.*, {numbered} AS n FROM src.verdicts v "
        "WHERE sample_id IN (SELECT sample_id FROM _merge_take)"
    )
    conn.execute(  # the events both hold: the source's undo flags (an undo in the copy marked one of them), each
        # one it sets named as undone by the merge, so that undoing the merge brings it back
        "UPDATE main.verdicts SET undone = u.undone, undone_by = CASE WHEN u.undone AND NOT main.verdicts.undone "
        f"THEN ? ELSE main.verdicts.undone_by END FROM (SELECT m.seq, s.undone FROM (SELECT seq, sample_id, "
        f"{numbered} AS n FROM main.verdicts WHERE sample_id IN (SELECT sample_id FROM _merge_take)) m "
        "JOIN _merge_src s USING (sample_id, n)) u WHERE main.verdicts.seq = u.seq",
        [action.action_id],
    )
    conn.execute(
        f"INSERT INTO main.verdicts ({verdict_cols}) SELECT {verdict_cols} FROM _merge_src s "
        "JOIN _merge_take t USING (sample_id) WHERE s.n > t.held ORDER BY s.seq"
    )
    conn.execute(
        "UPDATE main.samples SET status = s.status FROM src.samples s WHERE main.samples.sample_id = s.sample_id "
        "AND s.sample_id IN (SELECT sample_id FROM _merge_take)"
    )
    counted = conn.execute("SELECT count(*) FROM _merge_take").fetchone()
    taken = int(counted[0]) if counted else 0
    noted = _take_notes(conn)
    undone = undone_here(conn)
    for table in ("_merge_hist", "_merge_same", "_merge_take", "_merge_src"):
        conn.execute(f"DROP TABLE {table}")
    return taken, int(kept[0]) if kept else 0, noted, undone


def undone_here(conn: duckdb.DuckDBPyConnection) -> int:
    """Samples whose history here is the source's and then only undos: the source's review was merged (or copied from
    here) and undone since. Merging it again takes nothing (this store's history already holds it), and a user pass
    found the merge silent on it: `+0`, every sample still pending. Counted, so the merge says why; a review of tags or
    notes alone too (it asked for a status of the source's other than this store's, and a tag leaves both pending)."""
    row = conn.execute(
        "SELECT count(*) FROM _merge_hist WHERE sample_id IN (SELECT sample_id FROM _merge_same) AND sample_id NOT IN "
        "(SELECT sample_id FROM _merge_take) AND len(main_ev) > len(src_ev) "
        "AND main_ev[1:len(src_ev)] IS NOT DISTINCT FROM src_ev "
        "AND len(list_filter(main_ev[len(src_ev) + 1:], lambda e: e.k <> 'undo')) = 0"
    ).fetchone()
    return int(row[0]) if row else 0


def _take_notes(conn: duckdb.DuckDBPyConnection) -> int:
    """Notes and tags the source added to a sample both stores reviewed since the copy: added beside this store's
    review as note rows (samples given some). Why: a verdict is one or the other, but a note or a tag is not in
    conflict with anything, and a second reviewer's were dropped without a word when the two histories diverged
    (only another status was said). Only the source's live rows past the history both share that carry a note or
    tags (a note row, or the source's latest verdict written with them: its note and tags, not its status; an
    earlier verdict's tags were replaced there, and brought as a note they came back for good), and only those this store
    holds no row of yet by sample, time, author and kind: an untag rewrites a row with the same time and a tag fewer,
    and that rewrite was added as a second copy of the note; merging the same source again adds nothing."""
    rows = conn.execute(
        "SELECT sample_id, src_ev, main_ev FROM _merge_hist WHERE main_ev IS NOT NULL AND src_ev IS DISTINCT FROM "
        "main_ev AND sample_id IN (SELECT sample_id FROM _merge_same) "
        "AND sample_id NOT IN (SELECT sample_id FROM _merge_take)"
    ).fetchall()
    past: list[tuple[str, int]] = []
    for sample_id, src_events, main_events in rows:
        shared = 0
        while shared < min(len(src_events), len(main_events)) and src_events[shared] == main_events[shared]:
            shared += 1
        if shared < len(src_events):
            past.append((sample_id, shared))
    if not past:
        return 0
    conn.execute("CREATE OR REPLACE TEMP TABLE _merge_past (sample_id VARCHAR, shared BIGINT)")
    conn.executemany("INSERT INTO _merge_past VALUES (?, ?)", past)
    numbered = "row_number() OVER (PARTITION BY sample_id ORDER BY seq)"
    conn.execute(
        'CREATE OR REPLACE TEMP TABLE _merge_notes AS SELECT s.sample_id, s."at", s.who, s.note, s.tags, s.seq '
        f"FROM (SELECT v.*, {numbered} AS n FROM src.verdicts v WHERE sample_id IN (SELECT sample_id FROM _merge_past)) "
        "s JOIN _merge_past p USING (sample_id) WHERE s.n > p.shared AND NOT s.undone AND (s.kind = 'note' OR "
        "(s.kind = 'verdict' AND (coalesce(s.note, '') <> '' OR coalesce(len(s.tags), 0) > 0) AND s.seq = (SELECT "
        "max(v.seq) FROM src.verdicts v WHERE v.sample_id = s.sample_id AND v.kind = 'verdict' AND NOT v.undone))) "
        'AND NOT EXISTS (SELECT 1 FROM main.verdicts m WHERE m.sample_id = s.sample_id AND m."at" = s."at" '
        "AND m.who IS NOT DISTINCT FROM s.who AND m.kind IN ('note', s.kind))"
    )
    conn.execute(
        'INSERT INTO main.verdicts (sample_id, "at", who, kind, note, tags) '
        "SELECT sample_id, \"at\", who, 'note', note, tags FROM _merge_notes ORDER BY seq"
    )
    counted = conn.execute("SELECT count(DISTINCT sample_id) FROM _merge_notes").fetchone()
    conn.execute("DROP TABLE _merge_notes")
    conn.execute("DROP TABLE _merge_past")
    return int(counted[0]) if counted else 0
