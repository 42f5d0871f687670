"""Prompt rows in the shapes users have, turned into the conversations a server is asked to continue.

Accepted row shapes: OpenAI `messages` (role/content), ShareGPT `conversations` (from/value, as in
mlabonne/open-perfectblend) or SpecForge `conversations` (role/content), and a plain `prompt`; any of
them may be an agent trace (row-level `tools`, assistant `tool_calls`, tool results: `agent_traces.py`).
A multi-turn row becomes one generation point per assistant turn. Its history is either the file's
(`--history file`: earlier reasoning dropped, each turn independent) or the served turns before it
(`--history served`: `batch/chains.py` builds it turn by turn from what the server generated).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokview.core import agent_traces as traces
from tokview.core.agent_traces import PromptError as PromptError  # re-exported: callers import it from here
from tokview.core.record import canonical_hash
from tokview.errors import UserError
from tokview.untrusted_text import not_utf8

ROLE_FROM_SHAREGPT = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
    "function_response": "tool",
    "ipython": "tool",
    "function_call": "assistant",
}
"""ShareGPT speakers. `function_call` is an assistant turn whose value is its calls as JSON (LLaMA-Factory);
a `gpt` turn with Hermes `<tool_call>` blocks carries its calls in them."""
REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")


@dataclass(frozen=True)
class PromptRow:
    prompt_id: str
    messages: list[dict[str, Any]]
    line: int | None = None
    tools: list[dict[str, Any]] | None = None
    """The row's `tools`, as sent (None: the row declares none)."""


@dataclass(frozen=True)
class GenerationPoint:
    """One assistant turn to generate: the history the server sees and which turn it is."""

    prompt_id: str
    turn: int | None
    """Index of the assistant turn in a multi-turn row; None for a single generation."""
    history: list[dict[str, Any]]
    at: int = 0
    """Where the turn sits in the row's messages (the assistant turn it regenerates, or len(messages))."""


def prompt_id_for(row: dict[str, Any]) -> str:
    """The row's own `id` if it has one, else `hash_` + sha256 of the canonical row."""
    rid = row.get("id")
    if isinstance(rid, (str, int)) and str(rid).strip():
        return str(rid)
    return "hash_" + canonical_hash(row)


def kind_of(value: object) -> str:
    """A JSON value's kind in words, for a message that says what a field held instead."""
    names = {
        dict: "an object",
        list: "a list",
        bool: "true/false",
        int: "a number",
        float: "a number",
        str: "a string",
        type(None): "null",
    }
    return names.get(type(value), type(value).__name__)


def _messages(raw: object, where: str, number: int) -> list[dict[str, Any]]:
    """The message a turn is; a ShareGPT tool turn of Hermes `<tool_response>` blocks is one result per block."""
    msg = _message(raw, where, number)
    if msg["role"] == "tool" and isinstance(raw, dict) and "value" in raw and isinstance(msg["content"], str):
        results = traces.hermes_results(msg["content"])
        if results is not None:
            return results
    return [msg]


def _message(raw: object, where: str, number: int = 1) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise PromptError(f"{where}: a turn is not an object")
    sharegpt = "from" in raw or "value" in raw
    key = "value" if sharegpt else "content"
    content = raw.get(key)
    given = raw.get("tool_calls") or []
    if not isinstance(given, list):  # an object's keys (a string's characters) would be read as its calls
        raise PromptError(
            f"{where}: message {number}'s `tool_calls` must be a list of calls, not {type(given).__name__}"
        )
    calls: list[Any] = list(given)
    if sharegpt:
        speaker = str(raw.get("from", "")).lower()
        role = ROLE_FROM_SHAREGPT.get(speaker)
        if role is None:
            raise PromptError(f"{where}: unknown ShareGPT speaker {raw.get('from')!r}")
        if speaker == "function_call" and isinstance(content, str):
            calls, content = traces.sharegpt_calls(content, f"{where}: message {number}"), ""
        elif role == "assistant" and isinstance(content, str) and "<tool_call>" in content:
            content, calls = traces.hermes_calls(content, f"{where}: message {number}")
    else:
        role = raw.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):  # developer: OpenAI's system turn
            raise PromptError(f"{where}: unknown role {role!r}")
        if isinstance(content, list):  # OpenAI content parts: keep the text parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if calls and role != "assistant":
        raise PromptError(f"{where}: message {number} is a {role} turn with tool_calls (only assistant turns call)")
    if content is None and calls:
        content = ""  # OpenAI's null content beside tool_calls: nothing to render
    if content is None:  # absent or null: sent as an empty turn, the model would answer something else
        raise PromptError(f'{where}: message {number} has no `{key}` (an empty turn is written "{key}": "")')
    msg: dict[str, Any] = {"role": role, "content": content}
    for rkey in REASONING_KEYS:
        if raw.get(rkey):
            msg["reasoning_content"] = raw[rkey]
            break
    if calls:
        msg["tool_calls"] = [traces.normal_call(c, f"{where}: message {number}", k) for k, c in enumerate(calls, 1)]
    if role == "tool":
        for field in ("tool_call_id", "name"):
            if raw.get(field) is not None:
                msg[field] = str(raw[field])
    return msg


def parse_row(row: object, line: int | None = None) -> PromptRow:
    where = f"line {line}" if line is not None else "row"
    if not isinstance(row, dict):
        raise PromptError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if isinstance(row.get("messages"), list):
        turns = row["messages"]
    elif isinstance(row.get("conversations"), list):
        turns = row["conversations"]
    elif isinstance(row.get("prompt"), str):
        turns = [{"role": "user", "content": row["prompt"]}]
        if isinstance(row.get("system"), str):
            turns.insert(0, {"role": "system", "content": row["system"]})
    else:
        raise PromptError(f"{where}: {_no_turns(row)}")
    tools = traces.row_tools(row.get("tools"), where)
    numbered = [(k, m) for k, t in enumerate(turns, start=1) for m in _messages(t, where, k)]
    numbered[:0] = _row_system(row, [m for _, m in numbered], where)  # beside `prompt`, its first turn already
    messages = [m for _, m in numbered]
    if not any(m["role"] == "user" for m in messages):
        raise PromptError(f"{where}: the conversation has no user turn")
    if tools or any(m["role"] == "tool" or "tool_calls" in m for m in messages):
        traces.check_trace(messages, tools, where, numbers=[k for k, _ in numbered])  # as the file numbers them
    return PromptRow(prompt_id_for(row), messages, line, tools)


def _row_system(row: dict[str, Any], messages: list[dict[str, Any]], where: str) -> list[tuple[int, dict[str, Any]]]:
    """A `system` beside a conversation (LLaMA-Factory's ShareGPT rows, Hermes-style datasets) as its first turn
    (numbered 0: not one of the file's turns). It was read only beside `prompt`: such rows were generated and audited
    without their system prompt. One beside a conversation that opens with another system turn is refused: either
    would be lost."""
    system = row.get("system")
    if system is None or system == "":
        return []
    if not isinstance(system, str):
        raise PromptError(f"{where}: `system` must be a string, not {kind_of(system)}")
    first = messages[0] if messages else None
    if first is not None and first["role"] == "system":
        if first.get("content") == system:
            return []
        raise PromptError(
            f"{where}: `system` and the conversation's own system turn differ, so one would be lost: keep one"
        )
    return [(0, {"role": "system", "content": system})]


def _no_turns(row: dict[str, Any]) -> str:
    """Why a row has no conversation: the field that is there but holds something else, else none is there."""
    for key in ("messages", "conversations"):
        if key in row:
            return f"`{key}` must be a list of turns, not {kind_of(row[key])}"
    if "prompt" in row:
        return f"`prompt` must be a string, not {kind_of(row['prompt'])}"
    return "no `messages`, `conversations` or `prompt` field"


