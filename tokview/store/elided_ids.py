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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

BODY_COLUMNS = ("raw_request", "raw_response", "parsed_raw_response")
ID_COLUMNS = ("output_ids", "prompt_ids", "parsed_output_ids")
MIN_IDS = 8
"""Shorter lists stay in the body: they save nothing worth a lookup, and a small body reads as served."""
MAX_DEPTH = 4
"""How deep to look: the ids sit at depth 2–3 in every server's body (`body.prompt`, `choices[0].token_ids`)."""
MAX_FANOUT = 8
"""Lists of objects longer than this (one entry per token: logprobs) are not searched."""

Path = list[Any]


def elide(body: Any, id_lists: Mapping[str, Sequence[int] | None]) -> tuple[Any, list[list[Any]]]:
    """`body` with each list equal to one of `id_lists` replaced by None, and where each was:
    `[[path, column], ...]`. The body itself is never changed: containers on a changed path are copied."""
    candidates = [(name, ids) for name, ids in id_lists.items() if ids is not None and len(ids) >= MIN_IDS]
    found: list[list[Any]] = []
    if not candidates:
        return body, found
    return _elide(body, candidates, [], found, 0), found


def _elide(value: Any, candidates: list[tuple[str, Sequence[int]]], path: Path, found: list, depth: int) -> Any:
    kind = type(value)
    if kind is list:
        name = _same_ids(value, candidates)
        if name is not None:
            found.append([list(path), name])
            return None
        if depth >= MAX_DEPTH or len(value) > MAX_FANOUT:
            return value
        items: Any = enumerate(value)
    elif kind is dict:
        if depth >= MAX_DEPTH:
            return value
        items = value.items()
    else:
        return value
    copy: Any = None
    for key, item in items:
        if type(item) is not list and type(item) is not dict:
            continue
        if kind is dict and type(key) is not str:  # JSON writes it as a string: the path would not find it
            continue
        path.append(key)
        new = _elide(item, candidates, path, found, depth + 1)
        path.pop()
        if new is not item:
            if copy is None:
                copy = dict(value) if kind is dict else list(value)
            copy[key] = new
    return value if copy is None else copy


def _same_ids(value: list, candidates: list[tuple[str, Sequence[int]]]) -> str | None:
    for name, ids in candidates:
        if len(value) != len(ids):
            continue
        # == alone takes 1.0 and True for 1; the column (INTEGER[]) would give them back as ints, so
        # the list must hold ints, even when it is the capture's own (a hand-made capture may hold floats)
        if (value is ids or value == ids) and _all_ints(value):
            return name
    return None


_INT_LIST_BYTES = b"0123456789-,[]"


def _all_ints(value: list) -> bool:
    """Whether every element is an int, not a float or bool equal to one: the list's JSON then holds only
    digits, minus signs, commas and brackets (~6 µs for 2,000 ids; `set(map(type, …))` took ~22)."""
    try:
        return not orjson.dumps(value).translate(None, _INT_LIST_BYTES)
    except (TypeError, orjson.JSONEncodeError):  # not JSON, or an int past 64 bits: not a stored id list
        return False


def restore(body: Any, places: Sequence[Sequence[Any]], id_lists: Mapping[str, Sequence[int] | None]) -> Any:
    """Put the lists `elide` took out back into `body` (freshly parsed: changed in place) and return it.

    A place that no longer holds the null `elide` left (the store masked it: a list under a key named
    like `authorization` is stored as "[redacted]") keeps what the store wrote."""
    for path, name in places:
        ids = id_lists.get(name)
        if ids is None:  # a row whose column was cleared: the body keeps its null
            continue
        if not path:
            body = list(ids) if body is None else body
            continue
        try:
            node = body
            for key in path[:-1]:
                node = node[key]
            if node[path[-1]] is None:
                node[path[-1]] = list(ids)
        except (KeyError, IndexError, TypeError):
            continue
    return body
