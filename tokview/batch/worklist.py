"""A batch's work, planned in one streamed pass over the prompts file and read again as it is taken.

A million-prompt file must not be held whole (its rows' messages took 1.6 GB). Planning reads it a
chunk at a time (`inputs.iter_checked`: the same checks, line numbers and duplicate/conflict rules
as `read_prompts`), counts every sample slot, the slots already stored, the rows that repeat an
earlier id and the bad rows, and keeps only the line numbers of the rows that still have work (12
bytes a row, with a checksum of the row's id). The capture loop takes its work from a `TodoQueue`,
which reads those rows again as the workers ask for them, so at most a chunk of rows and the
requests in flight are held at once. Sample ids and accounting are `runner.plan`'s exactly (tests
compare the two).

The ids already stored come from one query (`Store.stored_ids_with`) and planning needs no
tokenizer, so a fully stored run is known to have nothing to do after one read of the file
(`resume.py`).
"""

from __future__ import annotations

import gc
import json
import os
import zlib
from array import array
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from tokview.batch.chains import ChainItem
from tokview.batch.inputs import (
    CheckedRow,
    InputError,
    agent_mode_refusal,
    asked_digest,
    bad_message,
    check_prompts_path,
    checked_row,
    generation_turns,
    is_agent_trace,
    is_parquet,
    iter_checked_chunks,
    iter_rows_flagged,
    line_bytes,
    located,
    open_lines,
)
from tokview.core.prompts import PromptError, PromptRow, generation_points
from tokview.core.record import sample_head, sample_id_for, settings_key
from tokview.secrets import MASK

if TYPE_CHECKING:
    from tokview.batch.config import BatchConfig


@dataclass(frozen=True)
class WorkItem:
    sample_id: str
    prompt_id: str
    turn: int | None
    index: int
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None


