"""Prompt files in, prompt rows out: JSONL or Parquet, every shape `tokview.core.prompts` reads.

A row that is not valid JSON, not a known shape, or holds something a server or the store would
choke on later (a number or an object as message content, a lone UTF-16 surrogate, a control
character in its id, an id already used by a different conversation) is reported with its line
number (Parquet: its row number) and either skipped or made fatal (`--on-bad-row skip|stop`), so one
bad line in a million never silently shifts what was generated, nor turns into a puzzling error
deep inside the chat template.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import sys
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import orjson

from tokview.batch.seen_ids import SeenIds
from tokview.core.prompts import (
    REASONING_KEYS,
    ROLE_FROM_SHAREGPT,
    PromptError,
    PromptRow,
    generated_turns,
    generation_points,
    iter_jsonl,
    json_error,
    kind_of,
    parse_row,
)
from tokview.errors import TokviewError, first_line
from tokview.untrusted_text import not_utf8, printable_line

PARQUET_SUFFIXES = (".parquet", ".pq")
CHUNK_ROWS = 8192
"""Rows parsed and checked together: what a batch holds of the prompts file at once while planning."""


class InputError(TokviewError):
    """The prompts file cannot be read, or a bad row with `--on-bad-row stop`."""

    title = "input"


def is_parquet(path: Path) -> bool:
    return path.suffix.lower() in PARQUET_SUFFIXES


def iter_rows(path: str | Path) -> Iterator[tuple[int, Any]]:
    """(line or row number, parsed row) of a JSONL or Parquet file, chosen by its suffix.

    The one reader for every command that takes a dataset (batch prompts, audit): a JSONL line that
    is not JSON comes back as a `PromptError` in place of the row, so callers report it and go on.
    """
    path = Path(path)
    return iter_parquet(path) if is_parquet(path) else iter_jsonl(path)


def iter_parquet(path: Path) -> Iterator[tuple[int, Any]]:
    """Rows of a Parquet file as dicts, numbered from 1; a JSON-string `messages` column is parsed."""
    import duckdb  # DuckDB's own Parquet reader: no pyarrow needed

    con = duckdb.connect()
    try:
        cur = con.execute("SELECT * FROM read_parquet(?)", [str(path)])
    except duckdb.Error as exc:
        raise InputError(f"cannot read {path} as Parquet: {first_line(exc)}") from None
    names = [d[0] for d in cur.description]
    n = 0
    while batch := cur.fetchmany(1000):
        for values in batch:
            n += 1
            # a null column is a key this row has not: Parquet has no absent keys, and a row known by its hash kept
            # the nulls of every column the file has (another row's `id` column gave it another id, a second sample)
            row = {name: without_nulls(value) for name, value in zip(names, values) if value is not None}
            for key in ("messages", "conversations"):  # a JSON string column holding the turns
                if isinstance(row.get(key), str) and row[key].lstrip().startswith("["):
                    try:
                        row[key] = json.loads(row[key])
                    except json.JSONDecodeError:
                        pass
            yield n, row
    con.close()


def without_nulls(value: Any) -> Any:
    """A Parquet value without the null fields of its structs, at every depth. A struct column holds the union of
    every row's keys, the ones a row has not as null: a `tools` list read from Parquet declared each other row's
    parameters as `"zone": null` in every prompt (28 ids more, and a model that called them), and a call's object
    arguments rendered `{"city": "Paris", "zone": null}`. Parquet cannot say a null given from a key absent, so a
    null field is read as absent; a null item of a list stays (it holds its place)."""
    if isinstance(value, dict):
        return {key: without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [without_nulls(item) for item in value]
    return value


UNREAD_CONTENT_KEYS = ("system_prompt", "image", "images", "audio", "video")
"""Fields that hold part of a prompt which no reader here sends: a row with `system_prompt` was generated without its
system turn, a LLaVA row's `image` as text only, each stored as a good sample of another prompt (`check_row`)."""


