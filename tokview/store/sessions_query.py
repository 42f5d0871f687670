"""The conversations `tokview proxy` recorded, as the app's sessions list and a session's chain of turns.

How the proxy stores them (`proxy/recorder.py`, `proxy/sessions.py`): each generation is a sample whose id
starts `proxy:`, whose `prompt_id` is its session id (`session:NAME` from the session header, `user:NAME`
from the request's `user` field, `proxy:RUN:sN` for a conversation found by its ids) and whose `turn` is
its index in that session; the request's headers (the harness's user-agent among them) are in
`raw_request`. A request that failed is a failure row under the same session id.

Why a module of its own: the screen only shows rows; the grouping is SQL, answered by DuckDB in one pass
however many turns a store holds, and testable without Textual.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokview.store.connection import Database

PROXIED = "sample_id LIKE 'proxy:%' AND turn IS NOT NULL"
"""The samples `tokview proxy` recorded into a conversation."""
UNPLACED = "sample_id LIKE 'proxy:%' AND prompt_id LIKE 'proxy:%:unplaced'"
"""The failed requests of harnesses that named no session (`proxy/recorder.py`): a failure has no ids to place it by,
so these belong to no conversation. They were listed as one session of failures, counted among the sessions."""

_PARTS = f"""
r AS (
    SELECT prompt_id, run_id, min(turn) AS first_turn, max(turn) AS last_turn, min(created_at) AS began
    FROM samples WHERE {PROXIED} GROUP BY prompt_id, run_id
), l AS (
    SELECT *, CASE WHEN first_turn = lag(last_turn) OVER (PARTITION BY prompt_id ORDER BY began, run_id) + 1
                   THEN 0 ELSE 1 END AS starts
    FROM r
), parts AS (
    SELECT prompt_id, run_id,
           sum(starts) OVER (PARTITION BY prompt_id ORDER BY began, run_id ROWS UNBOUNDED PRECEDING) - 1 AS part
    FROM l
), failed AS (
    SELECT f.*, coalesce(p.part, (SELECT max(q.part) FROM parts q WHERE q.prompt_id = f.prompt_id), 0) AS part
    FROM failures f LEFT JOIN parts p ON p.prompt_id = f.prompt_id AND p.run_id IS NOT DISTINCT FROM f.run_id
    WHERE f.sample_id LIKE 'proxy:%' AND NOT f.prompt_id LIKE 'proxy:%:unplaced'
)"""
"""Which conversation of its session id each run's turns are (`part`, from 0): one session name may hold several.
A later run's turns go on with the conversation before them when they begin at its next turn (a restarted proxy
restored it: `conversation_turns.goes_on_in_next_run`); from another turn (two stores merged whose harnesses named
their sessions alike, a name reused after eviction) they are a conversation of their own. A failure belongs to its
run's part, or to the newest part of its session when its run placed no turn there."""

_SESSIONS_ALL = f"""
WITH {_PARTS.strip()}, s AS (
    SELECT p.prompt_id, p.part,
           count(*) AS turns,
           arg_max(json_extract_string(raw_request, '$.headers."user-agent"'), created_at) AS harness,
           arg_max(prompt_len + output_len, (turn, created_at)) AS context,
           sum(output_len) AS output_tokens,
           sum(len(codes)) AS findings,
           count(*) FILTER (WHERE NOT valid) AS invalid,
           min(created_at) AS started,
           max(created_at) AS last
    FROM samples JOIN parts p USING (prompt_id, run_id) WHERE {PROXIED}
    GROUP BY p.prompt_id, p.part
), f AS (
    SELECT prompt_id, part, count(*) AS failed, min("at") AS started, max("at") AS last
    FROM failed GROUP BY prompt_id, part
)
SELECT prompt_id, s.harness, coalesce(s.turns, 0) AS turns, coalesce(s.context, 0), coalesce(s.output_tokens, 0),
       coalesce(s.findings, 0) AS findings, coalesce(s.invalid, 0), coalesce(f.failed, 0) AS failed,
       least(s.started, f.started), greatest(s.last, f.last) AS last, part
FROM s FULL OUTER JOIN f USING (prompt_id, part)
"""
"""Every proxied conversation, one whose every request failed included (a FULL join: listed from the samples alone,
a session of failures was not there at all, and with none that succeeded the screen said there were no sessions)."""

_SESSIONS = f"{_SESSIONS_ALL} ORDER BY last DESC, prompt_id, part LIMIT ?"

_TOTALS = (
    f"SELECT count(*), coalesce(sum(turns), 0), coalesce(sum(findings), 0), "
    f"(SELECT count(*) FROM failures WHERE {UNPLACED}) FROM ({_SESSIONS_ALL})"
)

_ONE_SESSION_PARTS = _PARTS.replace(
    f"FROM samples WHERE {PROXIED} GROUP BY", f"FROM samples WHERE {PROXIED} AND prompt_id = ? GROUP BY"
)
"""`_PARTS` of one session id (its first parameter): opening a session reads its own turns, not every session's."""
assert _ONE_SESSION_PARTS != _PARTS