@dataclass
class WorkList:
    """What a batch will do: counts for the summary, and the rows still to do (by line) for the queue."""

    planned: int = 0
    """Sample slots of the prompts (each id's first row; only this shard's with --shard)."""
    duplicates: int = 0
    """Sample slots of rows that repeat an earlier id with the same conversation."""
    bad: list[str] = field(default_factory=list)
    resumed: int = 0
    """Planned slots already in the store."""
    todo: int = 0
    key: str = ""
    samples_per_prompt: int = 1
    shard: tuple[int, int] | None = None
    path: Path | None = None
    rows: list[PromptRow] | None = None
    lines: array[int] = field(default_factory=lambda: array("q"))
    """Line numbers (or indexes into `rows`) of the first rows with at least one slot to do."""
    id_checks: array[int] = field(default_factory=lambda: array("L"))
    """crc32 of each of those rows as planning read it (a JSONL row: its whole line; a Parquet row: its
    prompt id): a row edited since planning is noticed, not generated, even when its id and the file's
    size stay the same."""
    stored: frozenset[str] | set[str] = frozenset()
    stored_digests: dict[str, int] | None = None
    """`asked_digest` of the messages each stored single-turn prompt was asked with, by prompt id: its row
    in the file now, under the same id, may say something else (`_changed_row`)."""
    changed: list[str] = field(default_factory=list)
    """The rows of this shard changed since they were stored (`_changed_row`): bad rows every shard says (the others
    only shard 1 says)."""
    file_state: tuple[int, int] | None = None
    chain_key: str | None = None
    """The settings key of a multi-turn row's turns regenerated as a chain (`--history served`: the key of
    the settings plus the history mode); None with `--history file`, whose turns keep `key` (today's ids)."""
    history_reasoning: str = "template"
    chain_left: int = 0
    """Slots of chains an earlier run stored only up to where they stopped: planned, not to do."""

    @property
    def input(self) -> int:
        return self.planned + self.duplicates + len(self.bad)

    def sample_ids(self, prompt_id: str, turns: list[int | None]) -> Iterator[tuple[int | None, int, str]]:
        """(turn, index, sample id) of a row's slots in this shard: `runner.plan`'s ids.

        A chain's turns go to the shard of its first turn: a chain is regenerated in one piece."""
        if self.is_chain(turns):
            for index in range(self.samples_per_prompt):
                ids = [f"{sample_head(prompt_id, turn)}@{self.chain_key}_gen{index}" for turn in turns]
                if self._in_shard(ids[0]):
                    yield from ((turn, index, sample_id) for turn, sample_id in zip(turns, ids, strict=True))
            return
        for turn in turns:
            head = sample_head(prompt_id, turn)
            for index in range(self.samples_per_prompt):
                sample_id = f"{head}@{self.key}_gen{index}"
                if self._in_shard(sample_id):
                    yield turn, index, sample_id

    def is_chain(self, turns: list[int | None]) -> bool:
        """Whether a row's turns are regenerated as a chain: a multi-turn row under `--history served`."""
        return self.chain_key is not None and bool(turns) and turns[0] is not None

    def _in_shard(self, sample_id: str) -> bool:
        return self.shard is None or zlib.crc32(sample_id.encode()) % self.shard[1] == self.shard[0] - 1

    def queue(self) -> TodoQueue:
        """The slots still to do, in file order, read from the file as they are taken."""
        if self.path is not None and _file_state(self.path) != self.file_state:
            raise InputError(f"{self.path} changed while the batch was planned: run the batch again")
        return TodoQueue(self)

    def todo_items(self) -> Iterator[WorkItem | ChainItem]:
        """Every slot still to do, in file order (the file read again, only the rows with work parsed)."""
        if self.rows is not None:
            for i in self.lines:
                yield from self._items(self.rows[i])
            return
        assert self.path is not None
        if not is_parquet(self.path):
            yield from self._jsonl_items(self.path)
            return
        wanted = zip(self.lines, self.id_checks)
        next_line, check = next(wanted, (None, 0))
        changed = InputError(f"{self.path} changed while the batch ran: run the batch again to resume")
        for n, obj, text in iter_rows_flagged(self.path):
            if next_line is None:
                return
            if n != next_line:
                continue
            try:
                row = checked_row(n, obj, text)
            except PromptError:
                raise changed from None
            if zlib.crc32(row.prompt_id.encode()) != check:
                raise changed
            yield from self._items(row)
            next_line, check = next(wanted, (None, 0))

    def _jsonl_items(self, path: Path) -> Iterator[WorkItem | ChainItem]:
        """The rows with work, each checked against the hash of the line planning read, then parsed
        as `inputs.iter_jsonl_fast` parses it (orjson, else the standard library's reader)."""
        changed = InputError(f"{path} changed while the batch ran: run the batch again to resume")
        wanted = zip(self.lines, self.id_checks)
        next_line, check = next(wanted, (None, 0))
        with open_lines(path) as fh:  # lines as `inputs.iter_jsonl_fast` numbers them
            lines = enumerate(fh, start=1)
            while next_line is not None:
                try:
                    n, text = next(lines)
                except StopIteration:
                    break
                if n != next_line:
                    continue
                if zlib.crc32(line_bytes(text)) != check:  # bytes that are not UTF-8 written since: changed too
                    raise changed
                try:
                    row = checked_row(n, *_parsed(text))
                except (PromptError, ValueError, RecursionError):
                    raise changed from None
                yield from self._items(row)
                next_line, check = next(wanted, (None, 0))
        if next_line is not None:
            raise changed  # the file got shorter

    def _items(self, row: PromptRow) -> Iterator[WorkItem | ChainItem]:
        points = generation_points(row)
        turns = [p.turn for p in points]
        if self.is_chain(turns):
            yield from self._chains(row, points)
            return
        histories = {p.turn: p.history for p in points}
        for turn, index, sample_id in self.sample_ids(row.prompt_id, turns):
            if sample_id not in self.stored:
                yield WorkItem(sample_id, row.prompt_id, turn, index, histories[turn], row.tools)

    def _chains(self, row: PromptRow, points: list[Any]) -> Iterator[ChainItem]:
        """One chain per generation index whose first turn is not stored (a stored first turn: done)."""
        at = {p.turn: p.at for p in points}
        slots: dict[int, list[tuple[int, int, str]]] = {}
        for turn, index, sample_id in self.sample_ids(row.prompt_id, [p.turn for p in points]):
            assert turn is not None
            slots.setdefault(index, []).append((turn, at[turn], sample_id))
        for index, turns in slots.items():
            if turns[0][2] not in self.stored:
                absent = sum(1 for turn in turns if turn[2] not in self.stored)
                yield ChainItem(
                    turns[0][2],
                    row.prompt_id,
                    index,
                    row.messages,
                    row.tools,
                    tuple(turns),
                    self.history_reasoning,
                    absent,
                )


class TodoQueue:
    """The work still to do, produced as it is taken: what `capture_all` pops (a deque's len/bool/popleft).

    With `--workers` every process takes from this one queue through the parent's feed (`workers.py`)."""

    def __init__(self, work: WorkList) -> None:
        self._work = work
        self._left = work.todo
        self._items: Iterator[WorkItem | ChainItem] | None = None

    def __len__(self) -> int:
        return self._left

    def __bool__(self) -> bool:
        return self._left > 0

    def popleft(self) -> WorkItem | ChainItem:
        if self._left <= 0:
            raise IndexError("pop from an empty TodoQueue")
        if self._items is None:
            self._items = self._work.todo_items()
        item = next(self._items, None)
        if item is None:
            self._left = 0
            raise InputError("the prompts file changed while the batch ran: run the batch again to resume")
        self._left -= item.todo if isinstance(item, ChainItem) else 1
        return item

    def __iter__(self) -> Iterator[WorkItem | ChainItem]:
        while self:
            yield self.popleft()