def check_row(raw: dict[str, Any], where: str) -> None:
    """What `parse_row` lets through but a template, a tokenizer or `tokview show` cannot take.

    Raised here, with the line number, instead of as `'int' object is not iterable` from the chat
    template, a `TextEncodeInput` TypeError from the tokenizer, or an empty prompt stored as a good
    sample (an object as content renders as nothing), or a prompt sent without a part the row holds.
    """
    _check_unread(raw, where)
    rid = raw.get("id")
    if rid is not None:
        if isinstance(rid, float):  # pandas writes an integer column with a missing value as floats: 1.0
            raise PromptError(
                f"{where}: `id` must be a string or a whole number, not the decimal {rid!r} (an integer column with "
                "a missing value is written as decimals: write the ids as integers or strings)"
            )
        if isinstance(rid, bool) or not isinstance(rid, (str, int)):
            raise PromptError(f"{where}: `id` must be a string or a whole number, not {_kind(rid)}")
        bad = next((c for c in str(rid) if unicodedata.category(c) in ("Cc", "Cs")), None)
        if bad is not None:
            raise PromptError(
                f"{where}: `id` holds the control character U+{ord(bad):04X}: "
                f"a sample id must be printable to be addressed by `tokview show`"
            )
    turns = raw.get("messages") if isinstance(raw.get("messages"), list) else raw.get("conversations")
    for k, turn in enumerate(turns if isinstance(turns, list) else []):
        if not isinstance(turn, dict):
            continue  # parse_row says so
        here = f"{where}: message {k + 1}"
        key = "value" if ("from" in turn or "value" in turn) else "content"
        _check_content(turn.get(key), f"{here} `{key}`")
        role = ROLE_FROM_SHAREGPT.get(str(turn.get("from", "")).lower()) if key == "value" else turn.get("role")
        if role == "user":
            _check_not_blank(turn.get(key), f"{here} (a user turn)")
        for rkey in REASONING_KEYS:
            value = turn.get(rkey)
            if value is not None and not isinstance(value, str):
                raise PromptError(f"{here} `{rkey}` must be a string, not {_kind(value)}")
    if not isinstance(turns, list) and isinstance(raw.get("prompt"), str):
        _check_not_blank(raw["prompt"], f"{where}: `prompt` (the user turn)")
    for key in ("id", "messages", "conversations", "prompt", "system", "tools"):  # what becomes the prompt or its id
        _check_text(raw.get(key), where)


def _check_not_blank(content: object, here: str) -> None:
    """A user turn (or `prompt`) with no text: a question lost on its way into the file (an extraction that found
    nothing). Sent, the model answers an empty request and the sample passes every check. Empty assistant, tool and
    system turns are kept (a call's empty content, a tool that printed nothing)."""
    if isinstance(content, list):
        content = "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    if isinstance(content, str) and not content.strip():
        raise PromptError(f"{here} has no text: a user turn must not be empty (a question lost on its way in?)")


def _check_unread(raw: dict[str, Any], where: str) -> None:
    """A row holding prompt content in a field no reader sends (`UNREAD_CONTENT_KEYS`) is refused, as an image part
    is: sent without it, the answer is to another prompt. A `system_prompt` beside a system turn already there is
    left alone (the turn is what is sent)."""
    for key in UNREAD_CONTENT_KEYS:
        if raw.get(key) in (None, "", [], {}):
            continue
        if key == "system_prompt":
            turns = raw.get("messages") if isinstance(raw.get("messages"), list) else raw.get("conversations")
            roles = {
                str(t.get("role") or ROLE_FROM_SHAREGPT.get(str(t.get("from", "")).lower()))
                for t in (turns if isinstance(turns, list) else [])
                if isinstance(t, dict)
            }
            if "system" in roles or (isinstance(raw.get("system"), str) and "prompt" in raw):
                continue
            raise PromptError(
                f"{where}: `system_prompt` is not read, so the prompt would go without it: give it as the "
                'conversation\'s first turn ({"role": "system", …}), or as `system` beside `prompt`'
            )
        raise PromptError(
            f"{where}: `{key}` is not sent (tokview sends text only), so the prompt would go without it: leave the "
            "row out, or drop the field if the text stands alone"
        )


