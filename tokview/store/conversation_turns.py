"""The turns of a sample's conversation, in order: what inspect walks with w / W (issue 23 item 6).

Why by prompt id, generation index and run: a multi-turn row's turns are stored as samples of one prompt id,
one per `turn`, and each generation index is its own conversation (a chain regenerated twice is two chains).
Whether a turn's history was the served one is read from the `chain` entry a served chain records in the
turn's settings (`tokview/batch/chains.py`); `--history file` turns record none.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from tokview.store.connection import Database


Row = TypeVar("Row")


@dataclass(frozen=True)
class Turn:
    sample_id: str
    turn: int
    history: str
    """"served" (each turn's history is the served output before it), "file" (the prompts file's turns) or "harness"
    (a `tokview proxy` session: the history its harness sent)."""
    extends: bool | None = None
    """A served turn's prompt extends the previous turn's prompt + output ids (None: the first turn, or file)."""
    break_at: int | None = None
    """Where the prompt first differs from the previous turn's ids, when it does not extend them."""


def turn_place(turns: list[Turn], turn: Turn) -> str:
    """Where `turn` stands in its conversation, for a person: "turn 3 of 5 (#turn2)" (the count from 1, then the
    stored turn the sample and exported row ids carry), and which of its turn's samples it is when there are several
    (an `n` > 1 request's choices, or a second answer): the walk counts turns, not samples."""
    numbers = sorted({t.turn for t in turns})
    said = f"turn {numbers.index(turn.turn) + 1} of {len(numbers)} (#turn{turn.turn})"
    side_by_side = [t for t in turns if t.turn == turn.turn]
    if len(side_by_side) > 1:
        said += f" (sample {side_by_side.index(turn) + 1} of {len(side_by_side)} at this turn)"
    return said


def _turn(sample_id: str, turn: int, settings: str | None, proxy_break: Any = None) -> Turn:
    if sample_id.startswith("proxy:"):  # the history the harness sent; the proxy stores a break as a finding
        extends = None if turn == 0 else proxy_break is None
        return Turn(sample_id, turn, "harness", extends, None if proxy_break is None else int(proxy_break))
    chain: Any = (json.loads(settings) if settings else {}).get("chain")
    if not isinstance(chain, dict):
        return Turn(sample_id, turn, "file")
    return Turn(sample_id, turn, str(chain.get("history") or "served"), chain.get("extends"), chain.get("break_at"))


PROXY_SESSION_PREFIXES = ("session:", "user:", "proxy:")
"""How a `tokview proxy` session's id (its samples' prompt id) begins: a harness's header, its `user`, or placed by
prefix. Only such a conversation goes on across runs (a restarted proxy restores its sessions)."""
_A_PROXY_SESSION = "(" + " OR ".join(f"starts_with(s.prompt_id, '{p}')" for p in PROXY_SESSION_PREFIXES) + ")"


def goes_on_in_next_run(prompt_id: str, last_turn: int | None, next_turn: int | None) -> bool:
    """Whether a later run's turns go on with a conversation whose run ended at `last_turn`: a proxy session (a
    restarted proxy restored it) whose next run begins at the next turn. A session that began again from turn 0
    (evicted, its name reused) and a batch chain (a prompts file run again) are conversations of their own."""
    return (
        prompt_id.startswith(PROXY_SESSION_PREFIXES)
        and last_turn is not None
        and next_turn is not None
        and next_turn == last_turn + 1
    )


def chained_run_order(first: list[int], last: list[int]) -> list[int]:
    """The order of a conversation's runs (given by start, with their first and last turns, -1 for none) in which a
    run whose first turn goes on from another run's last turn comes right after that run: the start times are local
    wall-clock times, and a proxy restarted under another TZ (or in a daylight-saving fall-back hour) started "before"
    the run it continued, which split the session. Of two runs it may go on from (a session id a harness reused for
    a later conversation), the latest that started before it; else the first after it."""
    followers: dict[int, list[int]] = {}
    roots: list[int] = []
    for k in range(len(first)):
        before = [q for q in range(k) if last[q] == first[k] - 1 and first[q] < first[k]]
        after = [q for q in range(k + 1, len(first)) if last[q] == first[k] - 1 and first[q] < first[k]]
        parent = before[-1] if before else after[0] if after and first[k] > 0 else None
        if first[k] > 0 and parent is not None:
            followers.setdefault(parent, []).append(k)
        else:
            roots.append(k)
    ordered: list[int] = []
    stack = list(reversed(roots))
    while stack:  # each run, then the runs that go on from it (first turns rise along a chain: no cycle)
        k = stack.pop()
        ordered.append(k)
        stack.extend(reversed(followers.get(k, [])))
    return ordered


def runs_by_turn(runs: list[list[Row]], turn_of: Callable[[Row], int | None]) -> list[list[Row]]:
    """A conversation's runs (each its rows; the runs by start) in `chained_run_order` of their first and last turns."""
    if len(runs) < 2:
        return runs
    turns = [[t for row in run if (t := turn_of(row)) is not None] for run in runs]
    return [
        runs[k] for k in chained_run_order([min(t, default=-1) for t in turns], [max(t, default=-1) for t in turns])
    ]


def conversation_turns(store: Database, sample_id: str) -> list[Turn]:
    """Every turn of this sample's conversation, first turn first; [] when the sample is not a turn. A proxy
    session a restarted proxy went on with (its next turn the first of a later run) is one conversation, as
    `tokview export --trajectory` joins it, and so are a session's generations (an `n` > 1 request's choices, side
    by side at their turn: a harness may go on from any of them)."""
    rows = store.query(
        "SELECT o.sample_id, o.turn, o.settings, o.run_id, s.run_id, s.prompt_id, (SELECT min(f.positions[1]) FROM "
        "findings f WHERE f.sample_id = o.sample_id AND f.code = 'session_prefix_break') FROM samples s JOIN samples o "
        "ON o.prompt_id = s.prompt_id AND (o.gen_index IS NOT DISTINCT FROM s.gen_index "
        "OR starts_with(s.sample_id, 'proxy:')) "
        f"AND (o.run_id IS NOT DISTINCT FROM s.run_id OR {_A_PROXY_SESSION}) "
        "WHERE s.sample_id = ? AND s.turn IS NOT NULL AND o.turn IS NOT NULL "
        "ORDER BY min(o.created_at) OVER (PARTITION BY o.run_id), o.run_id, o.turn, o.sample_id",
        [sample_id],
    )
    runs: list[list[tuple[Any, ...]]] = []
    for row in rows:  # one list per run, oldest run first
        if not runs or runs[-1][0][3] != row[3]:
            runs.append([])
        runs[-1].append(row)
    if len(runs) > 1 and str(rows[0][5]).startswith(PROXY_SESSION_PREFIXES):  # by turn, not by clock
        runs = runs_by_turn(runs, lambda row: row[1])
    own = next((k for k, run in enumerate(runs) if run[0][3] == run[0][4]), None)
    if own is None:
        return []
    first = last = own
    prompt_id = str(rows[0][5])
    while first > 0 and goes_on_in_next_run(prompt_id, runs[first - 1][-1][1], runs[first][0][1]):
        first -= 1
    while last + 1 < len(runs) and goes_on_in_next_run(prompt_id, runs[last][-1][1], runs[last + 1][0][1]):
        last += 1
    return [_turn(row[0], row[1], row[2], row[6]) for run in runs[first : last + 1] for row in run]