def plan_work(
    config: BatchConfig,
    settings: dict[str, Any],
    stored_ids: Callable[[str], set[str]],
    rows: list[PromptRow] | None = None,
    stored_prompts: Callable[[str, Callable[[str, str], None]], None] | None = None,
) -> WorkList:
    """Plan a batch: `rows` given (the app's), else `config.prompts_path` streamed.

    `stored_ids(fragment)` gives the stored sample ids that contain `fragment` (`@KEY_gen`, what
    every id of these settings holds): the resume anti-join, as one set. `stored_prompts(fragment, each)`
    (`Store.stored_prompts_with`) hands `each` the messages the stored single-turn samples were asked
    with, held against the file's rows (`_changed_row`)."""
    key = settings_key(settings)
    chain_key = settings_key(chain_settings(settings, config)) if config.history == "served" else None
    for turn in (None, 1):  # the one definition of a sample id stays core.record's
        if next(WorkList(key=key).sample_ids("p", [turn]))[2] != sample_id_for("p", settings, 0, turn):
            raise AssertionError("batch sample ids diverge from core.record.sample_id_for")
    work = WorkList(key=key, samples_per_prompt=config.samples_per_prompt, shard=config.shard, rows=rows)
    work.chain_key, work.history_reasoning = chain_key, config.history_reasoning
    if rows is None and config.prompts_path is None:
        raise InputError("no prompts: give a prompts file")
    path = None if rows is not None or config.prompts_path is None else check_prompts_path(config.prompts_path)
    if path is not None:
        work.path, work.file_state = path, _file_state(path)
    work.stored = stored_ids(f"@{key}_gen")
    if chain_key is not None:
        work.stored = {*work.stored, *stored_ids(f"@{chain_key}_gen")}
    if stored_prompts is not None and work.stored and path is not None:
        work.stored_digests = {}  # from every generation's messages: a shard may hold gen1 alone
        stored_prompts(f"@{key}_gen", _digesting(work.stored_digests))
    with gc_paused():  # ~35% of planning went to the cycle collector walking a chunk's fresh rows
        _plan_rows(work, config, path, rows)
    if path is not None and work.lines and not is_parquet(path):
        work.id_checks = _line_checks(path, work.lines)
    if config.shard is not None and config.shard[0] != 1:  # duplicate and bad rows are counted once, by shard 1
        work.duplicates, work.bad = 0, []
    work.bad += work.changed
    return work


def _digesting(out: dict[str, int]) -> Callable[[str, str], None]:
    """What puts `asked_digest` of a stored prompt's messages (~1 µs a prompt) in `out`, as a file row's is taken."""

    def digest(prompt_id: str, messages: str) -> None:
        if prompt_id in out:  # another generation of it: asked with the same messages
            return
        if MASK in messages:  # a credential in its text was masked as it was stored: nothing to compare it with
            return
        try:  # unreadable, or not a list as tokview stores messages: nothing to hold the row against
            parsed = orjson.loads(messages)
            if isinstance(parsed, list):
                out[prompt_id] = asked_digest(parsed)
        except (orjson.JSONDecodeError, PromptError):
            return

    return digest


def _plan_rows(work: WorkList, config: BatchConfig, path: Path | None, rows: list[PromptRow] | None) -> None:
    if rows is not None:
        seen: set[str] = set()
        for i, row in enumerate(rows):
            if is_agent_trace(row) and config.mode != "chat":
                work.bad.append(f"row {i + 1}: an agent trace needs --mode chat (--mode {config.mode} sends no tools)")
                continue
            _count(work, i, row.prompt_id, generation_turns(row.messages), row.prompt_id not in seen)
            seen.add(row.prompt_id)
    elif path is not None:
        simple = work.samples_per_prompt == 1 and work.shard is None
        tail, stored, lines, checks = f"@{work.key}_gen0", work.stored, work.lines, work.id_checks
        asked_before = work.stored_digests or {}
        label = "row" if is_parquet(path) else "line"
        for chunk in iter_checked_chunks(path, on_bad_row=config.on_bad_row, limit=config.limit, rows=False):
            for checked in chunk:
                if checked.bad is None and checked.agent:
                    checked.bad = agent_mode_refusal(checked, config.mode, label)
                if checked.bad is not None:
                    _bad_row(work, config, path, checked.bad)
                elif simple and checked.first and checked.turns == [None]:  # the usual row: `_count` inlined
                    if sample_head(checked.prompt_id, None) + tail in stored:
                        if asked_before.get(checked.prompt_id, checked.asked) != checked.asked:
                            _changed_row(work, config, path, checked, label)
                            continue
                        work.planned += 1
                        work.resumed += 1
                    else:
                        work.planned += 1
                        work.todo += 1
                        lines.append(checked.line)
                        checks.append(zlib.crc32(checked.prompt_id.encode()))
                else:
                    asked = checked.asked  # None: no single-turn row, whose samples are not held against it
                    if (
                        asked is not None
                        and checked.first
                        and asked_before.get(checked.prompt_id, asked) != asked
                        and next(work.sample_ids(checked.prompt_id, checked.turns), None) is not None  # this shard's
                    ):
                        _changed_row(work, config, path, checked, label)
                        continue
                    _count(work, checked.line, checked.prompt_id, checked.turns, checked.first)