def _check_content(content: object, here: str) -> None:
    if content is None or isinstance(content, str):
        return
    if isinstance(content, list):  # OpenAI content parts: text parts only
        for j, part in enumerate(content, start=1):
            if not isinstance(part, dict):
                raise PromptError(
                    f'{here}: part {j} is {_kind(part)}, expected an object like {{"type": "text", "text": "..."}}'
                )
            if not isinstance(part.get("text"), str):
                kind = part.get("type", "untyped")
                raise PromptError(
                    f"{here}: part {j} ({kind}) has no text string: only text parts are "
                    f"supported, and dropping the others would change the prompt"
                )
        return
    raise PromptError(f"{here} must be a string or a list of text parts, not {_kind(content)}")


def _check_text(value: object, where: str) -> None:
    """Every string must encode as UTF-8: a lone surrogate (`\\ud800` in JSON) cannot be tokenized."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise PromptError(
                f"{where}: a lone UTF-16 surrogate U+{ord(value[exc.start]):04X} "
                f"(an unpaired \\u escape) cannot be tokenized"
            ) from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_text(k, where)
            _check_text(v, where)
    elif isinstance(value, list):
        for v in value:
            _check_text(v, where)


_kind = kind_of


def parse_checked(obj: object, n: int, label: str = "line") -> PromptRow:
    """`parse_row` plus `check_row`: the prompt row, or a PromptError that names the line."""
    if isinstance(obj, PromptError):
        raise obj
    if isinstance(obj, dict):
        check_row(obj, f"line {n}")
    return parse_row(obj, line=n)


def read_prompts(
    path: str | Path, *, on_bad_row: str = "skip", limit: int | None = None
) -> tuple[list[PromptRow], list[str]]:
    """(good rows, one message per bad row). With on_bad_row="stop" the first bad row raises.

    A row whose id an earlier row already used for a *different* conversation is a bad row (a
    conflict: which one is meant?); the same id with the same conversation stays a plain duplicate,
    which the planner counts and skips. An empty or blank-only file is an error, not a run of 0.
    Holds every row: a batch streams the file instead (`iter_checked`, `batch/worklist.py`).
    """
    rows: list[PromptRow] = []
    bad: list[str] = []
    for checked in iter_checked(path, on_bad_row=on_bad_row, limit=limit):
        if checked.row is not None:
            rows.append(checked.row)
        else:
            bad.append(checked.bad or "")
    return rows, bad


@dataclass(slots=True)
class CheckedRow:
    """One input row after the checks: its prompt id and generation turns (`first`: the id's first good
    row), the parsed row when asked for, or why it is bad (`bad`)."""

    line: int
    prompt_id: str
    turns: list[int | None]
    row: PromptRow | None = None
    bad: str | None = None
    first: bool = True
    agent: bool = False
    """The row is an agent trace (`tools`, `tool_calls` or tool results): only the chat path sends those."""
    asked: int | None = None
    """A single-turn row's `asked_digest` of the messages its samples are asked with (its generation point's history:
    without a last assistant turn to regenerate), as a sample stores them: a resume holds it against its stored
    samples' (`WorkList.changed_row`), since a row may change under its id. None for other rows."""


