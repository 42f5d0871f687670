"""`--format trajectory` (`--trajectory`): one row per conversation, the whole conversation as served.

A conversation is the selection's samples of one run, prompt_id and generation index in turn order
(`store.export_rows.conversation_turns`): a `tokview proxy` session (prompt_id = the session id) or a
`tokview batch` chain. Its row is speculators' shape (`input_ids`, `loss_mask`): the first turn's prompt
and output, then for each next turn the ids its prompt adds after the previous turn's prompt + output
(the tool results, the next user turn, the next assistant header) with mask 0, and its output with mask 1
(reasoning, calls and stop: everything the model generated). That is exact only while each turn's prompt
extends the previous turn's prompt + output ids; where one does not (the harness re-rendered its history:
reasoning dropped, arguments re-serialised, call ids renumbered; or a turn is not in the selection; or it
continues a turn another turn continued already, a branch), the conversation is split there and the next row
starts at that turn: the manifest's `trajectory` section counts the splits and says where each one is (turn,
position of the first differing id) and why. No id is
re-derived: every row is concatenated served ids, so no trainer path re-tokenizes anything.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tokview.core.json_value import strict_json_line
from tokview.core.profiles import ModelProfile
from tokview.core.record import Capture
from tokview.core.tool_calls import call_count
from tokview.export.output import Plan, open_stream
from tokview.export.row_shapes import RowShapes
from tokview.store import Store, export_rows
from tokview.store.conversation_turns import goes_on_in_next_run
from tokview.store.sample_rows import capture_from_row

if TYPE_CHECKING:
    from tokview.export.registry import ProfileOf

MAX_LISTED_BREAKS = 20
"""Breaks listed one by one in the manifest (all are counted)."""


@dataclass
class _Row:
    """One trajectory row under construction: the served ids so far and where each turn's output sits."""

    conversation: str
    run_id: str | None
    first_turn: int | None
    split_from: dict[str, Any] | None = None
    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: int = 0

    def add(self, turn: int | None, sample_id: str, capture: Capture, calls: int) -> None:
        new_prompt = capture.prompt_ids[len(self.input_ids) :]
        self.input_ids += new_prompt
        self.loss_mask += [0] * len(new_prompt)
        start = len(self.input_ids)
        self.input_ids += capture.output_ids
        self.loss_mask += [1] * len(capture.output_ids)
        self.tool_calls += calls
        self.turns.append(
            {
                "turn": turn,
                "sample_id": sample_id,
                "output_span": [start, len(self.input_ids)],
                "finish_reason": capture.finish_reason,
            }
        )


@dataclass
class Trajectories:
    """What the rows were made of, for the manifest's `trajectory` section."""

    conversations: int = 0
    rows: int = 0
    turns: int = 0
    split_conversations: int = 0
    late_starts: int = 0
    """Of those, conversations whose first row starts after turn 0 (said as a `turn_missing` break at position 0):
    one row each, unless they break again. "5 split at 6 breaks" read as five conversations in pieces, for one."""
    breaks: list[dict[str, Any]] = field(default_factory=list)
    row_lengths: list[int] = field(default_factory=list)
    shapes: RowShapes | None = None
    """The written rows' shapes (`export.row_shapes`): a regular file's are moved first, a stream's warned of."""

    def section(self) -> dict[str, Any]:
        by_reason: dict[str, int] = {}
        for b in self.breaks:
            by_reason[b["reason"]] = by_reason.get(b["reason"], 0) + 1
        return {
            "conversations": self.conversations,
            "rows": self.rows,
            "turns": self.turns,
            "on_break": "split: the row ends before the turn whose prompt does not extend the previous turn's "
            "prompt + output ids, and the next row starts at that turn with its whole prompt (mask 0)",
            "split_conversations": self.split_conversations,
            "late_starts": self.late_starts,
            "breaks": len(self.breaks),
            "breaks_by_reason": dict(sorted(by_reason.items())),
            "first_breaks": self.breaks[:MAX_LISTED_BREAKS],
        }


def extends(previous: list[int], prompt: list[int]) -> int | None:
    """None when `prompt` begins with `previous`, else the first position where they differ."""
    if prompt[: len(previous)] == previous:
        return None
    for at, (a, b) in enumerate(zip(previous, prompt)):
        if a != b:
            return at
    return min(len(previous), len(prompt))


ROWS_READ_AT_ONCE = 256