def _changed_row(work: WorkList, config: BatchConfig, path: Path, checked: CheckedRow, label: str) -> None:
    """A single-turn row whose samples are stored is not resumed when its messages are not those they were asked with
    (`WorkList.stored_digests`: the row was edited under its id, or an older tokview read it otherwise, a `system`
    beside its messages): a bad row, never taken as done, as its stored samples answer the old text."""
    where = checked.line
    message = bad_message(
        f"line {where}: changed since it was stored: the samples stored under its id {json.dumps(checked.prompt_id)}"
        " were asked with other messages (a changed row is never taken as done: give it a new id to ask it, or use "
        "another --db)",
        where,
        label,
    )
    _bad_row(work, config, path, message, changed=True)


def _bad_row(work: WorkList, config: BatchConfig, path: Path, message: str, *, changed: bool = False) -> None:
    """A row planning refuses (an agent trace outside chat mode, a row `changed` since it was stored: kept apart, as
    every shard says its own): skipped, or with `--on-bad-row stop` the end of the run before anything is asked, as a
    row the checks refuse is."""
    if config.on_bad_row == "stop":
        raise InputError(f"{located(path, message)} (use --on-bad-row skip to skip bad rows)")
    (work.changed if changed else work.bad).append(message)


def _count(work: WorkList, where: int, prompt_id: str, turns: list[int | None], first: bool) -> None:
    """Add one row's slots to the plan (the usual one-slot row is counted inline by `_plan_rows`)."""
    if not first:
        work.duplicates += len(turns) * work.samples_per_prompt
        return
    if work.is_chain(turns):
        _count_chains(work, where, prompt_id, turns)
        return
    stored = work.stored
    planned = to_do = 0
    for _turn, _index, sample_id in work.sample_ids(prompt_id, turns):
        planned += 1
        to_do += sample_id not in stored
    work.planned += planned
    work.resumed += planned - to_do
    if to_do:
        work.todo += to_do
        work.lines.append(where)
        work.id_checks.append(zlib.crc32(prompt_id.encode()))


def chain_settings(settings: dict[str, Any], config: BatchConfig) -> dict[str, Any]:
    """The settings a chain's sample ids hash: the run's plus how its history was made."""
    return {**settings, "history": "served", "history_reasoning": config.history_reasoning}


def _count_chains(work: WorkList, where: int, prompt_id: str, turns: list[int | None]) -> None:
    """A multi-turn row's chains: one to do per generation index whose first turn is not stored (chains
    are written whole, so a stored first turn means the chain ended; its absent turns stopped)."""
    chains: dict[int, list[str]] = {}
    for _turn, index, sample_id in work.sample_ids(prompt_id, turns):
        chains.setdefault(index, []).append(sample_id)
    stored, to_do = work.stored, 0
    for sample_ids in chains.values():
        absent = sum(1 for sample_id in sample_ids if sample_id not in stored)
        work.planned += len(sample_ids)
        work.resumed += len(sample_ids) - absent
        if sample_ids[0] in stored:
            work.chain_left += absent
        else:
            to_do += absent
    if to_do:
        work.todo += to_do
        work.lines.append(where)
        work.id_checks.append(zlib.crc32(prompt_id.encode()))


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection inside: the rows read here hold no cycles and die with their chunk."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _line_checks(path: Path, lines: array[int]) -> array[int]:
    """crc32 of each of `lines` (ascending) as text, read the way the planner and `_jsonl_items` read them.

    A second pass over the file, after planning (`queue()` refuses a file whose size or mtime moved
    since planning began, so both passes read the same bytes): the planner's reader keeps no text."""
    checks = array("L")
    wanted = iter(lines)
    next_line = next(wanted, None)
    with open_lines(path) as fh:
        for n, text in enumerate(fh, start=1):
            if n == next_line:
                checks.append(zlib.crc32(line_bytes(text)))
                next_line = next(wanted, None)
                if next_line is None:
                    break
    return checks


def _parsed(text: str) -> tuple[Any, str | None]:
    """(object, the text when orjson read it): `iter_jsonl_fast`'s entry for one line."""
    try:
        return orjson.loads(text), text
    except orjson.JSONDecodeError:
        return json.loads(text), None


def _file_state(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns
