"""Raw request and response bodies are stored without the id lists their row already holds.

A 2,000-token vLLM answer carries its ids twice: in `choices[0].token_ids` of the raw body (kept
for audit) and in the `output_ids` column read from it; the request body repeats `prompt_ids`.
That copy was 40% of a sample's part line (the store file is 30% smaller without it) and the
costliest column to land: DuckDB re-compresses a part-filled row group at every checkpoint, and the
long JSON strings of the bodies cost it twice what the id lists do (measured: a 2,400-sample
`--workers 2` run's last landing, 0.45 → 0.26 s).

So a body is stored with `null` where such a list was, and the row's `raw_ids_at` (JSON) says
which column's list goes back where: `{"raw_response": [[["choices", 0, "token_ids"], "output_ids"]]}`.
`sample_rows.capture_from_row` puts them back, so every reader of a capture sees the body as served.
Only a list equal to the column element for element *and type for type* is taken out (a list of
floats or bools that compares equal to the ids stays), so putting it back is exact; a row without
`raw_ids_at` (written before schema version 6) holds its bodies whole.

The request body's `messages` go the same way when the row's `messages` column holds them as sent
(`elide_messages`): a chat request's whole conversation was stored twice, and an agent's conversation
grows every turn (150,000 characters of context: 300 kB a row where 150 kB say it all). Its place names
the column `messages`; `restore` is given the column's list, parsed afresh.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeAlias

import orjson

from tokview.core.json_value import JsonValue, is_int_list

BODY_COLUMNS = ("raw_request", "raw_response", "parsed_raw_response")
ID_COLUMNS = ("output_ids", "prompt_ids", "parsed_output_ids")
MIN_IDS = 8
"""Shorter lists stay in the body: they save nothing worth a lookup, and a small body reads as served."""
MAX_DEPTH = 4
"""How deep to look: the ids sit at depth 2–3 in every server's body (`body.prompt`, `choices[0].token_ids`)."""
MAX_FANOUT = 8
"""Lists of objects longer than this (one entry per token: logprobs) are not searched."""

Path: TypeAlias = list[str | int]
"""Keys and indexes from a body's top down to one of its lists."""
Place: TypeAlias = list[object]
"""`[path, column]`: where `elide` took a list out and which id column holds it (JSON: a two-element array)."""


def elide(body: object, id_lists: Mapping[str, Sequence[int] | None]) -> tuple[Any, list[Place]]:
    """`body` with each list equal to one of `id_lists` replaced by None, and where each was:
    `[[path, column], ...]`. The body itself is never changed: containers on a changed path are copied.

    The body comes back in its own shape (typed Any: only some lists inside it are now None)."""
    candidates = [(name, ids) for name, ids in id_lists.items() if ids is not None and len(ids) >= MIN_IDS]
    found: list[Place] = []
    if not candidates:
        return body, found
    return _elide(body, candidates, [], found, 0), found


def _elide(
    value: object, candidates: list[tuple[str, Sequence[int]]], path: Path, found: list[Place], depth: int
) -> object:
    if type(value) is list:
        name = _same_ids(value, candidates)
        if name is not None:
            found.append([list(path), name])
            return None
        if depth >= MAX_DEPTH or len(value) > MAX_FANOUT:
            return value
        items: Iterable[tuple[object, object]] = enumerate(value)
    elif type(value) is dict:
        if depth >= MAX_DEPTH:
            return value
        items = value.items()
    else:
        return value
    copy: dict[str, object] | list[object] | None = None
    for key, item in items:
        if type(item) is not list and type(item) is not dict:
            continue
        if not (type(key) is str or (type(value) is list and type(key) is int)):
            continue  # a dict's other keys: JSON writes them as strings, so the path would not find them
        path.append(key)
        new = _elide(item, candidates, path, found, depth + 1)
        path.pop()
        if new is not item:
            if copy is None:
                copy = dict(value) if isinstance(value, dict) else list(value)
            if isinstance(copy, dict):
                copy[str(key)] = new  # a str already: a dict's other keys were skipped above
            else:
                copy[int(key)] = new  # a list's index
    return value if copy is None else copy


def _same_ids(value: list[object], candidates: list[tuple[str, Sequence[int]]]) -> str | None:
    for name, ids in candidates:
        if len(value) != len(ids):
            continue
        # == alone takes 1.0 and True for 1; the column (INTEGER[]) would give them back as ints, so
        # the list must hold ints, even when it is the capture's own (a hand-made capture may hold floats)
        if (value is ids or value == ids) and is_int_list(value):
            return name
    return None


MESSAGES_PATHS: tuple[tuple[str, ...], ...] = (("body", "messages"), ("parsed", "body", "messages"))
"""Where a stored request holds the messages it sent: a chat capture's body, a dual capture's parsed request."""


def elide_messages(request: object, messages: object) -> tuple[Any, list[Place]]:
    """`request` with its messages replaced by None where they equal `messages` (the row's column), and where;
    the request itself is never changed (the dicts on the path are copied)."""
    if not isinstance(messages, list) or not messages or not isinstance(request, dict):
        return request, []
    found: list[Place] = []
    for path in MESSAGES_PATHS:
        node: Any = request
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        sent = node.get(path[-1]) if isinstance(node, dict) else None
        if type(sent) is list and (sent is messages or _same_json(sent, messages)):
            request = _without(request, path)
            found.append([list(path), "messages"])
    return request, found


def _same_json(a: object, b: object) -> bool:
    """Equal as JSON writes them, type for type (`1.0 == 1` and `True == 1` in Python): what is put back is exact.
    Values orjson cannot write (a lone surrogate, a non-string key) are left in the body."""
    try:
        return bool(a == b) and orjson.dumps(a) == orjson.dumps(b)
    except (TypeError, orjson.JSONEncodeError):
        return False


def _without(body: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    copy = dict(body)
    copy[path[0]] = None if len(path) == 1 else _without(body[path[0]], path[1:])
    return copy


def restore(
    body: JsonValue, places: Iterable[Sequence[JsonValue]], id_lists: Mapping[str, Sequence[Any] | None]
) -> JsonValue:
    """Put the lists `elide` (and `elide_messages`) took out back into `body` (freshly parsed: changed in place)
    and return it. `id_lists`: the row's columns by name, `messages` among them parsed afresh (it is put in whole).

    A place that no longer holds the null `elide` left (the store masked it: a list under a key named
    like `authorization` is stored as "[redacted]") keeps what the store wrote."""
    for path, name in places:
        ids = id_lists.get(name) if isinstance(name, str) else None
        if ids is None or not isinstance(path, list):  # a row whose column was cleared: the body keeps its null
            continue
        if not path:
            body = list(ids) if body is None else body
            continue
        try:
            node = body
            for key in path[:-1]:
                node = _child(node, key)
            _fill(node, path[-1], ids)
        except (KeyError, IndexError, TypeError):
            continue
    return body


def _child(node: JsonValue, key: JsonValue) -> JsonValue:
    """`node[key]` along a place's path; TypeError where JSON holds no such step (as indexing would raise)."""
    if isinstance(node, dict) and isinstance(key, str):
        return node[key]
    if isinstance(node, list) and isinstance(key, int):
        return node[key]
    raise TypeError(f"no {key!r} in a JSON {type(node).__name__}")


def _fill(node: JsonValue, key: JsonValue, ids: Sequence[Any]) -> None:
    """`node[key] = list(ids)` when it still holds the null `elide` left."""
    filled: list[JsonValue] = list(ids)
    if isinstance(node, dict) and isinstance(key, str):
        if node[key] is None:
            node[key] = filled
    elif isinstance(node, list) and isinstance(key, int) and node[key] is None:
        node[key] = filled