def check_prompts_path(path: str | Path) -> Path:
    """The prompts file, or InputError when it is a directory, missing or empty (checked before anything else)."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"prompts file is a directory: {path}")
    if path.exists() and not path.is_file():  # /dev/null, a FIFO: read more than once, so a file it must be
        raise InputError(
            f"prompts file {path} is not a regular file ({_file_kind(path)}): give a JSONL or Parquet file"
        )
    if not path.is_file():
        raise InputError(f"prompts file not found: {path}")
    if not os.access(path, os.R_OK):  # read lazily, deep in the run: say it here, in one line
        raise InputError(f"cannot read the prompts file {path}: permission denied")
    if not is_parquet(path):
        refuse_other_shapes(path)
        try:
            with path.open("r", encoding="utf-8-sig") as fh:
                if not any(line.strip() for line in fh):
                    raise InputError(f"{path} holds no prompt rows (the file is empty or has only blank lines)")
        except UnicodeDecodeError:
            pass  # said with the line's context when the file is read
    return path


_PACKED = ((b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"BZh", "bzip2"), (b"\xfd7zXZ", "xz"))
"""Magic bytes of the compressions a dataset is shipped in."""


def refuse_other_shapes(path: Path) -> None:
    """InputError for a JSONL-named file that is something else, read by its first bytes: each line of it was a bad
    row (exit 4, read by scripts as a finished run; `audit` listed 20 "not valid JSON" lines). A compressed file, a
    Parquet file without its suffix, a JSON array (a ShareGPT or Alpaca `.json` dump: an indented array, or one
    array on one line; a JSONL file whose first row alone is an array keeps it as a bad row). A pipe is not read
    ahead (its bytes would be gone)."""
    if not path.is_file():
        return
    quoted = shlex.quote(str(path))
    with path.open("rb") as fh:
        head = fh.read(6)
    for magic, kind in _PACKED:
        if head.startswith(magic):
            raise InputError(
                f"{path} is {kind}-compressed, not JSONL text: decompress it first (e.g. `{_UNPACK[kind]} {quoted}`)"
            )
    if head.startswith(b"PAR1"):
        raise InputError(f"{path} is a Parquet file: give it a .parquet suffix (a file is read by its suffix)")
    try:
        with path.open("r", encoding="utf-8-sig") as fh:
            lines = (line.strip() for line in fh if line.strip())
            first, second = next(lines, None), next(lines, None)
    except UnicodeDecodeError:
        return  # said with the line's context when the file is read
    if first is not None and (first == "[" or (first.startswith("[") and (second is None or first.endswith(",")))):
        raise InputError(
            f"{path} is a JSON array, not JSONL (one JSON object per line): convert it, e.g. "
            f"`jq -c '.[]' {quoted} > rows.jsonl`"
        )


_UNPACK = {"gzip": "gunzip -k", "zstd": "zstd -d", "bzip2": "bunzip2 -k", "xz": "unxz -k"}


def _file_kind(path: Path) -> str:
    mode = path.stat().st_mode
    for test, name in ((stat.S_ISCHR, "a character device"), (stat.S_ISFIFO, "a pipe"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a device"


def iter_checked(
    path: str | Path,
    *,
    on_bad_row: str = "skip",
    limit: int | None = None,
    rows: bool = True,
    chunk: int | None = None,
) -> Iterator[CheckedRow]:
    """Every row of a prompts file in order, checked, parsed and de-duplicated, `chunk` rows at a time.

    What `read_prompts` reports, in a bounded memory: ids are remembered by a 64-bit hash with their
    first line and a digest of their conversation (`SeenIds`), never as rows. `rows=False` leaves
    out the parsed rows where the checks do without them (planning needs only ids and turns).
    Raises InputError for an unreadable or empty file and, with on_bad_row="stop", at the first bad
    row, before any later row is yielded.
    """
    for checked in iter_checked_chunks(path, on_bad_row=on_bad_row, limit=limit, rows=rows, chunk=chunk):
        yield from checked


def iter_checked_chunks(
    path: str | Path,
    *,
    on_bad_row: str = "skip",
    limit: int | None = None,
    rows: bool = True,
    chunk: int | None = None,
) -> Iterator[list[CheckedRow]]:
    """`iter_checked`, a chunk (a list) at a time: what the planner's hot loop walks."""
    path = check_prompts_path(path)
    label = "row" if is_parquet(path) else "line"
    seen = SeenIds()
    count = 0
    pending: list[tuple[int, Any, str | None]] = []
    size = chunk or CHUNK_ROWS
    try:
        for entry in iter_rows_flagged(path):
            if limit is not None and count >= limit:
                break
            count += 1
            pending.append(entry)
            if len(pending) >= size:
                yield _check_chunk(path, pending, seen=seen, label=label, want_rows=rows, on_bad_row=on_bad_row)
                pending = []
        yield _check_chunk(path, pending, seen=seen, label=label, want_rows=rows, on_bad_row=on_bad_row)
    except UnicodeDecodeError:
        raise InputError(f"{path} is not UTF-8 text (JSONL expected; Parquet files need a .parquet name)") from None
    if count == 0:
        raise InputError(f"{path} holds no prompt rows (the file is empty or has only blank lines)")