def _rows_in_turn_order(
    store: Store, keys: list[export_rows.ConversationKey]
) -> Iterator[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Each selected turn's key and stored row, conversation by conversation, read ROWS_READ_AT_ONCE at a time: an
    agent trace's prompts grow with every turn (its stored ids grow with turns squared), so a store's whole
    selection read up front was a proxy store's size in memory before the first row was written."""
    for start in range(0, len(keys), ROWS_READ_AT_ONCE):
        chunk = keys[start : start + ROWS_READ_AT_ONCE]
        rows = {row["sample_id"]: row for row in store.rows_for([k[3] for k in chunk])}
        for key in chunk:
            yield key, rows[key[3]]


def build(
    store: Store, keys: list[export_rows.ConversationKey], profile_of: ProfileOf, summary: Trajectories
) -> Iterator[_Row]:
    """Every row of the selected conversations, in order (a split conversation's later rows say where).

    A conversation's rows stay open while it lasts (`_Open`): each turn goes on with the row whose ids its prompt
    extends, so a branch (two turns continuing one turn: a retry kept, a harness that went on twice) is a row of its
    own and each branch's next turns go on with their own row. Compared only with the newest row, a branch's later
    turns were split off as breaks they were not."""
    conversation: tuple[str | None, str, int] | None = None
    rows: _Open | None = None
    previous_turn: int | None = None
    for key, row in _rows_in_turn_order(store, keys):
        run_id, prompt_id, gen_index, sample_id, turn = key
        capture = capture_from_row(row)
        prof: ModelProfile = profile_of(row["profile"])
        calls = call_count(capture.output_ids, prof)
        name = conversation_name(prompt_id, gen_index)
        summary.turns += 1
        newest = rows.rows[-1] if rows is not None and rows.rows else None
        if (run_id, prompt_id, gen_index) != conversation and _continued(conversation, newest, previous_turn, key):
            conversation = (run_id, prompt_id, gen_index)  # a proxy restarted mid-session: its next run goes on
        if (run_id, prompt_id, gen_index) != conversation:
            if rows is not None:
                yield from rows.close()
            conversation, previous_turn = (run_id, prompt_id, gen_index), turn
            summary.conversations += 1
            split = None
            if turn:  # its first turns are not in the selection (rejected, failed): said like any other gap
                split = {"conversation": name, "run": run_id, "turn": turn, "position": 0, "reason": "turn_missing"}
                summary.breaks.append(split)
                summary.split_conversations += 1
                summary.late_starts += 1
            rows = _Open(name, summary, split is not None)
            yield from rows.start(run_id, turn, split, sample_id, capture, calls)
            continue
        assert rows is not None
        previous_turn = turn
        yield from rows.take(run_id, turn, sample_id, capture, calls)
    if rows is not None:
        yield from rows.close()


MAX_OPEN_ROWS = 8
"""Rows of one conversation a next turn may go on with (its branches); past that the oldest is written."""


class _Open:
    """The open rows of one conversation, oldest first, and where its next turn goes."""

    def __init__(self, name: str, summary: Trajectories, split: bool) -> None:
        self.name, self.summary, self.split = name, summary, split
        self.rows: list[_Row] = []

    def start(
        self,
        run_id: str | None,
        turn: int | None,
        split: dict[str, Any] | None,
        sample_id: str,
        capture: Capture,
        calls: int,
    ) -> Iterator[_Row]:
        row = _Row(self.name, run_id, turn, split)
        row.add(turn, sample_id, capture, calls)
        self.rows.append(row)
        if len(self.rows) > MAX_OPEN_ROWS:
            yield self.rows.pop(0)

    def take(
        self, run_id: str | None, turn: int | None, sample_id: str, capture: Capture, calls: int
    ) -> Iterator[_Row]:
        """Add the turn to the row it goes on with, else start a row at it, saying why (`_why_not`)."""
        prompt = capture.prompt_ids
        extended = [r for r in self.rows if extends(r.input_ids, prompt) is None]
        row = max(extended, key=lambda r: len(r.input_ids)) if extended else None  # the latest of equals
        if row is not None and _next_turn(row, turn):
            row.add(turn, sample_id, capture, calls)
            return
        reason, at = self._why_not(turn, prompt)
        if row is not None and reason != "branch":  # a retry of a turn another row holds is a branch all the same
            reason, at = "turn_missing", len(row.input_ids)
        split = {"conversation": self.name, "run": run_id, "turn": turn, "position": at, "reason": reason}
        self.summary.breaks.append(split)
        self.summary.split_conversations += not self.split  # the conversation's first break
        self.split = True
        yield from self.start(run_id, turn, split, sample_id, capture, calls)

    def _why_not(self, turn: int | None, prompt: list[int]) -> tuple[str, int]:
        """Why a turn extends no open row: it continues an earlier turn of one that another turn continued already,
        or answers the prompt one of its turns answered (`branch`, at the end of that earlier turn's output, or
        where the other answer starts), or its prompt differs from the previous turn's prompt + output
        ids (`prompt_does_not_extend`, where: the previous turn's in whichever row holds it, its last turn or not, as
        for a side request built on a turn its main loop went on from), or the turn before it is not in the selection
        (`turn_missing`)."""
        for row in reversed(self.rows):
            for k, placed in reversed(list(enumerate(row.turns))):
                start, end = placed["output_span"]
                if (
                    k < len(row.turns) - 1
                    and _next_turn_of(placed["turn"], turn)
                    and prompt[:end] == row.input_ids[:end]
                ):
                    return "branch", end
                if placed["turn"] == turn and prompt == row.input_ids[:start]:  # another answer to the same prompt
                    return "branch", start  # (an `n` > 1 request's next choice, a retry): turn 0's too
        before = [r for r in self.rows if _next_turn(r, turn)]
        if before:
            at = extends(before[-1].input_ids, prompt)
            return "prompt_does_not_extend", at if at is not None else len(before[-1].input_ids)
        if turn is not None:  # the turn before is in a row another turn went on from: compared up to its output's end
            for row in reversed(self.rows):
                for placed in reversed(row.turns[:-1]):
                    if _next_turn_of(placed["turn"], turn):
                        end = placed["output_span"][1]
                        at = extends(row.input_ids[:end], prompt)
                        return "prompt_does_not_extend", at if at is not None else end
        newest = self.rows[-1]
        at = extends(newest.input_ids, prompt)
        return "turn_missing", len(newest.input_ids) if at is None else at

    def close(self) -> Iterator[_Row]:
        yield from self.rows
        self.rows = []


def _next_turn(row: _Row, turn: int | None) -> bool:
    """Whether `turn` is the one after the row's last (turns without an index go on with any)."""
    return _next_turn_of(row.turns[-1]["turn"], turn)


def _next_turn_of(last: int | None, turn: int | None) -> bool:
    return last is None or turn is None or turn == last + 1


def _continued(
    conversation: tuple[str | None, str, int] | None,
    current: _Row | None,
    previous_turn: int | None,
    key: tuple[Any, ...],
) -> bool:
    """Whether this turn of another run goes on with the row so far: the same conversation (prompt id and
    generation) going on in its next run (`goes_on_in_next_run`: a proxy session a restarted proxy restored)."""
    _, prompt_id, gen_index, _, turn = key
    return (
        conversation is not None
        and current is not None
        and conversation[1:] == (prompt_id, gen_index)
        and goes_on_in_next_run(prompt_id, previous_turn, turn)
    )


def conversation_name(prompt_id: str, gen_index: int) -> str:
    """A conversation's row id before its run (`@run`) and split (`_from_turnN`) marks."""
    return f"{prompt_id}_gen{gen_index}"


def bare_id_runs(keys: list[export_rows.ConversationKey]) -> dict[str, str | None]:
    """The run whose row of each conversation name gets the bare id: the first by name, as `formats.row_ids` gives
    it in every other format (the oldest run had it, so a store whose run names do not sort by start gave one
    `p_gen0` two samples: the trajectory's and the speculators export's)."""
    owner: dict[str, str | None] = {}
    for run_id, prompt_id, gen_index, _, _ in keys:
        name = conversation_name(prompt_id, gen_index)
        if name not in owner or (run_id or "") < (owner[name] or ""):
            owner[name] = run_id
    return owner


def _unique(row_id: str, used: set[str]) -> str:
    """`row_id`, or with the first free `_2`, `_3`, … when a row before had it: trainers key rows by id."""
    unique, n = row_id, 1
    while unique in used:
        n += 1
        unique = f"{row_id}_{n}"
    used.add(unique)
    return unique


def trajectory_row(row: _Row, row_id: str) -> dict[str, Any]:
    return {
        "id": row_id,
        "primary_id": row.conversation,
        "input_ids": row.input_ids,
        "loss_mask": row.loss_mask,
        "metadata": {
            "turns": row.turns,
            "first_turn": row.first_turn,
            "is_tool_call": row.tool_calls > 0,
            "tool_calls": row.tool_calls,
            "split_from": row.split_from,
        },
    }


def write_trajectories(
    store: Store, exported: list[tuple[str, str]], plan: Plan, profile_of: ProfileOf
) -> Trajectories:
    """The trajectory JSONL of the exported samples (each turn already passed the per-sample checks)."""
    summary = Trajectories()
    keys = export_rows.conversation_turns(store, [e[0] for e in exported])
    bare = bare_id_runs(keys)
    used: set[str] = set()
    summary.shapes = RowShapes()
    fh = open(plan.data.temp, "wb") if plan.data else open_stream(plan)  # noqa: SIM115 (closed below)
    try:
        for row in build(store, keys, profile_of, summary):
            row_id = row.conversation if bare[row.conversation] == row.run_id else f"{row.conversation}@{row.run_id}"
            if row.split_from is not None:
                row_id += f"_from_turn{row.first_turn}" if row.first_turn is not None else "_split"
            row_id = _unique(row_id, used)  # one turn stored twice (a retry kept in its session) splits there twice
            summary.rows += 1
            summary.row_lengths.append(len(row.input_ids))
            record = trajectory_row(row, row_id)
            line = strict_json_line(record)
            fh.write(line)
            if summary.shapes is not None:
                summary.shapes.note(record, len(line))
    finally:
        fh.close()
    return summary
