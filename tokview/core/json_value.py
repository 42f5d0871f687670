"""`JsonValue`: a value exactly as `json.loads` gives it back.

Why a name of its own: request and response bodies, stored JSON columns, recorded profile fields and chat-template
kwargs are arbitrary JSON, and typing them `Any` lets mypy wave through whatever a caller does with them. Typed as
`JsonValue`, a reader must narrow (`isinstance(value, dict)`) before it reaches inside, as the code already does.
"""

from __future__ import annotations

import json
import math
from typing import Any, TypeAlias, TypeGuard

import orjson

JsonValue: TypeAlias = "str | int | float | bool | list[JsonValue] | dict[str, JsonValue] | None"
"""Any JSON value: a scalar, an array of values, or an object with string keys."""

JsonObject: TypeAlias = "dict[str, JsonValue]"
"""A JSON object (a request body, a recorded profile, a stored metadata column)."""


_DIGITS_COMMAS_BRACKETS = b"0123456789,[]"


def is_int_list(value: list[object], *, negative: bool = True) -> TypeGuard[list[int]]:
    """Whether every element is an int, not a float or bool equal to one (`negative=False`: and none below 0), in one
    C pass: the list's JSON then holds only digits, commas and brackets, and minus signs where allowed (~6 µs for 2,000
    ids; `set(map(type, …))` took ~22). False for a list JSON cannot hold (an int past 64 bits)."""
    try:
        raw = orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):
        return False
    return not raw.translate(None, _DIGITS_COMMAS_BRACKETS + (b"-" if negative else b""))


def strict_json(value: object, **dump: Any) -> str:
    """`json.dumps(value, **dump)` with every float that is not finite written as null (`strict_json_line`): what
    `show --json` and `stats --json` print, read by `jq` and other strict readers."""
    try:
        return json.dumps(value, allow_nan=False, **dump)
    except ValueError:
        return json.dumps(_finite(value), allow_nan=False, **dump)


def strict_json_line(record: dict[str, object]) -> bytes:
    """`record` as one line of strict JSON (UTF-8, newline-ended). A float that is not finite (a NaN or -inf logprob a
    server sent, kept as served) is written as null: Python's `NaN`/`-Infinity` tokens are no JSON, and a strict
    reader (`jq`, serde, a JS trainer) refuses the whole file over one of them. Records without one, nearly all, pay
    only the check."""
    return (strict_json(record, ensure_ascii=False) + "\n").encode("utf-8")


def _finite(value: object) -> object:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


TRUE_WORDS = frozenset({"1", "true", "t", "yes", "y", "on"})
FALSE_WORDS = frozenset({"0", "false", "f", "no", "n", "off"})
"""The strings pydantic (both servers' request models) reads as a bool."""


def as_pydantic_bool(value: object) -> bool | None:
    """What a server makes of a boolean request field (pydantic's bool): True, False (absent and null too), or None
    when it refuses the value (the proxy then leaves the field to the server, which answers the client's own error)."""
    if value is None or isinstance(value, bool):
        return bool(value)
    if type(value) in (int, float) and value in (0, 1):  # 1.0 too; 2, 0.5 refused
        return value == 1
    if isinstance(value, str) and value.lower() in TRUE_WORDS | FALSE_WORDS:  # " true" refused: never stripped
        return value.lower() in TRUE_WORDS
    return None