_TAKEN = (0, None, None)


def _check_chunk(
    path: Path,
    pending: list[tuple[int, Any, str | None]],
    *,
    seen: SeenIds,
    label: str,
    want_rows: bool,
    on_bad_row: str,
) -> list[CheckedRow]:
    """Parse and check a chunk row by row, then settle its ids against every earlier row's at once."""
    out: list[CheckedRow] = []
    keys: list[int] = []
    digests: list[int] = []
    lines: list[int] = []
    for i, (n, obj, text) in enumerate(pending):
        pending[i] = _TAKEN  # a 50 MB line's text and object go as soon as it is checked, not with the chunk
        quick = _fast_scan(obj) if text is not None and not want_rows else None
        if quick is not None:
            prompt_id, turns, digest = quick
            asked = None
            if turns == [None]:  # plain role/content turns: the history is the turns before a last assistant one
                messages = obj["messages"]
                regenerates = messages[-1]["role"] == "assistant"
                asked = conversation_digest(messages[:-1]) if regenerates else digest
            out.append(CheckedRow(n, prompt_id, turns, asked=asked))
        else:
            try:
                row = checked_row(n, obj, text)
                digest = conversation_digest([row.tools, *row.messages] if row.tools else row.messages)
                turns = generation_turns(row.messages)
                asked = asked_digest(generation_points(row)[0].history) if turns == [None] else None
            except PromptError as exc:
                out.append(CheckedRow(n, "", [], bad=bad_message(str(exc), n, label)))
                continue
            prompt_id = row.prompt_id
            out.append(CheckedRow(n, prompt_id, turns, row, agent=is_agent_trace(row), asked=asked))
        keys.append(hash(prompt_id))
        digests.append(digest)
        lines.append(n)
    repeats = seen.settle(keys, digests, lines)
    if repeats:
        good = [checked for checked in out if checked.bad is None]
        for i, (first_line, same) in repeats.items():
            checked = good[i]
            if same:
                checked.first = False
            else:
                checked.bad = bad_message(
                    f"line {checked.line}: id {checked.prompt_id!r} conflicts with {label} {first_line}: "
                    f"same id, different conversation (give one of them another id)",
                    checked.line,
                    label,
                )
                checked.prompt_id, checked.turns, checked.row = "", [], None
    if on_bad_row == "stop":
        for checked in out:
            if checked.bad is not None:
                raise InputError(f"{located(path, checked.bad)} (use --on-bad-row skip to skip bad rows)")
    return out


def bad_message(message: str, n: int, label: str) -> str:
    if not message.startswith(("line ", "row ")):
        return f"{label} {n}: {message}"
    if label == "row":
        return message.replace("line ", "row ", 1)
    return message


def asked_digest(messages: list[Any]) -> int:
    """`conversation_digest` of each message's role and content only: what a row's edit changes (its text, a system
    turn added), and the same for the file's row and a sample's stored messages whatever else either holds (a key an
    older tokview stored or dropped, reasoning, a name) so that a row no one changed is never taken for changed. A
    plain role/content row's own digest is this one (`_fast_scan`'s: its turns hold those two keys only)."""
    return conversation_digest(
        [{"content": m.get("content"), "role": m.get("role")} if isinstance(m, dict) else m for m in messages]
    )


