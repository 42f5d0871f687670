"""`JsonValue`: a value exactly as `json.loads` gives it back.

Why a name of its own: request and response bodies, stored JSON columns, recorded profile fields and chat-template
kwargs are arbitrary JSON, and typing them `Any` lets mypy wave through whatever a caller does with them. Typed as
`JsonValue`, a reader must narrow (`isinstance(value, dict)`) before it reaches inside, as the code already does.
"""

from __future__ import annotations

from typing import TypeAlias

JsonValue: TypeAlias = "str | int | float | bool | list[JsonValue] | dict[str, JsonValue] | None"
"""Any JSON value: a scalar, an array of values, or an object with string keys."""

JsonObject: TypeAlias = "dict[str, JsonValue]"
"""A JSON object (a request body, a recorded profile, a stored metadata column)."""