def generated_turns(messages: list[dict[str, Any]]) -> list[int]:
    """The positions of the assistant turns to generate: those after the first user turn. One before it (a greeting
    the conversation opens with) is history: its prompt would hold no request (with no system turn, no message at
    all, which no server takes)."""
    first_user = next((i for i, m in enumerate(messages) if m["role"] == "user"), len(messages))
    return [i for i, m in enumerate(messages) if m["role"] == "assistant" and i > first_user]


def generation_points(row: PromptRow) -> list[GenerationPoint]:
    """One point per generated assistant turn (`generated_turns`; history without earlier reasoning), or one at the
    end."""
    points: list[GenerationPoint] = []
    assistant_turns = generated_turns(row.messages)
    multi = len(assistant_turns) > 1 or (assistant_turns and row.messages[-1]["role"] != "assistant")
    for k, idx in enumerate(assistant_turns):
        points.append(GenerationPoint(row.prompt_id, k if multi else None, _history(row.messages[:idx]), idx))
    if row.messages[-1]["role"] != "assistant":
        turn = len(assistant_turns) if assistant_turns else None
        points.append(GenerationPoint(row.prompt_id, turn, _history(row.messages), len(row.messages)))
    return points


def _history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Earlier turns as the server's template sees them: earlier reasoning dropped."""
    return [{k: v for k, v in m.items() if k != "reasoning_content"} for m in messages]


def iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object or a PromptError) for each non-blank line.

    Read line by line, so a file is never held whole (one gigantic line costs its own size, not the
    file's). `utf-8-sig`: a byte-order mark some editors write is not part of line 1's JSON.
    """
    # Bytes that are not UTF-8 are kept as escapes (`surrogateescape`: only such a byte makes a surrogate in the
    # text), so that line alone is refused: decoded strictly, one bad byte stopped the whole file.
    with path.open("r", encoding="utf-8-sig", errors="surrogateescape") as fh:
        for n, text in enumerate(_lines(fh, path), start=1):
            if not text.strip():
                continue
            at = not_utf8(text)
            if at is not None:
                yield n, PromptError(f"line {n}: not UTF-8 text ({at})")
                continue
            try:  # without its newline: a line cut short is told at its own last column, not line 2's first
                yield n, json.loads(text.rstrip("\r\n"))
            except json.JSONDecodeError as exc:
                yield n, PromptError(f"line {n}: not valid JSON: {json_error(exc)}")
            except RecursionError:
                yield n, PromptError(f"line {n}: not valid JSON: nested too deeply")
            except ValueError:  # a whole number of more digits than Python converts (4,300)
                yield n, PromptError(f"line {n}: not valid JSON: a number has more digits than Python reads")
            del text


def _lines(fh: Any, path: Path) -> Iterator[str]:
    """`fh`'s lines; a line longer than memory holds (a file with no line ends: /dev/zero) is a one-line error naming
    it, not a MemoryError."""
    read = 0
    try:
        for line in fh:
            read += 1
            yield line
    except MemoryError:
        raise UserError(f"{path}: line {read + 1} does not fit in memory (a file without line ends?)") from None


def json_error(exc: json.JSONDecodeError) -> str:
    """Python's message without its dangling "at" ("Invalid control character at"), the column, and
    for a raw control character which one it is and how to write it."""
    message = exc.msg.removesuffix(" at").strip()
    if message.startswith("Invalid control character") and exc.pos < len(exc.doc):
        char = exc.doc[exc.pos]
        escape = json.dumps(char)[1:-1]
        return (
            f"a raw control character U+{ord(char):04X} inside a string at column {exc.colno} "
            f"(JSON needs it escaped as {escape})"
        )
    return f"{message[:1].lower()}{message[1:]} at column {exc.colno}"