_TURNS = f"""
WITH {_ONE_SESSION_PARTS.strip()}
SELECT sample_id, turn, prompt_len, output_len, finish_reason, status, codes, valid, latency_s,
       left(coalesce(nullif(content, ''), nullif('→ ' || replace(tool_calls_text, chr(10), '; '), '→ '),
                     nullif(text, ''), reasoning, ''), 200), created_at
FROM samples JOIN parts p USING (prompt_id, run_id) WHERE {PROXIED} AND prompt_id = ? AND p.part = ?
ORDER BY turn, created_at, sample_id
"""

_FAILED_TURNS = f"""
WITH {_ONE_SESSION_PARTS.strip()}
SELECT sample_id, reason, "at" FROM failed WHERE prompt_id = ? AND part = ? ORDER BY "at", sample_id
"""

_VERSION = f"""
SELECT (SELECT count(*) FROM samples WHERE {PROXIED}),
       (SELECT max(created_at) FROM samples WHERE {PROXIED}),
       (SELECT count(*) FROM failures WHERE sample_id LIKE 'proxy:%'),
       (SELECT count(*) FROM verdicts)
"""

MAX_SESSIONS = 5_000
"""Sessions listed (the most recently active first): a list a person scrolls, not an export."""


@dataclass(frozen=True)
class SessionRow:
    """One recorded conversation as the sessions list shows it."""

    session_id: str
    harness: str | None
    """The user-agent the harness sent with its newest turn (never its credentials: those are not stored)."""
    turns: int
    context: int
    """Ids in the newest turn's prompt + output: how long the conversation has grown."""
    output_tokens: int
    findings: int
    invalid: int
    failed: int
    started: datetime
    last: datetime
    part: int = 0
    """Which conversation of `session_id` this is, from 0: a session name two stores' harnesses both used (merged)
    holds one conversation each."""

    @property
    def label(self) -> str:
        """The session as a person reads it: its id, and `(2)`, `(3)` … for a later one."""
        return session_label(self.session_id, self.part)

    @property
    def key(self) -> str:
        """What the list keys the row by: unique where labels are not (a harness may name a session `s (2)`)."""
        return f"{self.part}\0{self.session_id}"


def session_label(session_id: str, part: int) -> str:
    """A session's conversation as a person reads it: its id, and `(2)`, `(3)` … for a later one of the same id."""
    return session_id if part == 0 else f"{session_id} ({part + 1})"


@dataclass(frozen=True)
class TurnRow:
    """One turn of a conversation: a sample, opened in the inspect screen."""

    sample_id: str
    turn: int
    prompt_len: int
    output_len: int
    finish_reason: str | None
    status: str
    codes: list[str]
    valid: bool
    latency_s: float | None
    answer: str
    """The start of the answer (its content, else its tool calls after `→ `, else its text, else its reasoning), for
    the list; a failed request's reason. A tool-calling turn showed the start of its reasoning, never its calls."""
    created_at: datetime
    failed: bool = False
    """A request of the session that failed (refused, abandoned, no ids): listed where it came, never inspected."""


def list_sessions(store: Database, limit: int = MAX_SESSIONS) -> list[SessionRow]:
    """The proxied conversations in a store, the most recently active first."""
    return [SessionRow(*row) for row in store.query(_SESSIONS, [limit])]


@dataclass(frozen=True)
class SessionTotals:
    """All the store's proxied conversations, the ones past `MAX_SESSIONS` included (the list shows only those)."""

    sessions: int
    turns: int
    findings: int
    unplaced_failures: int = 0
    """Failed requests in no session (`UNPLACED`)."""


def session_totals(store: Database) -> SessionTotals:
    sessions, turns, findings, unplaced = store.query(_TOTALS)[0]
    return SessionTotals(int(sessions), int(turns), int(findings), int(unplaced))


def session_turns(store: Database, session_id: str, part: int = 0) -> list[TurnRow]:
    """A conversation's turns in order (turn index, then arrival), each failed request after the turns that came
    before it (a failure has no turn: the list said nothing of the requests the sessions list counted failed).
    `part`: which conversation of the session id (`SessionRow.part`)."""
    out = []
    for sample_id, turn, prompt_len, output_len, finish, status, codes, valid, latency, answer, created in store.query(
        _TURNS, [session_id, session_id, part]
    ):
        out.append(
            TurnRow(
                sample_id, turn, prompt_len, output_len, finish, status, list(codes), valid, latency, answer, created
            )
        )
    for sample_id, reason, at in store.query(_FAILED_TURNS, [session_id, session_id, part]):
        before = next((k for k, row in enumerate(out) if not row.failed and row.created_at > at), len(out))
        failed = TurnRow(sample_id, -1, 0, 0, None, "failed", [], False, None, str(reason), at, failed=True)
        out.insert(before, failed)
    return out


def sessions_version(store: Database) -> tuple[Any, ...]:
    """What changes when the proxy lands a turn or a failure, or a turn is reviewed: the screens reload
    when it does (a cheap read, polled while they are open)."""
    return tuple(store.query(_VERSION)[0])