def conversation_digest(messages: list[Any]) -> int:
    """A 64-bit digest of a conversation, to tell a duplicate row from a conflicting one within one read.

    PromptError for a row nested deeper than orjson writes (255 levels: a tool schema so deep is no real one, and
    every store and export of the row would fail on it later); `json` digests what orjson refuses otherwise
    (integers past 64 bits)."""
    try:
        return hash(orjson.dumps(messages, option=orjson.OPT_SORT_KEYS, default=str))
    except TypeError as exc:
        if "recursion" in str(exc).lower():
            raise PromptError("nested too deeply (more than 255 levels)") from None
        return hash(json.dumps(messages, sort_keys=True, default=str))


_ROLES = frozenset(("system", "user", "assistant"))
"""Roles the fast path takes: a tool result needs `parse_row`'s trace checks (the call it answers)."""


def is_agent_trace(row: PromptRow) -> bool:
    return bool(row.tools) or any(m["role"] == "tool" or "tool_calls" in m for m in row.messages)


def agent_mode_refusal(checked: CheckedRow, mode: str, label: str = "line") -> str | None:
    """Why an agent trace cannot run in `mode` (None: it can). The raw path renders the prompt itself with no
    tools and has no tool parser to read the served calls back, so a chain could not go on; dual runs it too.
    `label`: "row" for a Parquet file, as every other message of one says."""
    if not checked.agent or mode == "chat":
        return None
    return bad_message(
        f"line {checked.line}: the row {AGENT_ROW} "
        f"sends as the file means it (--mode {mode} renders no tools and reads no calls)",
        checked.line,
        label,
    )


def _fast_scan(obj: object) -> tuple[str, list[int | None], int] | None:
    """(prompt id, generation turns, conversation digest) of a `fast_row` row without building it, else None.

    Its turns are exactly the parsed messages (role and content only), so their digest is the same."""
    checked = _fast_check(obj)
    if checked is None or not isinstance(obj, dict):  # `_fast_check` took only a dict: said for the types
        return None
    return (*checked, hash(orjson.dumps(obj["messages"], option=orjson.OPT_SORT_KEYS)))


def _fast_check(obj: object) -> tuple[str, list[int | None]] | None:
    """(prompt id, generation turns) of a `fast_row` row, else None: one walk, nothing serialised."""
    if type(obj) is not dict:
        return None
    turns = obj.get("messages")
    rid = obj.get("id")
    if type(turns) is not list or type(rid) is not str or not (rid.isascii() and rid.isprintable() and rid.strip()):
        return None
    if obj.get("tools") not in (None, [], ""):  # `row_tools` reads it (`{}` and `0` are refused there, not "none")
        return None
    if any(key in obj for key in UNREAD_CONTENT_KEYS):  # `check_row` decides (`_check_unread`)
        return None
    if obj.get("system") not in (None, ""):  # the first turn (`prompts._row_system`): this walk sent rows without it
        return None
    has_user = False
    assistants = 0
    for turn in turns:
        if type(turn) is not dict or len(turn) != 2:
            return None
        role = turn.get("role")
        if type(turn.get("content")) is not str or type(role) is not str or role not in _ROLES:
            return None
        if role == "user":
            if not turn["content"].strip():  # refused by `check_row`, with its line
                return None
            has_user = True
        elif role == "assistant" and has_user:  # one before any user turn is history (`generation_points`)
            assistants += 1
    if not has_user:
        return None
    if assistants:
        points = _turns(assistants, turns[-1]["role"] == "assistant")
    else:
        points = [None]
    return rid, points


def fast_row(obj: object, n: int) -> PromptRow | None:
    """The common row (a printable ASCII string id, `messages` of plain role/content string turns) checked
    and parsed in one walk; None for any other row, which takes `parse_checked` (the same answer, slower).

    Only for rows parsed by orjson, which refuses lone surrogates: the one check it leaves out.
    """
    if _fast_check(obj) is None or not isinstance(obj, dict):  # `_fast_check` took only a dict
        return None
    return PromptRow(obj["id"], [{"role": t["role"], "content": t["content"]} for t in obj["messages"]], n)


