"""Review of one sample at a time: verdicts, notes and tags, and taking them back.

What a key press in the app writes (and `tokview review` for one id). Each write is one *action* (see
`bulk_review`, which writes the same rows for many samples at once), so `undo_action` takes any of them back,
wherever it was made; `undo_verdict` and `undo_latest` take back one sample's latest verdict or note.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokview.store import bulk_review
from tokview.store.connection import StoreFile
from tokview.store.sample_rows import STATUSES, UnknownSample


class ReviewRepository:
    """Verdicts, notes, tags and actions of one store file."""

    def __init__(self, file: StoreFile) -> None:
        self.file = file

    def status_of(self, sample_id: str) -> str:
        """The sample's review status; UnknownSample when it is not stored."""
        rows = self.file.query("SELECT status FROM samples WHERE sample_id = ?", [sample_id])
        if not rows:
            raise UnknownSample(sample_id)
        return str(rows[0][0])

    def record_verdict(
        self,
        sample_id: str,
        status: str,
        *,
        reason: str | None = None,
        note: str | None = None,
        tags: Sequence[str] = (),
        who: str | None = None,
        override: bool = False,
        source: str = "app",
    ) -> int:
        """One verdict on one sample, as one action; returns the action's id."""
        if status not in STATUSES:
            raise ValueError(f"unknown status {status!r} (choose from {', '.join(STATUSES)})")
        with self.file.connection():
            self.status_of(sample_id)
            action = bulk_review.new_action_id(self.file)
            self.file.write(
                [
                    bulk_review.action_row(action, who=who, kind=status, detail=reason, samples=1, source=source),
                    (
                        'INSERT INTO verdicts (sample_id, "at", who, kind, status, reason, note, tags, override, '
                        "action_id) VALUES (?, now(), ?, 'verdict', ?, ?, ?, ?, ?, ?)",
                        [sample_id, who, status, reason, note, list(tags), override, action],
                    ),
                    ("UPDATE samples SET status = ? WHERE sample_id = ?", [status, sample_id]),
                ]
            )
            return action

    def undo_verdict(self, sample_id: str, who: str | None = None) -> str:
        """Take back the latest verdict; the status it had before comes back. Returns the new status."""
        with self.file.connection():
            current = self.status_of(sample_id)
            live = self.file.query(
                "SELECT seq, status FROM verdicts WHERE sample_id = ? AND kind = 'verdict' AND "
                "NOT undone ORDER BY seq DESC LIMIT 2",
                [sample_id],
            )
            if not live:
                return current
            restored = str(live[1][1]) if len(live) > 1 else "pending"
            self.file.write(
                [
                    ("UPDATE verdicts SET undone = true WHERE seq = ?", [live[0][0]]),
                    (
                        "INSERT INTO verdicts (sample_id, \"at\", who, kind, status) VALUES (?, now(), ?, 'undo', ?)",
                        [sample_id, who, restored],
                    ),
                    ("UPDATE samples SET status = ? WHERE sample_id = ?", [restored, sample_id]),
                ]
            )
            return restored

    def undo_latest(self, sample_id: str, who: str | None = None) -> str | None:
        """Take back the sample's latest verdict, note or tag, whichever came last: "verdict" or "note", or None
        when there was nothing to undo."""
        with self.file.connection():
            self.status_of(sample_id)
            last = self.file.query(
                "SELECT seq, kind FROM verdicts WHERE sample_id = ? AND kind IN ('verdict', 'note') "
                "AND NOT undone ORDER BY seq DESC LIMIT 1",
                [sample_id],
            )
            if not last:
                return None
            if last[0][1] == "note":
                self.file.write(
                    [
                        ("UPDATE verdicts SET undone = true WHERE seq = ?", [last[0][0]]),
                        (
                            "INSERT INTO verdicts (sample_id, \"at\", who, kind) VALUES (?, now(), ?, 'undo')",
                            [sample_id, who],
                        ),
                    ]
                )
                return "note"
            self.undo_verdict(sample_id, who=who)
            return "verdict"

    def add_note(
        self, sample_id: str, note: str, *, who: str | None = None, tags: Sequence[str] = (), source: str = "app"
    ) -> int:
        """A note and/or tags on one sample: one action; returns its id."""
        with self.file.connection():
            self.status_of(sample_id)
            action = bulk_review.new_action_id(self.file)
            kind = "tag" if tags and not note else "note"
            detail = note or ", ".join(tags)
            self.file.write(
                [
                    bulk_review.action_row(action, who=who, kind=kind, detail=detail, samples=1, source=source),
                    (
                        'INSERT INTO verdicts (sample_id, "at", who, kind, note, tags, action_id) '
                        "VALUES (?, now(), ?, 'note', ?, ?, ?)",
                        [sample_id, who, note, list(tags), action],
                    ),
                ]
            )
            return action

    def undo_action(
        self, action_id: int | None = None, *, who: str | None = None, source: str = "app"
    ) -> bulk_review.Undone | None:
        """Take back the latest action not undone (or `action_id`), a bulk one as one step."""
        with self.file.connection():
            return bulk_review.undo_action(self.file, action_id, who=who, source=source)
