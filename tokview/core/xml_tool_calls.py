"""Qwen3-Coder's and Qwen3.5's XML tool calls (the `qwen3_coder` layout): the body between `<tool_call>` and
`</tool_call>` read as vLLM's and SGLang's `qwen3_coder` parsers read it.

The body is plain text: `<function=NAME>`, then per argument `<parameter=KEY>` + newline + value + newline +
`</parameter>`, then `</function>`. Both parsers take the name up to the first `>`, end a value at the first
`</parameter>`, next `<parameter=` or `</function>`, drop one newline at each end of it, and convert it by the type
the request's `tools` give that parameter (a string kept as written, an integer `int`, an object `json.loads`, ...;
a parameter the schema does not name stays text); the arguments are `json.dumps` of the result.

The two servers convert differently at the edges (SGLang reads `null` as null for every type, vLLM keeps it as text
for a string; `1.0` is 1 in one and 1.0 in the other; SGLang's stream builds the JSON in fragments): so the server's
`tool_calls` are compared with the ids by value (`arguments_agree`), not by text. And what a history renders back
is the value as written (`CallOnIds.parameters`): the templates write a string argument as it is and `| string` any
other scalar, so `true` read as True would render back as `True`, ids the model never wrote.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

FUNCTION_OPEN, FUNCTION_CLOSE = "<function=", "</function>"
PARAMETER_OPEN, PARAMETER_CLOSE = "<parameter=", "</parameter>"
STRING_TYPES = ("string", "str", "text", "varchar", "char", "enum")
INTEGER_PREFIXES = ("int", "uint", "long", "short", "unsigned")
CONTAINER_TYPES = ("object", "array", "arr")


@dataclass(frozen=True)
class XmlCall:
    """One `<tool_call>` body as the parsers read it."""

    name: str | None
    """None when the body holds no `<function=NAME>` (no parser returns a call for it)."""
    parameters: tuple[tuple[str, str], ...]
    """Each argument's key and value as written (one newline dropped at each end), in order."""
    arguments: str | None
    """`json.dumps` of the values converted by the request's `tools` (vLLM's non-streamed `arguments`)."""
    error: str | None


def xml_call(body: str, tools: object = None) -> XmlCall:
    """The first function of a call's body (a second in the same `<tool_call>` becomes a call of its own in the
    parsers' answer, which the call count then says)."""
    start = body.find(FUNCTION_OPEN)
    if start < 0:
        return XmlCall(None, (), None, "the call holds no <function=NAME>: neither server's parser returns it")
    rest = body[start + len(FUNCTION_OPEN) :]
    name_end = rest.find(">")
    if name_end < 0:
        return XmlCall(None, (), None, "the function's name is never closed with '>': no parser returns the call")
    name, inside = rest[:name_end], rest[name_end + 1 :]
    close = inside.find(FUNCTION_CLOSE)
    parameters = _parameters(inside if close < 0 else inside[:close])
    schema = tool_properties(tools, name)
    values = {key: convert_value(value, schema.get(key)) for key, value in parameters}
    return XmlCall(name, parameters, json.dumps(values, ensure_ascii=False), None)


def _parameters(text: str) -> tuple[tuple[str, str], ...]:
    found: list[tuple[str, str]] = []
    at = text.find(PARAMETER_OPEN)
    while at >= 0:
        name_end = text.find(">", at + len(PARAMETER_OPEN))
        if name_end < 0:
            break
        key, value_at = text[at + len(PARAMETER_OPEN) : name_end], name_end + 1
        ends = [e for e in (text.find(PARAMETER_CLOSE, value_at), text.find(PARAMETER_OPEN, value_at)) if e >= 0]
        end = min(ends, default=len(text))
        value = text[value_at:end]
        value = value[1:] if value.startswith("\n") else value
        found.append((key, value[:-1] if value.endswith("\n") else value))
        at = text.find(PARAMETER_OPEN, end)
    return tuple(found)