def generation_turns(messages: list[dict[str, Any]]) -> list[int | None]:
    """The `turn` of each of `generation_points`' points, without building their histories."""
    return _turns(len(generated_turns(messages)), messages[-1]["role"] == "assistant")


def _turns(assistants: int, ends_with_assistant: bool) -> list[int | None]:
    multi = assistants > 1 or (assistants > 0 and not ends_with_assistant)
    turns: list[int | None] = [k if multi else None for k in range(assistants)]
    if not ends_with_assistant:
        turns.append(assistants if assistants else None)
    return turns


def iter_rows_flagged(path: Path) -> Iterator[tuple[int, Any, str | None]]:
    """`iter_rows`, each row with the JSON text orjson parsed it from (None: not parsed by orjson)."""
    if is_parquet(path):
        for n, obj in iter_parquet(path):
            yield n, obj, None
        return
    yield from iter_jsonl_fast(path)


def open_lines(path: Path) -> TextIO:
    """A JSONL file as every batch reader reads it: text, lines split as Python splits them (`\\n`, `\\r\\n` and a lone
    `\\r`, as `core.prompts.iter_jsonl` and the audit do), a byte-order mark dropped, and bytes that are not UTF-8
    kept as escapes (`surrogateescape`) so each such line is refused alone (`not_utf8`): decoded strictly, a bad
    byte stopped the whole file, named as the first line of the block it was read in."""
    return path.open("r", encoding="utf-8-sig", errors="surrogateescape")


def line_bytes(text: str) -> bytes:
    """A line's bytes as read (escaped bytes back as they were): what the planner's line check hashes."""
    return text.encode("utf-8", "surrogateescape")


def iter_jsonl_fast(path: Path) -> Iterator[tuple[int, Any, str | None]]:
    """`core.prompts.iter_jsonl` parsed by orjson (~3× faster): (line, object or PromptError, text orjson read).

    A line orjson refuses (invalid JSON, a lone surrogate escape, NaN) takes the standard library's path,
    so what is refused and every error message stay the same; `checked_row` re-reads the one kind of line
    orjson reads otherwise (a whole number past 64 bits becomes a float)."""
    with open_lines(path) as fh:
        for n, text in enumerate(fh, start=1):
            at = not_utf8(text)
            if at is not None:
                if n == 1:  # a binary file, most likely: the whole file is refused
                    raise InputError(f"{path}:1: not UTF-8 text (JSONL expected; Parquet files need a .parquet name)")
                yield n, PromptError(f"line {n}: not UTF-8 text ({at})"), None
                continue
            try:
                yield n, orjson.loads(text), text
                continue
            except orjson.JSONDecodeError:
                pass
            if not text.strip():
                continue
            try:  # without its newline: a line cut short is "expecting value at column 27", not line 2's column 1
                yield n, json.loads(text.rstrip("\r\n")), None
            except json.JSONDecodeError as exc:
                yield n, PromptError(f"line {n}: not valid JSON: {json_error(exc)}"), None
            except RecursionError:
                yield n, PromptError(f"line {n}: not valid JSON: nested too deeply"), None
            except ValueError:  # a whole number of more digits than Python converts (4,300)
                yield n, PromptError(f"line {n}: not valid JSON: {TOO_MANY_DIGITS}"), None


_LONG_NUMBER = re.compile(r"\d{19}")
TOO_MANY_DIGITS = f"a number has more digits than Python reads ({sys.get_int_max_str_digits():,})"


def checked_row(n: int, obj: object, text: str | None) -> PromptRow:
    """The prompt row of an `iter_rows_flagged` entry: `fast_row` when it applies, else `parse_checked`.

    Raises PromptError. A row orjson read (`text`) holds no lone surrogate, the one check `fast_row`
    leaves out; one with a run of 19+ digits is parsed again by the standard library first, which
    keeps whole numbers whole (an id, or the content hash of a row without one)."""
    if text is None:
        return parse_checked(obj, n)
    row = fast_row(obj, n)
    if row is not None:
        return row
    if _LONG_NUMBER.search(text) is not None:
        try:
            obj = json.loads(text)
        except ValueError:  # more digits than Python converts: orjson read it as a float
            raise PromptError(f"line {n}: not valid JSON: {TOO_MANY_DIGITS}") from None
    return parse_checked(obj, n)