def tool_properties(tools: object, name: str) -> dict[str, Any]:
    """The `properties` of the request's first declared tool of this name ({} when none declares it): the schema
    the servers' parsers type a call's values by."""
    for tool in tools if isinstance(tools, list) else ():
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or function.get("name") != name:
            continue
        parameters = function.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, dict) else None
        return properties if isinstance(properties, dict) else {}
    return {}


def convert_value(value: str, schema: object) -> Any:
    """vLLM's `_convert_param_value`: by the parameter's schema's type (`anyOf`: its first type that is not null);
    a parameter the tools do not name (`schema` None) stays text."""
    if not isinstance(schema, dict):
        return value
    kind, nullable = _schema_type(schema)
    if nullable and value.lower() in ("null", "none"):
        return None
    if kind in STRING_TYPES:
        return value
    if value.lower() in ("null", "none"):
        return None
    if kind.startswith(INTEGER_PREFIXES):
        try:
            return int(value)
        except ValueError:
            return value
    if kind.startswith(("num", "float")):
        try:
            number = float(value)
            return int(number) if number.is_integer() else number
        except (ValueError, OverflowError):
            return value
    if kind in ("boolean", "bool", "binary"):
        return value.lower() == "true"
    container = kind in CONTAINER_TYPES or kind.startswith(("dict", "list"))
    if container:
        try:
            return json.loads(value)
        except ValueError:
            pass
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return value


def _schema_type(schema: dict[str, Any]) -> tuple[str, bool]:
    if "type" in schema:
        kind = str(schema["type"]).strip().lower()
        return kind, kind == "null"
    if isinstance(schema.get("anyOf"), list):
        kinds = [str(o["type"]).strip().lower() for o in schema["anyOf"] if isinstance(o, dict) and "type" in o]
        others = [k for k in kinds if k != "null"]
        return (others[0] if others else "string"), "null" in kinds
    return "string", False


def history_arguments(parameters: Sequence[tuple[str, str]], tools: object, name: str) -> str:
    """The arguments a history should send back so the template renders the values as written: each converted by
    the request's `tools` where it renders back the same under both Qwen templates' rules (Qwen3-Coder's `| string`
    for a scalar, Qwen3.5's `tojson`; both `tojson` for a mapping), else the text itself (`true` stays `"true"`:
    True renders `True` in one; `2.50` stays text: 2.5 renders `2.5`)."""
    schema = tool_properties(tools, name)
    values: dict[str, Any] = {}
    for key, text in parameters:
        value = convert_value(text, schema.get(key))
        values[key] = value if _renders_as(value, text) else text
    return json.dumps(values, ensure_ascii=False)


def _renders_as(value: object, text: str) -> bool:
    if isinstance(value, str):
        return value == text
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False) == text
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value) == text == json.dumps(value)
    return False


def arguments_agree(parameters: Sequence[tuple[str, str]], server_arguments: str | None) -> bool:
    """Whether the server's arguments hold the same keys as the ids and, key for key, a value that reads the text
    as written: the text itself (a string), or what `null`, `true` / `false`, a number, JSON or a Python literal
    spell (any server's conversion)."""
    if server_arguments is None:
        return False
    try:
        theirs = json.loads(server_arguments)
    except ValueError:
        return False
    mine = dict(parameters)
    if not isinstance(theirs, dict) or set(theirs) != set(mine):
        return False
    return all(_value_agrees(mine[key], value) for key, value in theirs.items())


def _value_agrees(text: str, value: object) -> bool:
    if isinstance(value, str):
        return value == text
    bare = text.strip()
    if value is None:
        return bare.lower() in ("null", "none")
    if isinstance(value, bool):
        return bare.lower() == str(value).lower()
    if isinstance(value, (int, float)):
        try:
            return float(bare) == value
        except ValueError:
            return False
    for read in (json.loads, ast.literal_eval):
        try:
            if read(bare) == value:
                return True
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return False