ROW_SETTINGS = (
    "max_tokens",
    "max_new_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "stop_token_ids",
    "chat_template_kwargs",
    "sampling_params",
    "reasoning_effort",
    "enable_thinking",
    "thinking",
    "tool_choice",
    "parallel_tool_calls",
)
"""Generation settings a row may carry (a request body saved as a prompt): `batch` reads none of them (a saved agent
request's `tool_choice: "none"` was regenerated as `auto`, its forced or suppressed tool turns ordinary ones)."""


def row_settings_note(path: str | Path) -> str | None:
    """A note when the first row of a JSONL prompts file carries generation settings: every row is generated with
    the command line's (a row asking for thinking off was generated with thinking on, saying nothing). The first row
    only, never a Parquet file: the note must cost the start-up nothing; a file it cannot read is the run's to say."""
    path = Path(path)
    try:
        if is_parquet(path) or not stat.S_ISREG(path.stat().st_mode):  # a pipe's first line is the run's to read
            return None
        with open_lines(path) as lines:
            first = next((line for line in lines if line.strip()), "")
        row = json.loads(first)
    except (OSError, ValueError, RecursionError):
        return None
    found = [key for key in ROW_SETTINGS if isinstance(row, dict) and key in row]
    if not found:
        return None
    return (
        f"tokview: note: the prompts' rows carry generation settings ({', '.join(found)}), which batch does not read: "
        "every row is generated with the command line's settings (--max-new-tokens, --temperature, "
        "--chat-template-kwargs, …)"
    )


BAD_ROWS_SHOWN = 20


def bad_rows_said(bad_rows: list[str], shown: int = 3, chat_mode: str = "--mode chat") -> str:
    """The first skipped rows and why, in a few lines, with what to do when they are agent traces (`chat_mode`: how
    the caller names that mode; the app's form says "mode parsed chat")."""
    lines = [printable_line(message) for message in bad_rows[:shown]]
    if len(bad_rows) > shown:
        lines.append(f"… and {len(bad_rows) - shown} more")
    agents = sum(AGENT_ROW in message for message in bad_rows)
    if agents:
        lines.append(f"{agents} row(s) are agent traces: they run with {chat_mode}")
    return "\n".join(lines)


def say_bad_rows(path: str | Path, bad_rows: list[str]) -> None:
    """The first BAD_ROWS_SHOWN skipped rows on stderr as `FILE:LINE: why` (`batch` and `audit` say them alike), each
    on its one line: a row's own text may hold newlines and terminal escapes."""
    for message in bad_rows[:BAD_ROWS_SHOWN]:
        print(f"tokview: bad row skipped: {printable_line(located(path, message))}", file=sys.stderr)
    if len(bad_rows) > BAD_ROWS_SHOWN:
        print(f"tokview: … and {len(bad_rows) - BAD_ROWS_SHOWN} more bad rows", file=sys.stderr)
    agents = sum(AGENT_ROW in message for message in bad_rows)
    if agents > 1:  # one cause behind many lines: said once, with what to do
        print(f"tokview: note: {agents} rows are agent traces: run with --mode chat to generate them", file=sys.stderr)


AGENT_ROW = "is an agent trace (tools, tool calls or results), which only --mode chat"
"""What `agent_mode_refusal` says of each such row (counted by `say_bad_rows`)."""


def located(path: str | Path, message: str) -> str:
    """`line 3: …` as `FILE:3: …`, the form editors and terminals jump to."""
    head, sep, rest = message.partition(": ")
    word, _, number = head.partition(" ")
    if sep and word in ("line", "row") and number.isdecimal():
        return f"{path}:{number}: {rest}" if word == "line" else f"{path} row {number}: {rest}"
    return f"{path}: {message}"
